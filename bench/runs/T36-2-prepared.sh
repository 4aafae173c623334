#!/usr/bin/env bash
# T36-2 (carry [".carry"]; command `bash bench/runs/T36-2-prepared.sh`):
# where the backward's time goes where it trails FlexAttention on the H200
# (plain 1.01x, window 1.13x, document 1.13x in T35): each kernel of one
# `flashjit bench --backward` (the forward, then the preprocess, the dK/dV
# kernel and the dQ conversion) timed by ncu (gpu__time_duration, caches
# flushed between kernels), N 8192, H 16, d 128; then the dK/dV kernel's
# warp states for the document and plain. Tests the fixed-cost hypothesis
# of bench/NOTES.md T35 (preprocess + conversion ~50 us; one program per
# SM at 255 registers); then, time left, issue 13's forward bar table
# (side_by_side.py beside cuDNN, two rounds). The dK/dV kernel shares its entry name
# ("attention") with the forward, which runs first: --launch-skip 1.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header 2
left() { (( SECONDS - CALL_T0 < $1 )); }
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[[ -n $ncu ]] || { say "no ncu"; exit 0; }
python3 -c "
import numpy as np
n, L, k = 8192, [], 0
while sum(L) < n:
    L.append(min(1024 + 1024 * (k % 3), n - sum(L))); k += 1
np.save('/tmp/seg.npy', np.repeat(np.arange(len(L)), L).astype(np.float32))"
P="--head-dim 128 --seq-len 8192 --batch 1 --heads 16 --backward --repeats 1"
declare -A CASES=([plain]="" [window]="--window 1024,0"
  [document]="--mask-mod document --capture /tmp/seg.npy --mask-blocks")
for c in plain window document; do
  left 300 || break
  say "kernel times (us), $c"
  timeout 120 $ncu --metrics gpu__time_duration.sum --csv --launch-count 12 \
    $FJ bench $P ${CASES[$c]} > $OUT/ncu-$c.csv 2>/dev/null
  python3 - "$OUT/ncu-$c.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("  no rows"); sys.exit()
head = rows[0]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
for r in rows[1:]:
    if r[mi] == "gpu__time_duration.sum":
        print(f"  {r[ki][:40]:40s} {float(r[vi].replace(',', '')) / 1e3:9.1f}")
PY
done
left 330 && {
say "issue 13's forward bars beside cuDNN (TFLOP/s)"
forward_bars 240
}
for c in document plain; do
  left 480 || break
  say "dK/dV kernel warp states, $c"
  timeout 90 $ncu --section WarpStateStats --section SchedulerStats -k regex:'^attention$' --launch-skip 1 -c 1 \
    $FJ bench $P ${CASES[$c]} > $OUT/ncu-ws-$c.log 2>&1
  grep -E "Stall|Issued Warp|Eligible|No Eligible|Warp Cycles Per Issued" $OUT/ncu-ws-$c.log | head -14 | cut -c1-120
done
say done
