#!/usr/bin/env bash
# T39-4 (carry [".carry"], the build of T39's last commit; command `bash
# bench/runs/T39-4-prepared.sh`). FLASHJIT_BWD_STAGED_STORES=1 (opt-in,
# not yet run on a GPU): the backward's dK/dV kernel stores dK and dV
# through V's dead slot with 16-byte stores in place of 128 two-byte
# stores a thread. Against float64 (plain, causal with KV blocks that see
# no query, GQA, d 64, dqk != dv, a window, block-sparse, deterministic),
# racecheck and memcheck, the backward suite with it, then the backward's
# time with and without it (CLI, two rounds; variants.py's plain, window
# and document beside FlexAttention).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T39-4
export FLASHJIT_BWD_STAGED_STORES=1
for a in "--head-dim 128 --seq-len 2048" "--head-dim 128 --causal --seq-len 300 --seq-len-kv 1000" "--head-dim 128 --gqa 4 --heads 8 --seq-len 777" "--head-dim 64 --seq-len 1500 --window 200,0" "--head-dim 96 --head-dim-v 64 --seq-len 900" "--head-dim 128 --block-sparse 0.3 --seq-len 1024" "--head-dim 128 --deterministic --seq-len 600" "--head-dim 128 --score-mod softcap:30 --causal --seq-len 1000"; do
  say "staged backward $a: $(check_json --heads 4 --backward $a)"
done
sanitize "racecheck memcheck" "--head-dim 128 --heads 2 --seq-len 700 --seq-len-kv 900 --causal --backward"
timeout 250 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd.log 2>&1; echo "exit $?" >> $OUT/bwd.log
say "backward suite (staged): $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd.log | head -6
A="--head-dim 128 --seq-len 8192 --heads 16 --backward --json"
for r in 1 2; do
  for v in 0 1; do
    say "round $r staged=$v backward ms: plain $(FLASHJIT_BWD_STAGED_STORES=$v timeout 60 $FJ bench $A 2>/dev/null | ms_of) causal $(FLASHJIT_BWD_STAGED_STORES=$v timeout 60 $FJ bench $A --causal 2>/dev/null | ms_of) window $(FLASHJIT_BWD_STAGED_STORES=$v timeout 60 $FJ bench $A --window 1024,0 2>/dev/null | ms_of)"
  done
done
for v in 0 1; do
  say "variants.py, FLASHJIT_BWD_STAGED_STORES=$v:"
  FLASHJIT_BWD_STAGED_STORES=$v variants_table staged$v --variants plain,window,document
done
say done
