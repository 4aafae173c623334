#!/usr/bin/env bash
# T40-3 (carry [".carry"]; command `bash bench/runs/T40-3-prepared.sh`):
# the backward's third Q/dO stage (FLASHJIT_BWD_STAGES=3, opt-in, new:
# T40-1's ncu put 14% of the dK/dV step's stall samples on its copies)
# against float64, racecheck, the backward suite, and timed against the
# default (staged dK/dV stores on in both) in two interleaved rounds; the
# banded softcap's share in two rounds (0, 2, default 3 eighths); then,
# time left, issue 14's backward bars beside FlexAttention (variants.py
# plain, window, document).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T40-3
(
  export FLASHJIT_BWD_STAGES=3
  for a in "--head-dim 128 --seq-len 2048" "--head-dim 128 --causal --seq-len 300 --seq-len-kv 1000" "--head-dim 128 --block-sparse 0.3 --seq-len 1024" "--head-dim 128 --window 200,0 --seq-len 1500"; do
    say "3 stages $a: $(check_json --heads 4 --backward $a)"
  done
  sanitize racecheck "--head-dim 128 --heads 2 --seq-len 700 --seq-len-kv 900 --causal --backward"
  timeout 90 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd3.log 2>&1; echo "exit $?" >> $OUT/bwd3.log
  say "3 stages backward suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd3.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd3.log | head -6
)
A="--head-dim 128 --seq-len 8192 --heads 16 --backward"
ms() { bench_env "$A $M" "$@" | ms_of; }
for r in 1 2; do
  for m in plain causal window; do
    M=""; [[ $m == causal ]] && M=--causal; [[ $m == window ]] && M="--window 1024,0"
    say "round $r $m backward ms: default $(ms X=1) 3-stages $(ms FLASHJIT_BWD_STAGES=3)"
  done
done
F="--head-dim 128 --seq-len 8192 --heads 16"
tf() { bench_env "$F $M" "$@" | tflops_of; }
for r in 1 2; do
  M="--causal --score-mod softcap:30"; c="emu0 $(tf FLASHJIT_EXP2_EMULATION=0) emu2 $(tf FLASHJIT_EXP2_EMULATION=2) default(3) $(tf X=1)"
  M="--window 4096,0 --score-mod softcap:50"; w="emu0 $(tf FLASHJIT_EXP2_EMULATION=0) emu2 $(tf FLASHJIT_EXP2_EMULATION=2) default(3) $(tf X=1)"
  say "round $r TFLOP/s causal softcap:30: $c | window 4096 softcap:50: $w"
done
left=$((200 - (SECONDS - CALL_T0)))
if ((left > 60)); then
  timeout $left python3 tests/bench/variants.py --json $OUT/variants.json --variants plain,window,document > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A30 '^variants, bf16' $OUT/variants.log | cut -c1-170
fi
say done
