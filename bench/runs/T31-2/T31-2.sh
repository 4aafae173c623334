#!/usr/bin/env bash
# T31 call 2 (THERE): the merged main (t30-next + main). 1) knobs at the
# short shapes: the persistent kernel, and persistent with Q by TMA (Q's slot
# refilled for the next tile, O staged through its own slot); 2) issue 13's
# forward bar table beside cuDNN and sdpa-flash; 3) the decode bars.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
T0=$SECONDS
say() { echo "[2 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
echo "build: $(sed -n 2p .carry/MANIFEST.txt)"
FJ=$C/bin/flashjit
say "knobs (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=3 timeout 170 bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_PERSISTENT=1|FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv" \
  "--head-dim 128 --seq-len 1024 --batch 16" "--head-dim 128 --seq-len 4096 --batch 4" 2>&1 | tail -3
say "forward bars beside cuDNN"
timeout 260 python3 tests/bench/side_by_side.py --flashjit $FJ --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:1024:c:16,128:4096:n:4,64:16384:n,64:16384:c,96:16384:n,96:16384:c,256:16384:n,256:16384:c \
  > $OUT/sbs.log 2>&1
grep -A13 "^side-by-side" $OUT/sbs.log | cut -c1-90
say "decode"
timeout 120 python3 tests/bench/decode.py --flashjit $FJ --rounds 2 \
  --cases 16:32:4:1:32768:128,1:32:4:1:131072:128 > $OUT/decode.log 2>&1
tail -6 $OUT/decode.log | cut -c1-160
say done
