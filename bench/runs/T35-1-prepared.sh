#!/usr/bin/env bash
# T35-1 (carry [".carry"], made at the end of T34: the library of T34's
# last C++ commit (softcap's fixed row max) in .carry/lib, the T34-B
# library (0642922's C++) in .carry/old; the Python binding from the tree,
# with T34's eager autograd path, _eager.py):
# (1) the forward GPU suites, captured, varlen; (2) softcap:30 and plain,
# old library | new, interleaved; (3) the host time of window / plain /
# causal calls with and without grad, do_bench's figure; (4) the torch
# GPU tests; (5) variants.py beside FlexAttention; (6) the overhead.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 1
left() { (( SECONDS - CALL_T0 < $1 )); }
gzip -dc $C/old/libflashjit.so.gz > $C/old/libflashjit.so
say "GPU suites"
gpu_suites
run_checks 128 "" "--seq-len 1000 --seq-len-kv 3000 --heads 8 --gqa 2 --score-mod softcap:30" \
  "--seq-len 3000 --heads 4 --score-mod softcap:40 --causal" "--seq-len 1 --seq-len-kv 5000 --heads 8 --gqa 4 --score-mod softcap:30"
say "forward at N 8192 H 16: old library | new | new with 2/8 of P's exp2 emulated (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout 150 bash tools/scripts/gpu-knobs.sh "LD_LIBRARY_PATH=$C/old|-|FLASHJIT_EXP2_EMULATION=2" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30" "--head-dim 128 --seq-len 8192 --score-mod softcap:30 --causal" \
  "--head-dim 128 --seq-len 8192" 2>&1 | tail -3 | cut -c1-200
say "host time and do_bench (us)"
timeout 90 python3 -u bench/runs/T34-5-window-host.py 2>&1 | head -6 | cut -c1-160
left 330 && {
say "torch GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_ops.py python/tests/test_torch_gpu.py \
  python/tests/test_torch_captured_gpu.py python/tests/test_varlen_gpu.py python/tests/test_torch_plans_gpu.py 2>&1 | tail -4 | cut -c1-200
}
left 420 && {
say "variants beside FlexAttention (ms)"
timeout 120 python3 tests/bench/variants.py --variants plain,alibi,softcap,window,document > $OUT/var.log 2>&1
tail -7 $OUT/var.log | cut -c1-170
}
left 530 && {
say "overhead (host us a call)"
timeout $((590 - SECONDS + CALL_T0)) python3 tests/bench/overhead.py --calls 1000 --rounds 2 \
  --plan-bench $C/bin/flashjit-plan-bench > $OUT/overhead.log 2>&1
grep -E "flashjit.attention|sdpa|plan" $OUT/overhead.log | head -8 | cut -c1-120
}
say done
