#!/usr/bin/env bash
# Prepared in T32 (no device lent that session) for the next first call,
# from .carry/ (carry [".carry"]; made by gpu-prepare.sh on main): the
# exp2 emulation's GPU tests and timing (T31's, not yet run), then KV
# blocks of 80 to 176 keys (never run on a GPU; spill-free under ptxas,
# shared memory 180-229 KB): correct first (flashjit run against the
# float64 reference), then against each head dim's default in
# interleaved rounds, and d = 256's other candidates.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
call_header 1
timeout 100 $C/bin/flashjit-forward-gpu-tests --gtest_filter='*Exp2*' --gtest_brief=1 --gtest_color=no > $OUT/t-exp2.log 2>&1
say "exp2 tests: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' $OUT/t-exp2.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-exp2.log | head -4
say "exp2 emulation (TFLOP/s, N 8192)"
FLASHJIT_KNOB_ROUNDS=2 timeout 150 bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_EXP2_EMULATION=2|FLASHJIT_EXP2_EMULATION=4" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30" "--head-dim 128 --seq-len 8192 --score-mod softcap:30 --causal" \
  "--head-dim 128 --seq-len 8192 --score-mod alibi:16" "--head-dim 128 --seq-len 8192" 2>&1 | tail -4 | cut -c1-200
say "wide KV blocks: correctness (flashjit run on the GPU)"
W128="--block-m 128 --warps 8 --stages 2 --overlap-softmax"
W256="--block-m 128 --warps 8 --stages 2"
for t in "128 $W128 --block-n 144" "128 $W128 --block-n 176" "128 $W128 --block-n 176 --persistent --query-tma" "256 $W256 --block-n 80"; do
  d=${t%% *}; tiling=${t#* }
  for p in "--seq-len 1000 --heads 3" "--seq-len 777 --seq-len-kv 1333 --batch 2 --heads 4 --gqa 2 --causal" \
           "--seq-len 4096 --heads 2" "--seq-len 300 --seq-len-kv 2000 --heads 2 --window 100,0"; do
    r=$(timeout 60 $FJ run --device cuda --head-dim $d $p $tiling 2>&1 | grep -oE -- "rel_err [^ ]+|-> [A-Za-z]+|error: .{0,90}" | tr '\n' ' ')
    say "d $d [${tiling#--block-m 128 }] [$p]: $r"
  done
done
say "wide KV blocks against the default (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=3 timeout 200 bash tools/scripts/gpu-knobs.sh \
  "-|$W128 --block-n 144 --persistent --query-tma|$W128 --block-n 176 --persistent --query-tma" \
  "--head-dim 128" "--head-dim 128 --seq-len 1024 --batch 16" "--head-dim 128 --seq-len 4096 --batch 4" 2>&1 | tail -3 | cut -c1-220
FLASHJIT_KNOB_ROUNDS=3 timeout 60 bash tools/scripts/gpu-knobs.sh "-|$W128 --block-n 176" \
  "--head-dim 128 --causal" 2>&1 | tail -1 | cut -c1-200
say "d 256 candidates (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=3 timeout 120 bash tools/scripts/gpu-knobs.sh \
  "-|$W256 --block-n 80|FLASHJIT_PERSISTENT=1|$W256 --block-n 64 --overlap-softmax" \
  "--head-dim 256 --heads 8" "--head-dim 256 --heads 8 --causal" 2>&1 | tail -2 | cut -c1-220
say done
