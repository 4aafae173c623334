#!/usr/bin/env bash
# T41-1 (carry [".carry"]; command `bash bench/runs/T41-1-prepared.sh`):
# the new defaults' first run: three stages of the backward's Q/dO copies
# wherever they fit (T40-3: plain -0.6%, causal -2.6%, window -2.5% at
# d 128) and 2/8 of a causal softcap forward's exponentials by arithmetic
# (none for windows). float64 checks at the shapes the third stage newly
# reaches (d 96, d != dv, GQA, softcap), racecheck at d 96, the backward
# suite beside the forward, captured and varlen suites; d 96's backward
# against two stages and the opt-in bulk dQ against the default (two
# rounds); then variants.py with every variant (issue 14's table).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T41-1
for a in "--head-dim 96 --seq-len 1500 --backward" "--head-dim 128 --head-dim-v 64 --seq-len 1024 --causal --backward" \
  "--head-dim 80 --seq-len 700 --seq-len-kv 1300 --gqa 2 --backward" "--head-dim 128 --seq-len 1024 --score-mod softcap:30 --causal --backward" \
  "--head-dim 128 --seq-len 2048 --score-mod softcap:30 --causal" "--head-dim 128 --seq-len 1000 --seq-len-kv 3000 --score-mod softcap:20 --causal"; do
  say "$a: $(check_json --heads 4 $a)"
done
sanitize racecheck "--head-dim 96 --heads 2 --seq-len 700 --seq-len-kv 900 --causal --backward"
timeout 100 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd.log 2>&1; echo "exit $?" >> $OUT/bwd.log
say "backward suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd.log | head -6
gpu_suites
ms() { bench_env "$A" "$@" | ms_of; }
for r in 1 2; do
  A="--head-dim 96 --seq-len 8192 --heads 16 --backward"
  say "round $r d 96 backward ms: default $(ms X=1) 2-stages $(ms FLASHJIT_BWD_STAGES=2)"
  A="--head-dim 128 --seq-len 8192 --heads 16 --backward"
  say "round $r d 128 backward ms: default $(ms X=1) bulk-dq $(ms FLASHJIT_BULK_DQ=1)"
  A="--head-dim 128 --seq-len 8192 --heads 16 --backward --causal"
  say "round $r causal backward ms: default $(ms X=1) bulk-dq $(ms FLASHJIT_BULK_DQ=1)"
done
left=$((560 - (SECONDS - CALL_T0)))
if ((left > 150)); then
  timeout $left python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A40 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
say done
