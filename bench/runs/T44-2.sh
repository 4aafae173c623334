#!/usr/bin/env bash
# T44-2: a score tile's tanh by a polynomial on the FMA pipe where each
# warp's arguments lie in [-1, 1] (FLASHJIT_TANH_POLYNOMIAL=1, the
# `tanh-polynomial` option, TileToGPUTanh.cpp; T44, never run on a GPU):
# carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`; command `bash bench/runs/T44-2.sh`.
# (0) float64, forward and backward, with the option on: softcap:30 (every
# warp on the polynomial), softcap:2 (warps on both sides), softcap:0.5
# (mostly the unit's), causal Nq != Nkv, GQA with a window; synccheck;
# (1) three interleaved rounds at d 128, N 8192, H 16: plain, softcap:30
# with and without the option, forward, causal forward and backward;
# (2) the forward, backward and captured GPU suites with the option on
# (their softcap cases take it; the others must not change); (3)
# variants.py's softcap row with the option, time left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-2
P=FLASHJIT_TANH_POLYNOMIAL=1
export $P
for a in "--score-mod softcap:30 --seq-len 1000" "--score-mod softcap:2 --seq-len 1000" "--score-mod softcap:0.5 --seq-len 700" \
  "--score-mod softcap:30 --causal --seq-len 1000 --seq-len-kv 1537" "--score-mod softcap:3 --gqa 4 --heads 8 --window 300,40 --seq-len 2000"; do
  say "poly fwd $a: $(check_json --heads 4 --head-dim 128 $a)"
  say "poly bwd $a: $(check_json --heads 4 --head-dim 128 --backward $a)"
done
say "poly fwd d 64 softcap:2: $(check_json --heads 4 --head-dim 64 --score-mod softcap:2 --seq-len 900)"
say "poly bwd d 256 softcap:2: $(check_json --heads 2 --head-dim 256 --backward --score-mod softcap:2 --seq-len 600)"
sanitize synccheck "--head-dim 128 --heads 2 --seq-len 700 --score-mod softcap:2"
unset FLASHJIT_TANH_POLYNOMIAL
S="--head-dim 128 --seq-len 8192 --heads 16"
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
for r in 1 2 3; do
  say "round $r TFLOP/s fwd: plain $(tf "$S" X=1) softcap $(tf "$S --score-mod softcap:30" X=1) poly $(tf "$S --score-mod softcap:30" $P) | causal: plain $(tf "$S --causal" X=1) softcap $(tf "$S --causal --score-mod softcap:30" X=1) poly $(tf "$S --causal --score-mod softcap:30" $P) | bwd: plain $(tf "$S --backward" X=1) softcap $(tf "$S --backward --score-mod softcap:30" X=1) poly $(tf "$S --backward --score-mod softcap:30" $P)"
done
say "softcap:2 (both sides) fwd: default $(tf "$S --score-mod softcap:2" X=1) poly $(tf "$S --score-mod softcap:2" $P)"
_s() { local n=$1 b=$2; shift 2; env $P "$@" timeout 200 $C/bin/flashjit-$b-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$n.log 2>&1; echo "exit $?" >> $OUT/t-$n.log; }
_s fwd0 forward GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=0 & _s fwd1 forward GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=1 &
_s backward backward & _s captured captured & wait
for l in fwd0 fwd1 backward captured; do
  say "poly $l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
if (( SECONDS - CALL_T0 < 380 )); then
  env $P timeout 150 python3 tests/bench/variants.py --variants plain,softcap --json $OUT/variants-poly.json > $OUT/variants-poly.log 2>&1
  say "variants (poly) exit $?"; grep -A12 '^variants, bf16' $OUT/variants-poly.log | cut -c1-200
fi
say done
