#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# tools/scripts/gpu-prepare.sh assembled .carry/ here: the K/V ring's
# consumer warpgroups in turn (FLASHJIT_PING_PONG, README "The K/V ring").
# Device call: carry [".carry"], command: bash tools/scripts/gpu-pingpong.sh
# Steps (about 6 minutes):
#   1. the forward GPU tests (ForwardKvRingGpu and ForwardPingPongGpu set
#      their environment themselves) -> $OUT/fwd-tests.log
#   2. racecheck and synccheck on ring kernels in each ping-pong mode
#   3. ring tilings at N = 16K, B = 1, H = 2048 / d in modes 0, 1, 2, and
#      the fastest tiling without the ring, one line each
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
echo "== forward GPU tests (+${SECONDS}s)"
timeout 200 $C/bin/flashjit-forward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/fwd-tests.log 2>&1; echo "exit $?" >> $OUT/fwd-tests.log
grep -E "FAILED|PASSED|tests ran|exit" $OUT/fwd-tests.log | head -30
echo "== sanitizers (+${SECONDS}s)"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for pp in 1 2; do
  for tool in racecheck synccheck; do
    a="--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --gqa 2 --heads 2 --seq-len 300 --seq-len-kv 700"
    FLASHJIT_KV_RING=1 FLASHJIT_PING_PONG=$pp timeout 60 $CS --tool $tool --error-exitcode 9 $FJ run $a --device cuda > $OUT/san.log 2>&1
    echo "pp$pp $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|-> ok|error' $OUT/san.log | head -2 | tr '\n' ' ')"
  done
done
echo "== tilings, N = 16K, B = 1, H = 2048 / d (+${SECONDS}s)"
b() { # ring pp d causal|plain tiling...
  local ring=$1 pp=$2 d=$3 m=$4; shift 4
  local mask=""; [[ $m == c ]] && mask=--causal
  r=$(FLASHJIT_KV_RING=$ring FLASHJIT_PING_PONG=$pp timeout 40 $FJ bench --head-dim $d $mask --seq-len 16384 --batch 1 --heads $((2048 / d)) "$@" --json 2>/dev/null | tail -1)
  echo "d$d $m ring$ring pp$pp [$*] $(echo "$r" | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("%.1f TFLOP/s regs %s spill %s ring %s pp %s" % (j.get("tflops",0), j.get("registers"), j.get("spill_bytes", j.get("spills")), j.get("kv_ring"), j.get("ping_pong")))
except Exception as e: print("failed", e)')"
}
t() { echo "--block-m $1 --block-n $2 --warps $3 --stages $4"; }
for pp in 0 1 2; do
  b 1 $pp 128 n $(t 128 128 8 2)
  b 1 $pp 128 n $(t 128 128 8 3)
  b 1 $pp 128 c $(t 128 128 8 2)
  b 1 $pp 64 n $(t 128 128 8 2)
  b 1 $pp 96 n $(t 128 128 8 2)
  b 1 $pp 128 n $(t 128 64 8 2)
  b 1 $pp 64 n $(t 128 64 8 2)
done
b 0 0 128 n $(t 192 128 12 2)
b 0 0 128 c $(t 64 128 4 2)
b 0 0 64 n $(t 64 128 4 2)
b 0 0 96 n $(t 192 128 12 2)
echo "== done (+${SECONDS}s)"
