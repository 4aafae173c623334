#!/usr/bin/env bash
# T33-A (prepared in T33; T32's T33-1 and T33-2 merged by priority, each
# step skipped once the call nears its 600 s): (1) issue 13's forward bar
# table beside cuDNN; (2) the causal persistent kernel's tile schedule
# (FLASHJIT_TILE_SCHEDULE=1): its GPU tests, sanitizers, and against one
# tile per program and the stride; (3) the exp2 emulation's tests and
# timing on softcap.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
call_header A
left() { (( SECONDS - CALL_T0 < $1 )); }
say "forward bars beside cuDNN"
timeout 170 python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:4096:n:4,64:16384:n,64:16384:c,96:16384:n,96:16384:c,256:16384:n,256:16384:c \
  > $OUT/sbs.log 2>&1
grep -A14 "^side-by-side" $OUT/sbs.log | cut -c1-100
left 300 && {
FLASHJIT_TILE_SCHEDULE=1 timeout 90 $C/bin/flashjit-forward-gpu-tests --gtest_filter='*Persistent*:*Stride*' \
  --gtest_brief=1 --gtest_color=no > $OUT/t-sched.log 2>&1
say "persistent / stride tests: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' $OUT/t-sched.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-sched.log | head -6
FLASHJIT_PERSISTENT=1 FLASHJIT_TILE_SCHEDULE=1 sanitize "racecheck memcheck" \
  "--head-dim 128 --causal --seq-len 1000 --seq-len-kv 1100 --batch 2 --heads 40 --json"
}
left 400 && {
say "causal: tile schedule | one tile per program | the stride (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout 120 bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_PERSISTENT=1 FLASHJIT_TILE_SCHEDULE=1|FLASHJIT_PERSISTENT=1" \
  "--head-dim 128 --causal" "--head-dim 128 --causal --seq-len 1024 --batch 16" \
  "--head-dim 128 --causal --seq-len 4096 --batch 4" 2>&1 | tail -3 | cut -c1-220
}
left 470 && {
P="FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv"
for m in "--score-mod alibi:16 --causal" "--score-mod softcap:30"; do
  r=$(env $P timeout 40 $FJ run --device cuda --head-dim 128 $m --seq-len 777 --seq-len-kv 1333 --batch 2 --heads 4 --gqa 2 2>&1 | grep -oE -- "rel_err [^ ]+|-> [A-Za-z]+|error: .{0,90}" | tr '\n' ' ')
  say "persistent + Q by TMA, $m: $r"
done
r=$(FLASHJIT_EXP2_EMULATION=2 timeout 40 $FJ run --device cuda --head-dim 128 --score-mod softcap:30 --causal --seq-len 777 --seq-len-kv 1333 --batch 2 --heads 4 --gqa 2 2>&1 | grep -oE -- "rel_err [^ ]+|-> [A-Za-z]+|error: .{0,90}" | tr '\n' ' ')
say "exp2 2/8, softcap causal: $r"
say "variants at N 8192: default | persistent + Q by TMA | that + exp2 2/8 | exp2 2/8 (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout $((585 - SECONDS + CALL_T0)) bash tools/scripts/gpu-knobs.sh \
  "-|$P|$P FLASHJIT_EXP2_EMULATION=2|FLASHJIT_EXP2_EMULATION=2" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30" "--head-dim 128 --seq-len 8192 --score-mod alibi:16" \
  "--head-dim 128 --seq-len 8192" 2>&1 | tail -3 | cut -c1-240
}
say done
