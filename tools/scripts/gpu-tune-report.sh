#!/usr/bin/env bash
# Runs THERE (after gpu-run.sh unpacked .carry/): for each head dim, tunes a
# new shape class in a fresh cache (`flashjit tune --json`), then starts a
# second process from that cache. Prints the winner, its speed-up over the
# heuristic default (the first candidate of every tuning table), the tuning
# time, and the warm start (flashjit's own time to a loadable cubin).
#   FLASHJIT_TUNE_DIMS="64 96 128 256"   FLASHJIT_TUNE_ARGS="--seq-len 16384 --heads 16"
set -u
cd "$(dirname "$0")/../.." || exit 2
FJ=.carry/bin/flashjit
dims=${FLASHJIT_TUNE_DIMS:-"64 96 128 256"}
args=${FLASHJIT_TUNE_ARGS:---seq-len 16384 --batch 1 --heads 16}
for extra in "" "--causal"; do
  for d in $dims; do
    dir=$(mktemp -d /tmp/flashjit-tune.XXXXXX)
    t0=$(date +%s.%N)
    tuned=$(FLASHJIT_CACHE_DIR=$dir $FJ tune --head-dim "$d" $extra $args --json 2>/dev/null)
    t1=$(date +%s.%N)
    warm=$(FLASHJIT_CACHE_DIR=$dir $FJ run --device cuda --head-dim "$d" $extra $args --json 2>/dev/null)
    python3 - "$d" "$extra" "$tuned" "$warm" "$t0" "$t1" <<'PY'
import json, sys
d, extra, tuned, warm, t0, t1 = sys.argv[1:7]
wall = float(t1) - float(t0)
try:
    t, w = json.loads(tuned), json.loads(warm)
    cands = [c for c in t["candidates"] if c["ms"] is not None]
    heur = t["candidates"][0]
    best = min(cands, key=lambda c: c["ms"])
    b = best["config"]
    print(f"d={d:>3} {extra or '':8} winner {b['block_m']}x{b['block_n']}x{b['warps']}w "
          f"{best['ms']:.3f} ms (regs {best['registers']}, spill {best['spill_bytes']}) | "
          f"heuristic {heur['config']['block_m']}x{heur['config']['block_n']}x{heur['config']['warps']}w "
          f"{heur['ms'] or float('nan'):.3f} ms -> x{(heur['ms'] or 0) / best['ms']:.3f} | "
          f"{len(t['candidates'])} candidates, compile {t['tune_compile_s']:.1f} s + timing "
          f"{t['tune_time_s']:.1f} s, whole tune process {float(wall):.1f} s | "
          f"warm start: cache {w['cache']}, config {w['config_source']}, "
          f"prepare {w['prepare_ms']:.2f} ms, module load {w['module_load_ms']:.2f} ms, "
          f"ok={w['ok']}")
except Exception as e:
    print(f"d={d} {extra}: failed ({e}): {tuned[-300:]!r} {warm[-200:]!r}")
PY
    rm -rf "$dir"
  done
done
