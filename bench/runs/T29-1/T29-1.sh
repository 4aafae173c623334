#!/usr/bin/env bash
# T29 call 1 (THERE): T28's untimed changes on the GPU. Forward suite in
# four shards beside the captured suite; then alone: A/B (A = a08826f,
# B = .carry/ab = 488b922: without the softcap folds, ALiBi's fma and the
# unscaled first MMA), the document mask's host profile, the decode under
# --cold-l2, and the short shapes beside cuDNN.
set -u
cd "$(dirname "$0")/.." || exit 2
[[ -f .carry/ab/lib/libflashjit.so.gz && ! -f .carry/ab/lib/libflashjit.so ]] && gzip -dc .carry/ab/lib/libflashjit.so.gz > .carry/ab/lib/libflashjit.so
chmod +x .carry/ab/bin/* 2>/dev/null
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
T0=$SECONDS
say() { echo "[1 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
gt() { # LOG BIN LIMIT [ENV...]
  local log=$1 bin=$2 lim=$3; shift 3
  env "$@" timeout $lim $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log
}
for i in 0 1 2 3; do gt fwd$i forward 140 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
gt captured captured 140 &
wait
for l in fwd0 fwd1 fwd2 fwd3 captured; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -5
done
say "A/B forward (A = a08826f, B = 488b922), TFLOP/s"
FLASHJIT_AB_ROUNDS=2 timeout 150 bash tools/scripts/gpu-ab.sh \
  "--head-dim 128" "--head-dim 128 --causal" "--head-dim 128 --seq-len 1024 --batch 16" \
  "--head-dim 128 --seq-len 8192 --score-mod alibi:16" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30" 2>&1 | tail -7
say "document mask host profile"
timeout 85 bash tools/scripts/gpu-host-profile.sh > $OUT/host.log 2>&1
head -60 $OUT/host.log | cut -c1-150
say "decode, cold L2"
timeout 80 python3 tests/bench/decode.py --rounds 2 --cases 1:32:4:1:131072:128,16:32:4:1:32768:128 --flashjit $C/bin/flashjit > $OUT/decode.log 2>&1
grep -E "^\||TB/s|error" $OUT/decode.log | head -12
say "short shapes beside cuDNN"
timeout 100 python3 tests/bench/side_by_side.py --flashjit $C/bin/flashjit --no-backward --no-flex --rounds 2 \
  --cases 128:1024:n:16,128:1024:c:16,128:4096:n:4 > $OUT/sbs.log 2>&1
grep -E "^\|" $OUT/sbs.log | head -10
say done
