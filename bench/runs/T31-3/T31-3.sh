#!/usr/bin/env bash
# T31 call 3 (THERE): build 2d04fbd. 1) the GPU suites with every ring forward
# persistent and Q by TMA (FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv); 2) the knobs
# (default, persistent, persistent + Q by TMA) on issue 13's other bar shapes.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
T0=$SECONDS
say() { echo "[3 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
echo "build: $(sed -n 2p .carry/MANIFEST.txt)"
gt() { local log=$1 bin=$2; shift 2
  env FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv "$@" timeout 150 $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log; }
for i in 0 1 2 3; do gt fwd$i forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
gt captured captured & gt varlen varlen & gt runtime runtime &
wait
for l in fwd0 fwd1 fwd2 fwd3 captured varlen runtime; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
mkdir -p $OUT/fail; for l in fwd0 fwd1 fwd2 fwd3 captured varlen runtime; do grep -q "FAILED  \] [A-Z]" $OUT/t-$l.log && grep -B30 "^\[  FAILED  \] [A-Z]" $OUT/t-$l.log | head -80 > $OUT/fail/$l.txt; done
rm -f $OUT/t-*.log
say "knobs (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout 330 bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_PERSISTENT=1|FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv" \
  "--head-dim 128" "--head-dim 128 --causal" "--head-dim 128 --seq-len 1024 --batch 16 --causal" \
  "--head-dim 128 --seq-len 4096 --batch 4 --causal" \
  "--head-dim 64 --heads 32" "--head-dim 64 --heads 32 --causal" "--head-dim 96 --heads 21" "--head-dim 96 --heads 21 --causal" \
  "--head-dim 256 --heads 8" "--head-dim 256 --heads 8 --causal" 2>&1 | tail -11 | cut -c1-200
say done
