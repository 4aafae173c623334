#!/usr/bin/env bash
# Runs THERE (the GPU machine) from the repo root, after
# `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh` here; device
# call with carry [".carry"]: bash tools/scripts/gpu-decode.sh
#
# The split-KV forward (decode and short queries), in one call:
#   1. the forward GPU tests (every suite: the one-pass matrix, warpgroup
#      MMAs, the K/V ring, ping-pong, SplitKvGpu) and the runtime's (plans)
#   2. compute-sanitizer memcheck / racecheck / synccheck on two split runs
#   3. tests/bench/decode.py: the default (auto splits) against sdpa-flash,
#      sdpa-cudnn and the copy bandwidth, then tiling variants on the bar
#      case (B 16, 32/4 heads, Nkv 32768, d 128)
#   4. one prefill case of side_by_side.py (d 128, N 16K): the one-pass
#      forward must be unchanged
# Environment: FLASHJIT_DECODE_STEPS (default tests,sanitize,bench,prefill),
# FLASHJIT_GTEST_FILTER (the tests' --gtest_filter).
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
steps=${FLASHJIT_DECODE_STEPS:-tests,sanitize,bench,prefill}
has() { [[ ",$steps," == *",$1,"* ]]; }
say() { echo "[gpu-decode +${SECONDS}s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

if has tests; then
  for b in flashjit-forward-gpu-tests flashjit-runtime-gpu-tests; do
    say "$b"
    timeout 240 "$C/bin/$b" --gtest_brief=1 --gtest_color=no ${FLASHJIT_GTEST_FILTER:+--gtest_filter=$FLASHJIT_GTEST_FILTER} >"$OUT/$b.log" 2>&1
    echo "exit $?" >>"$OUT/$b.log"
    grep -E "^\[  (PASSED|FAILED) |FAILED TEST|^exit" "$OUT/$b.log" | head -20
  done
fi

if has sanitize; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in memcheck racecheck synccheck; do
    for args in "--head-dim 128 --gqa 8 --heads 8 --seq-len 1 --seq-len-kv 4096" \
                "--head-dim 64 --gqa 4 --heads 8 --causal --seq-len 5 --seq-len-kv 1500 --block-m 64 --block-n 64 --warps 4 --kv-splits 3"; do
      r=$(timeout 120 "$CS" --tool $tool --error-exitcode 9 "$FJ" run --device cuda --json $args 2>&1)
      echo "$tool rc=$? ok=$(grep -o '"ok":[a-z]*' <<<"$r") $(grep -oE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?' <<<"$r" | head -1) :: $args"
    done
  done
fi

if has bench; then
  say "decode bench (default tiling)"
  timeout 200 python3 tests/bench/decode.py --flashjit "$FJ" --out "$OUT/decode.json" 2>&1 | tail -12
  for v in "--block-m 64 --block-n 64 --warps 4 --kv-splits auto" \
           "--block-m 16 --block-n 128 --warps 1 --kv-splits auto" \
           "--block-m 16 --block-n 64 --warps 1 --kv-splits 8" \
           "--block-m 16 --block-n 64 --warps 1 --kv-splits 32" \
           "--block-m 16 --block-n 64 --warps 1 --kv-splits 0"; do
    say "variant: $v"
    timeout 60 python3 tests/bench/decode.py --flashjit "$FJ" --rounds 1 --cases 16:32:4:1:32768:128 \
      --flashjit-args "$v" --out "$OUT/decode-$(tr -dc 'a-z0-9' <<<"$v").json" 2>&1 | tail -1
  done
fi

if has prefill; then
  say "prefill check"
  FLASHJIT_CASES=128:16384:n timeout 150 python3 tests/bench/side_by_side.py --flashjit "$FJ" --no-backward --no-flex \
    --rounds 2 --out "$OUT/prefill.json" 2>&1 | tail -8
fi
say done
