#!/usr/bin/env bash
# T33-B (prepared in T33): (1) T32's torch tests (captured plans, kept
# traces) and the per-call overhead; (2) the backward's split commits
# (FLASHJIT_BWD_SPLIT_COMMITS=1, b00bda9): the backward GPU suite and
# racecheck with them, then against the default; (3) variants beside
# FlexAttention while time is left. Each step skipped near the 600 s.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header B
left() { (( SECONDS - CALL_T0 < $1 )); }
say "torch plan, captured and trace tests"
timeout 130 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_plans_gpu.py \
  python/tests/test_torch_captured_gpu.py python/tests/test_trace_cache_cpu.py > $OUT/py.log 2>&1
tail -2 $OUT/py.log; grep -E "^FAILED|Error" $OUT/py.log | head -6
say "overhead (host us a call)"
timeout 50 python3 tests/bench/overhead.py --calls 1000 --rounds 2 --parts --plan-bench $C/bin/flashjit-plan-bench \
  > $OUT/overhead.log 2>&1; grep -E "flashjit.attention|sdpa|plan" $OUT/overhead.log | head -8 | cut -c1-120
left 330 && {
FLASHJIT_BWD_SPLIT_COMMITS=1 timeout 120 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-bwd.log 2>&1
say "backward tests, split commits: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' $OUT/t-bwd.log | tr "\n" " ")"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-bwd.log | head -6
FLASHJIT_BWD_SPLIT_COMMITS=1 sanitize "racecheck" "--backward --head-dim 128 --causal --seq-len 300 --seq-len-kv 700 --heads 2 --json" \
  "--backward --head-dim 128 --score-mod softcap:30 --seq-len 333 --heads 2 --json"
}
left 460 && {
say "backward: default | split commits (TFLOP/s, N 8192, B 1, H 16)"
FLASHJIT_KNOB_ROUNDS=2 timeout 120 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_BWD_SPLIT_COMMITS=1" \
  "--backward --head-dim 128 --seq-len 8192" "--backward --head-dim 128 --seq-len 8192 --causal" \
  "--backward --head-dim 64 --seq-len 8192" "--backward --head-dim 128 --seq-len 8192 --score-mod alibi:16" 2>&1 | tail -4 | cut -c1-200
}
left 480 && {
say "variants beside FlexAttention (ms)"
timeout $((588 - SECONDS + CALL_T0)) python3 tests/bench/variants.py --variants plain,softcap,alibi,document > $OUT/var.log 2>&1
tail -10 $OUT/var.log | cut -c1-150
}
say done
