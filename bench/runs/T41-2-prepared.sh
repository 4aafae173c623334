#!/usr/bin/env bash
# T41-2 (carry [".carry"]; command `bash bench/runs/T41-2-prepared.sh`):
# dq_accum in quad order is now the default (T41-1: d 128 -9.0%, causal
# -8.2%, window -6.3%, d 96 -19.7% backward time), and mma.sync's dK/dV
# kernel (d 64's default 128 x 128 tiling) adds quads too (new, never run):
# float64 checks where each path runs, memcheck of the mma.sync quads,
# the backward, captured and varlen suites, d 64 and d 128 timed against
# column order (two rounds), then variants.py with every variant.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T41-2
for a in "--head-dim 64 --seq-len 2048" "--head-dim 64 --causal --seq-len 300 --seq-len-kv 1000 --gqa 2" \
  "--head-dim 48 --seq-len 900 --window 100,20" "--head-dim 100 --seq-len 700" "--head-dim 128 --seq-len 1500 --block-sparse 0.3" \
  "--head-dim 64 --seq-len 1000 --deterministic"; do
  say "$a: $(check_json --heads 4 --backward $a)"
done
sanitize memcheck "--head-dim 64 --heads 2 --seq-len 700 --seq-len-kv 900 --causal --backward"
_s() { timeout 150 $C/bin/flashjit-$1-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$1.log 2>&1; echo "exit $?" >> $OUT/t-$1.log; }
_s backward & _s captured & _s varlen & wait
for l in backward captured varlen; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
ms() { bench_env "$A" "$@" | ms_of; }
for r in 1 2; do
  A="--head-dim 64 --seq-len 8192 --heads 16 --backward"
  say "round $r d 64 backward ms: quads(default) $(ms X=1) columns $(ms FLASHJIT_DQ_QUAD_ORDER=0)"
  A="--head-dim 128 --seq-len 8192 --heads 16 --backward"
  say "round $r d 128 backward ms: quads(default) $(ms X=1) columns $(ms FLASHJIT_DQ_QUAD_ORDER=0)"
done
left=$((330 - (SECONDS - CALL_T0)))
if ((left > 70)); then
  timeout $left python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A40 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
say done
