#!/usr/bin/env bash
# T29 call 2 (THERE): the overlapped loop in FlashAttention-3's order
# (85f2d20). Forward suite in four shards beside the captured and varlen
# suites; sanitizers on overlapped kernels; then alone: A/B (A = 85f2d20,
# B = .carry/ab = a08826f) and the d = 128 bar shapes beside cuDNN.
set -u
cd "$(dirname "$0")/.." || exit 2
[[ -f .carry/ab/lib/libflashjit.so.gz && ! -f .carry/ab/lib/libflashjit.so ]] && gzip -dc .carry/ab/lib/libflashjit.so.gz > .carry/ab/lib/libflashjit.so
chmod +x .carry/ab/bin/* 2>/dev/null
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
T0=$SECONDS
say() { echo "[2 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
gt() { # LOG BIN LIMIT [ENV...]
  local log=$1 bin=$2 lim=$3; shift 3
  env "$@" timeout $lim $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log
}
for i in 0 1 2 3; do gt fwd$i forward 140 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
gt captured captured 140 & gt varlen varlen 140 &
wait
for l in fwd0 fwd1 fwd2 fwd3 captured varlen; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -5
done
cat $OUT/t-fwd*.log | grep -E '^\[  FAILED  \] [A-Z]' > $OUT/t-failed.log
rm -f $OUT/t-fwd*.log $OUT/t-varlen.log
W="--block-m 128 --block-n 128 --warps 8 --overlap-softmax"
sanitize "racecheck memcheck" "--head-dim 128 $W --causal --seq-len 300 --seq-len-kv 333 --json" \
  "--head-dim 128 $W --score-mod softcap:30 --seq-len 200 --json"
sanitize "synccheck" "--head-dim 128 $W --seq-len 260 --json"
rm -f $OUT/san.log
say "A/B forward (A = 85f2d20, B = a08826f), TFLOP/s"
FLASHJIT_AB_ROUNDS=3 timeout 200 bash tools/scripts/gpu-ab.sh \
  "--head-dim 128" "--head-dim 128 --causal" "--head-dim 128 --seq-len 1024 --batch 16" \
  "--head-dim 128 --seq-len 4096 --batch 4" "--head-dim 128 --seq-len 1024 --batch 16 --causal" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30 $W" 2>&1 | tail -8
say "d = 128 beside cuDNN"
timeout 120 python3 tests/bench/side_by_side.py --flashjit $C/bin/flashjit --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:4096:n:4 > $OUT/sbs.log 2>&1
grep -A8 "^side-by-side" $OUT/sbs.log
say done
