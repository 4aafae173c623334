#!/usr/bin/env bash
# T30 call 4 (THERE): ping-pong off by default (this build: every ring
# kernel; FLASHJIT_PING_PONG still overrides). GPU suites, a sanitizer on
# the default overlapped kernel, d = 128 beside cuDNN, then ping-pong 0
# against 1 (explicit) at d = 64, 96, 256, N = 16K.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
T0=$SECONDS
say() { echo "[4 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
echo "build: $(sed -n 2p .carry/MANIFEST.txt)"
gt() { local log=$1 bin=$2; shift 2
  env "$@" timeout 140 $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log; }
for i in 0 1 2 3; do gt fwd$i forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
gt captured captured & gt varlen varlen &
wait
for l in fwd0 fwd1 fwd2 fwd3 captured varlen; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -4
done
rm -f $OUT/t-*.log
FJ=$C/bin/flashjit
for tool in racecheck synccheck; do
  r=$(timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $FJ run --head-dim 128 --causal --seq-len 300 --seq-len-kv 333 --device cuda --json 2>&1)
  say "$tool default d128 causal: exit $? $(echo "$r" | grep -E 'SUMMARY' | head -1) pp=$(echo "$r" | grep -o '"ping_pong":[0-9]' | head -1)"
done
say "d = 128 beside cuDNN"
timeout 120 python3 tests/bench/side_by_side.py --flashjit $FJ --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:1024:c:16,128:4096:n:4 > $OUT/sbs.log 2>&1
grep -A9 "^side-by-side" $OUT/sbs.log
say "ping-pong 0 vs 1 (explicit), TFLOP/s, rounds"
cache=$(mktemp -d)
t() { FLASHJIT_CACHE_DIR=$cache env "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tflops"])' 2>/dev/null || echo fail; }
for s in "--head-dim 64" "--head-dim 64 --causal" "--head-dim 96" "--head-dim 96 --causal" "--head-dim 256" "--head-dim 256 --causal"; do
  a="" b=""
  for r in 1 2 3; do
    a+=" $(t FLASHJIT_PING_PONG=0 $FJ bench --heads 16 --seq-len 16384 $s --json)"
    b+=" $(t FLASHJIT_PING_PONG=1 $FJ bench --heads 16 --seq-len 16384 $s --json)"
  done
  say "$s: pp0$a | pp1$b"
done
say done
