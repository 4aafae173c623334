#!/usr/bin/env bash
# T41-1 (carry [".carry"]; command `bash bench/runs/T41-1-prepared.sh`):
# the new defaults' first run: three stages of the backward's Q/dO copies
# wherever they fit (T40-3: plain -0.6%, causal -2.6%, window -2.5% at
# d 128) and 2/8 of a causal softcap forward's exponentials by arithmetic
# (none for windows); and dq_accum in quad order (FLASHJIT_DQ_QUAD_ORDER=1,
# opt-in, new: one red.global.add.v4.f32 per thread, row and 16 columns
# where pairs took two). float64 checks, memcheck, the backward suite in
# both, the forward / captured / varlen suites; timings in two rounds;
# then variants.py with every variant (issue 14's table), time left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T41-1
for a in "--head-dim 96 --seq-len 1500 --backward" "--head-dim 128 --head-dim-v 64 --seq-len 1024 --causal --backward" \
  "--head-dim 80 --seq-len 700 --seq-len-kv 1300 --gqa 2 --backward" "--head-dim 128 --seq-len 1024 --score-mod softcap:30 --causal --backward" \
  "--head-dim 128 --seq-len 2048 --score-mod softcap:30 --causal" "--head-dim 128 --seq-len 1000 --seq-len-kv 3000 --score-mod softcap:20 --causal"; do
  say "$a: $(check_json --heads 4 $a)"
done
(
  export FLASHJIT_DQ_QUAD_ORDER=1
  for a in "--head-dim 128 --seq-len 2048" "--head-dim 128 --causal --seq-len 300 --seq-len-kv 1000" "--head-dim 96 --window 200,0 --seq-len 1500 --gqa 2" "--head-dim 64 --head-dim-v 128 --seq-len 777"; do
    say "quads $a: $(check_json --heads 4 --backward $a)"
  done
  sanitize memcheck "--head-dim 128 --heads 2 --seq-len 700 --seq-len-kv 900 --causal --backward"
  timeout 100 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwdq.log 2>&1; echo "exit $?" >> $OUT/bwdq.log
  say "quads backward suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwdq.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwdq.log | head -6
)
sanitize racecheck "--head-dim 96 --heads 2 --seq-len 700 --seq-len-kv 900 --causal --backward"
timeout 100 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd.log 2>&1; echo "exit $?" >> $OUT/bwd.log
say "backward suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd.log | head -6
ms() { bench_env "$A $M" "$@" | ms_of; }
for r in 1 2; do
  A="--head-dim 128 --seq-len 8192 --heads 16 --backward"
  for m in plain causal window; do
    M=""; [[ $m == causal ]] && M=--causal; [[ $m == window ]] && M="--window 1024,0"
    say "round $r $m backward ms: default $(ms X=1) quads $(ms FLASHJIT_DQ_QUAD_ORDER=1)"
  done
  A="--head-dim 96 --seq-len 8192 --heads 16 --backward"; M=""
  say "round $r d 96 backward ms: default $(ms X=1) 2-stages $(ms FLASHJIT_BWD_STAGES=2) quads $(ms FLASHJIT_DQ_QUAD_ORDER=1)"
done
gpu_suites
left=$((570 - (SECONDS - CALL_T0)))
if ((left > 150)); then
  timeout $left python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A40 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
say done
