#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh here): variable-length packing
# (issue 14 item 5) on the GPU, and the regression of the kernels' argument
# lists (two offset buffers in every forward and backward ABI). Device call:
# carry [".carry"], command:
#   bash tools/scripts/gpu-varlen.sh
# Steps (FLASHJIT_VARLEN_STEPS, comma-separated; default all):
#   varlen    flashjit-varlen-gpu-tests (every case) -> $OUT/varlen.log
#   regress   the forward and backward GPU suites in FLASHJIT_SHARDS
#             concurrent shards (default 3) for FLASHJIT_REGRESS_S seconds
#             (default 240), the runtime and captured-tensor suites
#             -> $OUT/fwd-*.log, bwd-*.log, runtime.log, captured.log
#   sanitize  memcheck and racecheck on varlen kernels (the ring, split-KV
#             decode, the backward)
#   bench     tests/bench/varlen.py beside FA2's varlen and FlexAttention's
#             document mask -> $OUT/varlen.json (FLASHJIT_BENCH_ARGS: e.g.
#             "--backward", "--peers fa2-varlen", "--cases ...")
#   python    the Python varlen and Hugging Face tests on CUDA (padded
#             batches run as varlen) -> $OUT/python.log
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_VARLEN_STEPS:-varlen,regress,sanitize,bench,python}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
# suite NAME BINARY SECONDS [FILTER]: one GoogleTest binary in shards.
shards() {
  local name=$1 bin=$2 secs=$3 filter=${4:-*} n=${FLASHJIT_SHARDS:-3} i
  for ((i = 0; i < n; ++i)); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout $secs $C/bin/$bin \
      --gtest_brief=1 --gtest_color=no --gtest_filter="$filter" > $OUT/$name-$i.log 2>&1 &
  done
  wait
  for ((i = 0; i < n; ++i)); do
    echo "$name shard $i: $(grep -cE '^\[       OK|^\[  PASSED' $OUT/$name-$i.log) ok-lines," \
      "$(grep -E 'test suites ran|PASSED|FAILED  \]' $OUT/$name-$i.log | head -4 | tr '\n' ' ')"
  done
}
if step varlen; then
  echo "== varlen GPU tests (+${SECONDS}s)"
  timeout 240 $C/bin/flashjit-varlen-gpu-tests --gtest_color=no > $OUT/varlen.log 2>&1
  echo "exit $?" >> $OUT/varlen.log
  grep -E "FAILED|PASSED|tests ran|exit|Failure" $OUT/varlen.log | head -20
fi
if step regress; then
  echo "== regression: forward and backward suites (+${SECONDS}s)"
  shards fwd flashjit-forward-gpu-tests ${FLASHJIT_REGRESS_S:-240}
  shards bwd flashjit-backward-gpu-tests ${FLASHJIT_REGRESS_S:-240}
  timeout 120 $C/bin/flashjit-runtime-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/runtime.log 2>&1
  echo "runtime: exit $? $(grep -E 'tests ran|PASSED|FAILED' $OUT/runtime.log | head -3 | tr '\n' ' ')"
  timeout 150 $C/bin/flashjit-captured-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/captured.log 2>&1
  echo "captured: exit $? $(grep -E 'tests ran|PASSED|FAILED' $OUT/captured.log | head -3 | tr '\n' ' ')"
fi
if step sanitize; then
  echo "== sanitizers on varlen kernels (+${SECONDS}s)"
  sanitize "memcheck racecheck" \
    "--head-dim 128 --heads 4 --gqa 2 --causal --seqlens-q 300,1,0,129 --seqlens-kv 200,40,7,129" \
    "--head-dim 64 --heads 8 --gqa 4 --seqlens-q 1,1,1 --seqlens-kv 3000,0,17" \
    "--backward --head-dim 64 --heads 4 --window 32,0 --seqlens-q 200,0,64 --seqlens-kv 150,9,64"
fi
if step bench; then
  echo "== varlen beside FA2 varlen and FlexAttention (+${SECONDS}s)"
  timeout -k 5 ${FLASHJIT_BENCH_S:-300} python3 tests/bench/varlen.py --flashjit "$FJ" \
    --rounds ${FLASHJIT_BENCH_ROUNDS:-3} ${FLASHJIT_BENCH_ARGS:-} --out $OUT/varlen.json > $OUT/bench.log 2>&1
  echo "exit $?" >> $OUT/bench.log
  grep -vE "^\s*$" $OUT/bench.log | tail -12
fi
if step python; then
  echo "== python varlen tests (+${SECONDS}s)"
  timeout -k 5 ${FLASHJIT_PYTHON_S:-240} python3 -m pytest -q -p no:cacheprovider \
    python/tests/test_varlen_gpu.py python/tests/test_hf_gpu.py > $OUT/python.log 2>&1
  echo "exit $?" >> $OUT/python.log
  grep -E "FAILED|passed|failed|exit|Error" $OUT/python.log | tail -10
fi
echo "== done (+${SECONDS}s)"
