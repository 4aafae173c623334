#!/usr/bin/env bash
# T44-1, prepared in T43 (every start after T43-1 was refused): carry
# [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh`,
# `mkdir -p .carry/micro` and `nvcc -O3 -gencode
# arch=compute_90a,code=sm_90a -o .carry/micro/order
# bench/runs/T43-order.cu`; command `bash bench/runs/T44-1-prepared.sh`
# (T44_DEADLINE=S bounds variants.py's end, default 330 s into the call).
# (0) S two blocks ahead (FLASHJIT_SOFTMAX_LEAD=2, T43, never run on a
# GPU): float64 and synccheck first (a hang is cut by the timeouts), then
# softcap:30 and plain at d 128, N 8192, H 16 against the default, two
# rounds: the default tiling (Bc 128: ptxas spills 156 / 236 bytes),
# 128 x 64 on 8 warps, 2 and 3 stages (no spill), softcap at Bc 80 (12
# bytes), plain at Bc 112 (none); (1) does 2/8 of the
# exponentials by arithmetic raise one warp's rate on softcap's chain
# (T43-order.cu)? (2) the causal default (turns at the
# unit, T43) against FLASHJIT_PING_PONG=0, two rounds, and run --json's
# ping_pong; (3) variants.py, every variant, against FlexAttention (issue
# 14's table on the H200; none since T35); (4) the backward, captured and
# varlen GPU suites and the ping-pong cases (mode 3 among them); (5) the
# torch GPU suites, time left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-1
L64="--block-m 128 --block-n 64 --warps 8 --stages 2 --overlap-softmax"
export FLASHJIT_SOFTMAX_LEAD=2
for a in "--score-mod softcap:30 --seq-len 1000" "--seq-len 1000" "--seq-len 3000 --batch 2" "--score-mod softcap:30 --causal --seq-len 1000 --seq-len-kv 1537 $L64" \
  "--seq-len 1000 $L64" "--score-mod softcap:2 --gqa 4 --heads 8 --window 300,40 --seq-len 2000 $L64" "--seq-len 100 $L64"; do
  say "lead 2, $a: $(check_json --heads 4 --head-dim 128 $a)"
done
sanitize synccheck "--head-dim 128 --heads 2 --seq-len 700 --score-mod softcap:30 $L64"
unset FLASHJIT_SOFTMAX_LEAD
S="--head-dim 128 --seq-len 8192 --heads 16"
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
for r in 1 2; do
  say "round $r softcap:30 TFLOP/s: default $(tf "$S --score-mod softcap:30" X=1) lead2 $(tf "$S --score-mod softcap:30" FLASHJIT_SOFTMAX_LEAD=2) lead2-bc64 $(tf "$S --score-mod softcap:30 $L64" FLASHJIT_SOFTMAX_LEAD=2) lead2-bc64-s3 $(tf "$S --score-mod softcap:30 ${L64/stages 2/stages 3}" FLASHJIT_SOFTMAX_LEAD=2) lead2-bc80 $(tf "$S --score-mod softcap:30 ${L64/block-n 64/block-n 80}" FLASHJIT_SOFTMAX_LEAD=2) bc64 $(tf "$S --score-mod softcap:30 $L64" X=1) | plain default $(tf "$S" X=1) lead2 $(tf "$S" FLASHJIT_SOFTMAX_LEAD=2) lead2-bc64 $(tf "$S $L64" FLASHJIT_SOFTMAX_LEAD=2) lead2-bc112 $(tf "$S ${L64/block-n 64/block-n 112}" FLASHJIT_SOFTMAX_LEAD=2)"
done
[[ -f $C/micro/order ]] && { chmod +x $C/micro/order; $C/micro/order; }
for r in 1 2; do
  say "round $r causal plain TFLOP/s: default $(tf "$S --causal" X=1) pp0 $(tf "$S --causal" FLASHJIT_PING_PONG=0)"
done
say "causal default json: $(bench_env "$S --causal" X=1 | grep -o '"ping_pong":[0-9]')"
left=$((${T44_DEADLINE:-330} - (SECONDS - CALL_T0)))
if ((left > 70)); then
  timeout $left python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A40 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
_s() { local n=$1 b=$2; shift 2; timeout 150 $C/bin/flashjit-$b-gpu-tests --gtest_brief=1 --gtest_color=no "$@" > $OUT/t-$n.log 2>&1; echo "exit $?" >> $OUT/t-$n.log; }
_s backward backward & _s captured captured & _s varlen varlen & _s pingpong forward --gtest_filter='Modes/ForwardPingPongGpu.*' & wait
for l in backward captured varlen pingpong; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
if (( SECONDS - CALL_T0 < 300 )); then torch_suites test_torch_gpu test_varlen_gpu; fi
say done
