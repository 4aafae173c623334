#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# tools/scripts/gpu-prepare.sh assembled .carry/ here: the K/V ring's
# (README "The K/V ring"; FLASHJIT_KV_RING=1) H200 run (T10a). Device call:
#   carry [".carry"], command: bash tools/scripts/gpu-ring.sh
# Steps, each bounded by its own timeout (about 7 minutes in all):
#   1. the forward GPU tests (ForwardKvRingGpu sets FLASHJIT_KV_RING=1
#      itself) -> $OUT/fwd-tests.log
#   2. compute-sanitizer memcheck, racecheck, synccheck on two ring kernels
#   3. tilings at N = 16K, B = 1, H = 2048 / d, with and without the ring
#      (stages 1), one line each: TFLOP/s, registers, spills, ring stages
#   4. side_by_side.py forward only (the peers of the same run), with the
#      ring's default tilings -> $OUT/bench.json, bench.log
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
T0=$SECONDS
export FLASHJIT_KV_RING=${FLASHJIT_KV_RING:-1}
echo "== forward GPU tests (+${SECONDS}s)"
FLASHJIT_KV_RING=0 timeout 150 $C/bin/flashjit-forward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/fwd-tests.log 2>&1; echo "exit $?" >> $OUT/fwd-tests.log
grep -E "FAILED|PASSED|tests ran|exit" $OUT/fwd-tests.log | head -30
echo "== sanitizers on the ring (+${SECONDS}s)"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck synccheck; do
  for a in "--head-dim 64 --block-m 64 --block-n 64 --warps 4 --stages 3 --causal --seq-len 300 --seq-len-kv 500" \
           "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --gqa 2 --heads 2 --seq-len 257"; do
    timeout 60 $CS --tool $tool --error-exitcode 9 $FJ run $a --device cuda > $OUT/san.log 2>&1
    echo "$tool [$a]: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|-> ok|error' $OUT/san.log | head -2 | tr '\n' ' ')"
  done
done
echo "== tilings, N = 16K, B = 1, H = 2048 / d (+${SECONDS}s)"
b() { # d causal|plain tiling...
  local d=$1 m=$2; shift 2
  local mask=""; [[ $m == c ]] && mask=--causal
  r=$(timeout 40 $FJ bench --head-dim $d $mask --seq-len 16384 --batch 1 --heads $((2048 / d)) "$@" --json 2>/dev/null | tail -1)
  echo "d$d $m [$*] $(echo "$r" | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("%.1f TFLOP/s regs %s spill %s ring %s" % (j.get("tflops",0), j.get("registers"), j.get("spill_bytes", j.get("spills")), j.get("kv_ring")))
except Exception as e: print("failed", e)')"
}
t() { echo "--block-m $1 --block-n $2 --warps $3 --stages $4"; }
for cfg in "128 128 8 2" "128 128 8 3" "128 128 8 1" "192 128 12 1" "64 128 4 2" "128 64 8 2" "128 64 8 3"; do b 128 n $(t $cfg); done
for cfg in "128 128 8 2" "64 128 4 2" "128 64 8 2" "192 128 12 1" "128 128 8 1"; do b 128 c $(t $cfg); done
for cfg in "128 128 8 2" "64 128 4 2" "128 64 8 2" "128 128 8 3"; do b 64 n $(t $cfg); done
for cfg in "128 128 8 2" "128 64 8 2" "192 128 12 1"; do b 96 n $(t $cfg); done
for cfg in "128 128 8 1" "128 64 8 2" "64 64 4 2" "64 128 4 2"; do b 256 n $(t $cfg); done
echo "== peers, forward, default tilings (+${SECONDS}s)"
left=$((560 - SECONDS)); ((left < 60)) && left=60
timeout -k 5 $left python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --budget-s 60 \
  --cases "128:16384:n,128:16384:c,64:16384:n,96:16384:n,256:16384:n" > $OUT/bench.log 2>&1
tail -25 $OUT/bench.log
echo "== done (+${SECONDS}s)"
