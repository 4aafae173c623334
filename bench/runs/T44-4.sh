#!/usr/bin/env bash
# T44-4: carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh` (the polynomial tanh opt-in again after
# T44-3); command `bash bench/runs/T44-4.sh`, timeout 590. Issue 14's GPU
# evidence: (1) on an H200 only, variants.py (every variant against
# FlexAttention; T44-3 gave the H100's); (2) every C++ GPU suite at once
# (forward in 4 shards with ForwardTanhPolynomialGpu and the ping-pong
# mode-3 cases, captured, varlen, backward); (3) the torch GPU suites
# with autograd (test_torch_gpu, test_torch_captured_gpu,
# test_varlen_gpu), side by side.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-4
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 120 python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A16 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
_s() { local n=$1 b=$2; shift 2; env "$@" timeout 220 $C/bin/flashjit-$b-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$n.log 2>&1; echo "exit $?" >> $OUT/t-$n.log; }
for i in 0 1 2 3; do _s fwd$i forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
_s captured captured X=1 & _s varlen varlen X=1 & _s backward backward X=1 & wait
for l in fwd0 fwd1 fwd2 fwd3 captured varlen backward; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
python_tests_env
_py() { (cd python && timeout $1 python3 -m pytest -q tests/$2.py -p no:cacheprovider > $OUT/py-$2.log 2>&1; echo "exit $?" >> $OUT/py-$2.log); }
left=$((575 - (SECONDS - CALL_T0)))
if ((left > 60)); then
  for f in test_torch_gpu test_torch_captured_gpu test_varlen_gpu; do _py $left $f & done; wait
  for f in test_torch_gpu test_torch_captured_gpu test_varlen_gpu; do
    say "$f: $(tail -2 $OUT/py-$f.log | tr '\n' ' ' | cut -c1-200)"
    grep -E "^FAILED" $OUT/py-$f.log | head -5
  done
fi
say done
