#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh` here; device
# call with carry [".carry"]: bash tools/scripts/gpu-bwd-ring.sh
#
# The backward's Q/dO ring (README, the dK/dV kernel: FLASHJIT_BWD_RING=S,
# opt-in since T27, not yet run on a GPU when written), in one call of
# about 9 minutes:
#   1. the backward and captured-tensor GPU suites with the ring (S = 2),
#      side by side -> $OUT/ring-backward.log, ring-captured.log
#   2. compute-sanitizer racecheck, memcheck and synccheck on ring
#      backwards (S = 2 and 3; causal with Nq != Nkv, d 96, softcap)
#   3. the backward timed three ways, interleaved rounds (no ring, S = 2,
#      S = 3): TFLOP/s per round, B 1, H 16, N 8192
#   4. tests/bench/variants.py with the ring (FLASHJIT_BWD_RING_VARIANTS,
#      default 2; 0 skips): the backward beside FlexAttention's
# Environment: FLASHJIT_BWD_RING_STEPS (default tests,sanitize,bench,
# variants), FLASHJIT_AB_ROUNDS (default 3).
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
steps=${FLASHJIT_BWD_RING_STEPS:-tests,sanitize,bench,variants}
has() { [[ ",$steps," == *",$1,"* ]]; }
say() { echo "[gpu-bwd-ring +${SECONDS}s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

if has tests; then
  for b in backward captured; do
    FLASHJIT_BWD_RING=2 timeout 200 "$C/bin/flashjit-$b-gpu-tests" --gtest_brief=1 --gtest_color=no \
      >"$OUT/ring-$b.log" 2>&1 &
  done
  wait
  for b in backward captured; do
    say "$b (ring 2): $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$OUT/ring-$b.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]' "$OUT/ring-$b.log" | head -8
  done
fi

if has sanitize; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  while read -r tool stages args; do
    [[ -z $tool ]] && continue
    r=$(FLASHJIT_BWD_RING=$stages timeout 120 "$CS" --tool "$tool" --error-exitcode 9 "$FJ" run --device cuda --json $args 2>&1)
    echo "$tool ring $stages rc=$? $(grep -o '"ok":[a-z]*' <<<"$r" | head -1) $(grep -oE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?' <<<"$r" | head -1) :: $args"
  done <<'CASES'
racecheck 2 --backward --head-dim 128 --seq-len 384
racecheck 3 --backward --head-dim 128 --causal --seq-len 400 --seq-len-kv 333
synccheck 2 --backward --head-dim 96 --seq-len 300
memcheck 2 --backward --head-dim 128 --causal --seq-len 333 --seq-len-kv 400
memcheck 3 --backward --head-dim 128 --score-mod softcap:30 --seq-len 200
CASES
fi

if has bench; then
  say "the backward: no ring | ring 2 | ring 3 (TFLOP/s, interleaved rounds)"
  for a in "--head-dim 128" "--head-dim 128 --causal" "--head-dim 96" "--head-dim 64 --heads 32 --causal" \
           "--head-dim 128 --score-mod softcap:30"; do
    line=""
    for ((r = 0; r < ${FLASHJIT_AB_ROUNDS:-3}; ++r)); do
      for s in 0 2 3; do
        t=$(FLASHJIT_BWD_RING=$s timeout 60 "$FJ" bench --backward --batch 1 --heads 16 --seq-len 8192 $a --json 2>/dev/null | tflops_of)
        line+=" $s:$t"
      done
    done
    echo "[$a]$line"
  done
fi

if has variants && [[ ${FLASHJIT_BWD_RING_VARIANTS:-2} != 0 ]]; then
  say "variants beside FlexAttention, ring ${FLASHJIT_BWD_RING_VARIANTS:-2}"
  FLASHJIT_BWD_RING=${FLASHJIT_BWD_RING_VARIANTS:-2} timeout -k 5 200 python3 tests/bench/variants.py \
    --variants plain,alibi,window,document --json "$OUT/ring-variants.json" >"$OUT/ring-variants.log" 2>&1
  grep -E '^\|' "$OUT/ring-variants.log" | head -8
fi
say done
