#!/usr/bin/env bash
# Runs THERE (after gpu-run.sh unpacked .carry/): times tile configs with
# `flashjit bench` and prints one line per (head dim, config). The data
# behind defaultGpuConfig() until the autotuner replaces it.
#   FLASHJIT_SWEEP="D:BR:BC:W ..."   configs (default: a set per head dim)
#   FLASHJIT_SWEEP_ARGS="..."        problem flags (default N=16K, B=1, H=16)
set -u
cd "$(dirname "$0")/../.." || exit 2
FJ=.carry/bin/flashjit
args=${FLASHJIT_SWEEP_ARGS:---seq-len 16384 --batch 1 --heads 16}
sweep=${FLASHJIT_SWEEP:-"128:128:64:4 128:128:32:4 128:64:64:4 128:128:64:8 128:64:32:4 64:128:64:4 64:128:128:4 64:64:64:4 96:128:64:4 96:128:32:4 96:64:64:4 256:64:64:4 256:64:32:4 256:128:32:8"}
printf '%-5s %-14s %8s %9s %5s %6s\n' d config ms TFLOP/s regs spill
for c in $sweep; do
  IFS=: read -r d br bc w <<<"$c"
  out=$($FJ bench --head-dim "$d" --block-m "$br" --block-n "$bc" --warps "$w" \
        $args ${FLASHJIT_SWEEP_EXTRA:-} --repeats 10 --json 2>/dev/null)
  python3 - "$d" "$br" "$bc" "$w" "$out" <<'PY'
import json, sys
d, br, bc, w, out = sys.argv[1:6]
try:
    r = json.loads(out)
    print(f"{d:<5} {br}x{bc}x{w}w{'':<5} {r['time_ms']:8.3f} {r['tflops']:9.1f} "
          f"{r['registers']:5} {r['spill_bytes']:6} {'' if r['ok'] else 'WRONG'}")
except Exception:
    print(f"{d:<5} {br}x{bc}x{w}w  failed: {out[-200:]!r}")
PY
done
