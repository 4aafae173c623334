#!/usr/bin/env bash
# T31 call 4 (THERE): the persistent d = 128 default (persistent kernel, Q by
# its tensor map). 1) every GPU suite and the torch tests, in parallel;
# 2) sanitizers on the new default kernel; 3) the default against one tile
# per program (FLASHJIT_PERSISTENT=0 FLASHJIT_TMA=kv), interleaved;
# 4) issue 13's forward bar table beside cuDNN.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
T0=$SECONDS
say() { echo "[4 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
echo "build: $(sed -n 2p .carry/MANIFEST.txt)"
gt() { local log=$1 bin=$2; shift 2
  env "$@" timeout 170 $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log; }
for i in 0 1 2 3; do gt fwd$i forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
for b in captured varlen runtime backward tune; do gt $b $b & done
python3 -m pip install -q --no-index --no-deps --target /tmp/site $C/wheels/*.whl >/dev/null 2>&1
(PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py python/tests/test_torch_plans_gpu.py python/tests/test_torch_ops.py python/tests/test_torch_captured_gpu.py python/tests/test_varlen_gpu.py > $OUT/t-py.log 2>&1; echo "exit $?" >> $OUT/t-py.log) &
wait
for l in fwd0 fwd1 fwd2 fwd3 captured varlen runtime backward tune; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
say "torch: $(grep -E 'passed|failed' $OUT/t-py.log | tail -1) $(tail -1 $OUT/t-py.log)"
grep -E "^FAILED" $OUT/t-py.log | head -5
mkdir -p $OUT/fail; for l in fwd0 fwd1 fwd2 fwd3 captured varlen runtime backward tune; do grep -q "FAILED  \] [A-Z]" $OUT/t-$l.log && grep -B30 "^\[  FAILED  \] [A-Z]" $OUT/t-$l.log | head -80 > $OUT/fail/$l.txt; done
grep -q "failed" $OUT/t-py.log && tail -60 $OUT/t-py.log > $OUT/fail/py.txt
rm -f $OUT/t-*.log
sanitize "racecheck memcheck synccheck" "--head-dim 128 --seq-len 300 --seq-len-kv 333 --batch 2 --heads 3 --json" \
  "--head-dim 128 --seq-len 1000 --gqa 2 --heads 4 --json"
rm -f $OUT/san.log
say "default against one tile per program (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=3 timeout 100 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_PERSISTENT=0 FLASHJIT_TMA=kv" \
  "--head-dim 128 --seq-len 1024 --batch 16" "--head-dim 128 --seq-len 4096 --batch 4" "--head-dim 128" 2>&1 | tail -3 | cut -c1-160
say "forward bars beside cuDNN"
timeout 150 python3 tests/bench/side_by_side.py --flashjit $FJ --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:1024:c:16,128:4096:n:4,64:16384:n,64:16384:c,96:16384:n,96:16384:c,256:16384:n,256:16384:c \
  > $OUT/sbs.log 2>&1
grep -A13 "^side-by-side" $OUT/sbs.log | cut -c1-90
say done
