#!/usr/bin/env bash
# T33-M (prepared in T33, when device starts kept failing: the one call
# most worth making): (1) issue 13's forward bar table beside cuDNN; (2)
# T32's torch tests (captured plans are main's default path, never run on
# a GPU); (3) the backward's split commits (b00bda9, opt-in): the suite,
# racecheck, against the default; (4) score-mod variants with the
# persistent kernel. Each step skipped near the 600 s.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header M
left() { (( SECONDS - CALL_T0 < $1 )); }
say "forward bars beside cuDNN"
timeout 160 python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:4096:n:4,64:16384:n,64:16384:c,96:16384:n,96:16384:c,256:16384:n,256:16384:c \
  > $OUT/sbs.log 2>&1
grep -A14 "^side-by-side" $OUT/sbs.log | cut -c1-100
say "torch plan and captured tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_plans_gpu.py \
  python/tests/test_torch_captured_gpu.py python/tests/test_trace_cache_cpu.py > $OUT/py.log 2>&1
tail -2 $OUT/py.log; grep -E "^FAILED|Error" $OUT/py.log | head -6
left 380 && {
FLASHJIT_BWD_SPLIT_COMMITS=1 timeout 90 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-bwd.log 2>&1
say "backward tests, split commits (exit $?): $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' $OUT/t-bwd.log | tr "\n" " ")"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-bwd.log | head -6
FLASHJIT_BWD_SPLIT_COMMITS=1 sanitize "racecheck" "--backward --head-dim 128 --causal --seq-len 300 --seq-len-kv 700 --heads 2 --json"
}
left 470 && {
say "backward: default | split commits (TFLOP/s, N 8192, B 1, H 16)"
FLASHJIT_KNOB_ROUNDS=2 timeout 70 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_BWD_SPLIT_COMMITS=1" \
  "--backward --head-dim 128 --seq-len 8192" "--backward --head-dim 128 --seq-len 8192 --causal" 2>&1 | tail -2 | cut -c1-200
}
left 530 && {
say "variants at N 8192: default | persistent + Q by TMA (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout $((588 - SECONDS + CALL_T0)) bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30" "--head-dim 128 --seq-len 8192 --score-mod alibi:16" 2>&1 | tail -2 | cut -c1-200
}
say done
