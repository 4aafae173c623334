#!/usr/bin/env bash
# T35-2: the backward's tilings and knobs where it trails FlexAttention
# (variants.py in T35-1: window 1.13x, document 1.13x, plain 1.01x slower):
# `tune --backward` on each shape (its table), the ring / bulk-dQ knobs,
# and the document mask's backward from the CLI (kernel time alone).
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
call_header 2
left() { (( SECONDS - CALL_T0 < $1 )); }
python3 - <<'PY'
import numpy as np
n, lengths, k = 8192, [], 0
while sum(lengths) < n:
    lengths.append(min(1024 + 1024 * (k % 3), n - sum(lengths))); k += 1
np.save("/tmp/seg.npy", np.repeat(np.arange(len(lengths)), lengths).astype(np.float32))
PY
P="--head-dim 128 --seq-len 8192 --batch 1 --heads 16 --backward"
declare -A CASES=([plain]="" [causal]="--causal" [window]="--window 1024,0"
  [document]="--mask-mod document --capture /tmp/seg.npy --mask-blocks")
for c in window document plain causal; do
  left 330 || break
  say "tune --backward $c"
  timeout 120 $FJ tune $P ${CASES[$c]} > $OUT/tune-$c.log 2>&1; echo "exit $?"
  grep -v "^\s*$" $OUT/tune-$c.log | tail -14 | cut -c1-150
done
left 420 && {
say "knobs (backward TFLOP/s, N 8192): default | Q/dO ring 2 | bulk dQ | split commits off"
FLASHJIT_KNOB_ROUNDS=2 timeout 150 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_BWD_RING=2|FLASHJIT_BULK_DQ=1|FLASHJIT_BWD_SPLIT_COMMITS=0" \
  "$P --window 1024,0" "$P" 2>&1 | tail -2 | cut -c1-220
}
left 500 && {
say "ncu: the plain backward's dK/dV kernel, warp states"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[[ -n $ncu ]] && timeout 80 $ncu --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis -k regex:main -c 1 \
  $FJ bench $P --repeats 1 > $OUT/ncu.log 2>&1; echo "ncu exit $?"
grep -E "Stall|Issued|Eligible|Active Warps|No Eligible|Executed Ipc|Pipe|Warp Cycles" $OUT/ncu.log | head -30 | cut -c1-130
}
say done
