#!/usr/bin/env bash
# Prepared in T32 for the next third call (carry [".carry"], main's
# build): the captured-tensor plans (C API version 12) and the kept traces
# of flashjit.variants on the GPU: their torch tests, the document mask's
# host time a call (T29: 189 us unplanned), and the variants beside
# FlexAttention (issue 14's table).
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python:$PWD/python/tests
if ! python3 -c "import pytest" 2>/dev/null; then  # the carried wheels
  python3 -m pip install -q --no-index --no-deps --target /tmp/fj-site $C/wheels/*.whl &&
    export PYTHONPATH=/tmp/fj-site:$PYTHONPATH
fi
call_header 3
say "torch plan and captured tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_plans_gpu.py \
  python/tests/test_torch_captured_gpu.py python/tests/test_trace_cache_cpu.py > $OUT/py.log 2>&1
tail -3 $OUT/py.log; grep -E "^FAILED|Error" $OUT/py.log | head -6
say "document mask, host time a call"
timeout 80 bash tools/scripts/gpu-host-profile.sh 2>&1 | head -4
say "variants beside FlexAttention (ms)"
timeout 240 python3 tests/bench/variants.py --variants plain,softcap,alibi,window,document > $OUT/var.log 2>&1
tail -12 $OUT/var.log | cut -c1-150
say done
