#!/usr/bin/env bash
# Prepared in T32 for the next second call (carry [".carry"], main's
# build): T31's exp2 emulation (its GPU tests and timing), d = 256's other
# candidates, then issue 13's forward bar table beside cuDNN.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
call_header 2
timeout 100 $C/bin/flashjit-forward-gpu-tests --gtest_filter='*Exp2*' --gtest_brief=1 --gtest_color=no > $OUT/t-exp2.log 2>&1
say "exp2 tests: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' $OUT/t-exp2.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-exp2.log | head -4
say "exp2 emulation (TFLOP/s, N 8192)"
FLASHJIT_KNOB_ROUNDS=2 timeout 150 bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_EXP2_EMULATION=2|FLASHJIT_EXP2_EMULATION=4" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30" "--head-dim 128 --seq-len 8192 --score-mod softcap:30 --causal" \
  "--head-dim 128 --seq-len 8192 --score-mod alibi:16" "--head-dim 128 --seq-len 8192" 2>&1 | tail -4 | cut -c1-200
say "d 256 candidates (TFLOP/s)"
O="--block-m 128 --block-n 64 --warps 8 --stages 2"
FLASHJIT_KNOB_ROUNDS=3 timeout 120 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_PERSISTENT=1|$O --overlap-softmax" \
  "--head-dim 256 --heads 8" "--head-dim 256 --heads 8 --causal" 2>&1 | tail -2 | cut -c1-220
say "forward bars beside cuDNN"
timeout 150 python3 tests/bench/side_by_side.py --flashjit $FJ --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:4096:n:4,64:16384:n,64:16384:c,96:16384:n,96:16384:c,256:16384:n,256:16384:c \
  > $OUT/sbs.log 2>&1
grep -A12 "^side-by-side" $OUT/sbs.log | cut -c1-90
say done
