#!/usr/bin/env bash
# T43-2 (carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`; command `bash bench/runs/T43-2.sh`):
# (1) the new causal default (turns at the unit) against
# FLASHJIT_PING_PONG=0, two rounds, and run --json's ping_pong; (2) variants.py, every variant, against FlexAttention
# (issue 14's table); (3) the backward, captured and varlen GPU suites
# and the ping-pong cases (now with mode 3). (Three consumer warpgroups for softcap were
# dropped: T39 measured them, 522.8 against 600 TFLOP/s.)
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T43-2
S="--head-dim 128 --seq-len 8192 --heads 16"
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
say "causal plain TFLOP/s: default $(tf "$S --causal" X=1) pp0 $(tf "$S --causal" FLASHJIT_PING_PONG=0) default $(tf "$S --causal" X=1) pp0 $(tf "$S --causal" FLASHJIT_PING_PONG=0); json: $(bench_env "$S --causal" X=1 | grep -o '"ping_pong":[0-9]')"
left=$((${T43_DEADLINE:-200} - (SECONDS - CALL_T0)))
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
say done
