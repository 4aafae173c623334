#!/usr/bin/env bash
# Prepared in T32 (no device lent that session) for the next first call,
# from .carry/ (carry [".carry"]; made by gpu-prepare.sh on main). Never
# run on a GPU before: (1) the causal persistent kernel's tile schedule
# (kernels/TileSchedule.h, opt-in: FLASHJIT_TILE_SCHEDULE=1): its GPU
# tests and sanitizers, then against one tile per program and against the
# fixed stride (the persistent kernel without the variable);
# (2) KV blocks of 144 to 176 keys at d = 128 and 80 at d = 256
# (spill-free under ptxas, 180-229 KB of shared memory): correct first,
# then against the defaults.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
call_header 1
FLASHJIT_TILE_SCHEDULE=1 timeout 170 $C/bin/flashjit-forward-gpu-tests --gtest_filter='*Persistent*:*Stride*' \
  --gtest_brief=1 --gtest_color=no > $OUT/t-sched.log 2>&1
say "persistent / stride tests: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' $OUT/t-sched.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-sched.log | head -6
FLASHJIT_PERSISTENT=1 FLASHJIT_TILE_SCHEDULE=1 sanitize "racecheck memcheck" \
  "--head-dim 128 --causal --seq-len 1000 --seq-len-kv 1100 --batch 2 --heads 40 --json" \
  "--head-dim 128 --causal --overlap-softmax --block-m 128 --block-n 128 --warps 8 --gqa 4 --heads 64 --seq-len 700 --json"
say "causal: tile schedule against one tile per program and the stride (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=3 timeout 150 bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_PERSISTENT=1 FLASHJIT_TILE_SCHEDULE=1|FLASHJIT_PERSISTENT=1" \
  "--head-dim 128 --causal" "--head-dim 128 --causal --seq-len 1024 --batch 16" \
  "--head-dim 128 --causal --seq-len 4096 --batch 4" 2>&1 | tail -3 | cut -c1-220
say "wide KV blocks: correctness (flashjit run on the GPU)"
W128="--block-m 128 --warps 8 --stages 2 --overlap-softmax"
W256="--block-m 128 --warps 8 --stages 2"
for t in "128 $W128 --block-n 144" "128 $W128 --block-n 176 --persistent --query-tma" "256 $W256 --block-n 80"; do
  d=${t%% *}; tiling=${t#* }
  for p in "--seq-len 1000 --heads 3" "--seq-len 777 --seq-len-kv 1333 --batch 2 --heads 4 --gqa 2 --causal" \
           "--seq-len 300 --seq-len-kv 2000 --heads 2 --window 100,0"; do
    r=$(timeout 60 $FJ run --device cuda --head-dim $d $p $tiling 2>&1 | grep -oE -- "rel_err [^ ]+|-> [A-Za-z]+|error: .{0,90}" | tr '\n' ' ')
    say "d $d [${tiling#--block-m 128 }] [$p]: $r"
  done
done
say "wide KV blocks against the default (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout 150 bash tools/scripts/gpu-knobs.sh \
  "-|$W128 --block-n 144 --persistent --query-tma|$W128 --block-n 176 --persistent --query-tma" \
  "--head-dim 128" "--head-dim 128 --seq-len 1024 --batch 16" "--head-dim 128 --seq-len 4096 --batch 4" 2>&1 | tail -3 | cut -c1-220
FLASHJIT_KNOB_ROUNDS=2 timeout 60 bash tools/scripts/gpu-knobs.sh "-|$W256 --block-n 80" \
  "--head-dim 256 --heads 8" 2>&1 | tail -1 | cut -c1-200
say done
