#!/usr/bin/env bash
# T35-3 (carry [".carry"], the library of this tree: the block-sparse
# backward given the layout's KV-major transpose by the Python BlockMask,
# flashjit_backward_kv_major, no host round trip):
# (1) the torch GPU tests of block masks, CUDA graphs and the layout's
# checks; (2) variants.py document / window / plain beside flex; (3) the
# backward's tilings where it trails flex: `tune --backward` tables (window,
# document, plain) and the ring / bulk-dQ knobs; (4) ncu warp states of the
# plain dK/dV kernel; (5) softcap's forward by the share of exp2 emulated.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 3
left() { (( SECONDS - CALL_T0 < $1 )); }
say "torch GPU tests: block masks, graphs"
timeout 110 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py python/tests/test_torch_ops.py \
  python/tests/test_torch_captured_gpu.py -k "block or graph or layout or mask or document" 2>&1 | tail -3 | cut -c1-200
say "variants beside FlexAttention (ms)"
timeout 90 python3 tests/bench/variants.py --variants plain,document,window > $OUT/var.log 2>&1
tail -5 $OUT/var.log | cut -c1-170
python3 - <<'PY'
import numpy as np
n, lengths, k = 8192, [], 0
while sum(lengths) < n:
    lengths.append(min(1024 + 1024 * (k % 3), n - sum(lengths))); k += 1
np.save("/tmp/seg.npy", np.repeat(np.arange(len(lengths)), lengths).astype(np.float32))
PY
P="--head-dim 128 --seq-len 8192 --batch 1 --heads 16 --backward"
declare -A CASES=([plain]="" [window]="--window 1024,0"
  [document]="--mask-mod document --capture /tmp/seg.npy --mask-blocks")
for c in window document; do
  left 260 || break
  say "tune --backward $c"
  timeout 75 $FJ tune $P ${CASES[$c]} > $OUT/tune-$c.log 2>&1; echo "exit $?"
  grep -v "^\s*$" $OUT/tune-$c.log | tail -12 | cut -c1-150
done
left 0 && {
say "knobs (backward TFLOP/s, N 8192): default | Q/dO ring 2 | bulk dQ"
FLASHJIT_KNOB_ROUNDS=2 timeout 110 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_BWD_RING=2|FLASHJIT_BULK_DQ=1" \
  "$P --window 1024,0" "$P" 2>&1 | tail -2 | cut -c1-220
}
left 340 && {
say "softcap:30 forward, N 8192 (TFLOP/s): exp2 emulation 0 | 1 | 3 | 4 eighths"
F="--head-dim 128 --seq-len 8192 --batch 1 --heads 16 --score-mod softcap:30"
FLASHJIT_KNOB_ROUNDS=2 timeout 80 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_EXP2_EMULATION=1|FLASHJIT_EXP2_EMULATION=3|FLASHJIT_EXP2_EMULATION=4" \
  "$F" "$F --causal" 2>&1 | tail -2 | cut -c1-220
}
left 0 && {
say "ncu: the plain backward's dK/dV kernel"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[[ -n $ncu ]] && timeout 60 $ncu --section WarpStateStats --section SchedulerStats -k regex:main -c 1 \
  $FJ bench $P --repeats 1 > $OUT/ncu.log 2>&1; echo "ncu exit $?"
grep -E "Stall|Issued|Eligible|No Eligible|Warp Cycles" $OUT/ncu.log | head -24 | cut -c1-130
}
say done
