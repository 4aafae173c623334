#!/usr/bin/env bash
# T44-4: carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh` (the polynomial tanh opt-in again after
# T44-3); command `bash bench/runs/T44-4.sh`, timeout 590. Issue 14's GPU
# evidence: (1) on an H200 only, variants.py (every variant against
# FlexAttention; T44-3 gave the H100's); (2) every C++ GPU suite at once
# (forward in 4 shards with ForwardTanhPolynomialGpu and the ping-pong
# mode-3 cases, captured, varlen, backward); (3) the torch GPU suites
# with autograd (test_torch_gpu, test_torch_captured_gpu,
# test_varlen_gpu), one after another (torch_suites), time left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-4
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 120 python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A16 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
# The backward suite beside gpu_suites' (forward in 4 shards, captured,
# varlen), whose wait covers it too.
(timeout 200 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd.log 2>&1; echo "exit $?" >> $OUT/bwd.log) &
gpu_suites
say "backward: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd.log | head -6
if (( SECONDS - CALL_T0 < 330 )); then
  torch_suites test_torch_gpu test_torch_captured_gpu test_varlen_gpu
fi
say done
