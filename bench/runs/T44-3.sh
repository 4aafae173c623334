#!/usr/bin/env bash
# T44-3 (T44-1 never ran: every start was refused; this one call
# takes what mattered of it and more): carry [".carry"] after
# `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh`; command
# `bash bench/runs/T44-3.sh`, timeout 590.
# (0) A score tile's tanh by a polynomial on the FMA pipe where each warp's
# arguments lie in [-1, 1] (the `tanh-polynomial` option, TileToGPUTanh.cpp;
# on by default on sm_90a in this build, FLASHJIT_TANH_POLYNOMIAL=0 turns
# it off): float64, forward and backward: softcap:30 (every warp on the
# polynomial), softcap:2 (either side), softcap:0.5 (mostly the unit's),
# causal Nq != Nkv, GQA with a window, d 64 and d 256; synccheck;
# (1) S two blocks ahead (FLASHJIT_SOFTMAX_LEAD=2, T43): float64 twice;
# (2) three interleaved rounds at d 128, N 8192, H 16: plain, softcap:30
# with the polynomial (the default here) and without, forward, causal
# forward and backward; one round of lead 2 at Bc 64 and Bc 80;
# (3) variants.py, every variant, against FlexAttention (issue 14's table);
# (4) the forward (2 shards), backward and captured GPU suites (the new
# ForwardTanhPolynomialGpu and TanhPolynomialMatchesFloat64Gradients with
# them); (5) the torch GPU suite, time left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-3
for a in "--score-mod softcap:30 --seq-len 1000" "--score-mod softcap:2 --causal --seq-len 700 --seq-len-kv 900" "--score-mod softcap:0.5 --seq-len 700"; do
  say "poly fwd $a: $(check_json --heads 4 --head-dim 128 $a)"
  say "poly bwd $a: $(check_json --heads 4 --head-dim 128 --backward $a)"
done
say "poly fwd d 64 gqa window softcap:3: $(check_json --heads 8 --gqa 4 --head-dim 64 --score-mod softcap:3 --window 300,40 --seq-len 2000)"
say "poly bwd d 256 softcap:2: $(check_json --heads 2 --head-dim 256 --backward --score-mod softcap:2 --seq-len 600)"
L64="--block-m 128 --block-n 64 --warps 8 --stages 2 --overlap-softmax"
say "lead 2 softcap:30 default tiling: $(FLASHJIT_SOFTMAX_LEAD=2 check_json --heads 4 --head-dim 128 --score-mod softcap:30 --seq-len 1000)"
say "lead 2 causal softcap:2 Bc 64: $(FLASHJIT_SOFTMAX_LEAD=2 check_json --heads 4 --head-dim 128 --score-mod softcap:2 --causal --seq-len 1000 --seq-len-kv 1537 $L64)"
sanitize synccheck "--head-dim 128 --heads 2 --seq-len 700 --score-mod softcap:2"
S="--head-dim 128 --seq-len 8192 --heads 16"
P0=FLASHJIT_TANH_POLYNOMIAL=0
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
for r in 1 2 3; do
  say "round $r TFLOP/s fwd: plain $(tf "$S" X=1) poly $(tf "$S --score-mod softcap:30" X=1) unit $(tf "$S --score-mod softcap:30" $P0) | causal: plain $(tf "$S --causal" X=1) poly $(tf "$S --causal --score-mod softcap:30" X=1) unit $(tf "$S --causal --score-mod softcap:30" $P0) | bwd: plain $(tf "$S --backward" X=1) poly $(tf "$S --backward --score-mod softcap:30" X=1) unit $(tf "$S --backward --score-mod softcap:30" $P0)"
done
say "lead 2 softcap:30 (poly): Bc64 $(tf "$S --score-mod softcap:30 $L64" FLASHJIT_SOFTMAX_LEAD=2) Bc80 $(tf "$S --score-mod softcap:30 ${L64/block-n 64/block-n 80}" FLASHJIT_SOFTMAX_LEAD=2) lead 1 Bc64 $(tf "$S --score-mod softcap:30 $L64" X=1); softcap:2 fwd poly $(tf "$S --score-mod softcap:2" X=1) unit $(tf "$S --score-mod softcap:2" $P0); causal softcap:30 poly exp2-emulation 0 $(tf "$S --causal --score-mod softcap:30" FLASHJIT_EXP2_EMULATION=0) 2 $(tf "$S --causal --score-mod softcap:30" X=1)"
timeout 120 python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
say "variants exit $?"
grep -A16 '^variants, bf16' $OUT/variants.log | cut -c1-200
_s() { local n=$1 b=$2; shift 2; env "$@" timeout 200 $C/bin/flashjit-$b-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$n.log 2>&1; echo "exit $?" >> $OUT/t-$n.log; }
_s fwd0 forward GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=0 & _s fwd1 forward GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=1 &
_s backward backward X=1 & _s captured captured X=1 & wait
for l in fwd0 fwd1 backward captured; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
if (( SECONDS - CALL_T0 < 390 )); then torch_suites test_torch_gpu; fi
say done
