#!/usr/bin/env bash
# T35-1 (carry [".carry"], the T34-B build's library = 0642922's C++; the binding
# from the tree, e50a3aa: eager calls with grad through _eager.py):
# (1) the host time of window / plain / causal calls with and without
# grad and do_bench's figure; (2) the torch ops tests on the GPU;
# (3) variants.py beside FlexAttention; (4) the per-call overhead.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 1
left() { (( SECONDS - CALL_T0 < $1 )); }
say "host time and do_bench (us)"
timeout 120 python3 -u bench/runs/T34-5-window-host.py 2>&1 | head -12 | cut -c1-160
say "torch ops tests (GPU)"
timeout 200 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_ops.py python/tests/test_torch_gpu.py python/tests/test_torch_captured_gpu.py python/tests/test_varlen_gpu.py python/tests/test_torch_plans_gpu.py 2>&1 | tail -4 | cut -c1-200
left 360 && {
say "variants beside FlexAttention (ms)"
timeout 170 python3 tests/bench/variants.py --variants plain,alibi,softcap,window,document > $OUT/var.log 2>&1
tail -7 $OUT/var.log | cut -c1-170
}
left 520 && {
say "overhead (host us a call)"
timeout $((590 - SECONDS + CALL_T0)) python3 tests/bench/overhead.py --calls 1000 --rounds 2 \
  --plan-bench $C/bin/flashjit-plan-bench > $OUT/overhead.log 2>&1
grep -E "flashjit.attention|sdpa|plan" $OUT/overhead.log | head -8 | cut -c1-120
}
say done
