#!/usr/bin/env bash
# T37-4 (carry [".carry"], this session's final build: Bc 80 past d = 128,
# flashjit._fastcall, compile's target tiling; command
# `bash bench/runs/T37-4-prepared.sh`). Issue 13's bars in one call with
# this build: the forward bar table beside cuDNN (two rounds), then
# decode.py (the decode bars); then the per-call overhead (issue 15).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T37-4
left() { (( SECONDS - CALL_T0 < $1 )); }
say "issue 13's forward bars beside cuDNN (TFLOP/s)"
forward_bars 170
say "decode"
timeout 170 python3 -u tests/bench/decode.py --flashjit $FJ --out $OUT/decode.json > $OUT/decode.log 2>&1
tail -8 $OUT/decode.log | cut -c1-180
left 480 && {
say "overhead (host us a call)"
timeout 100 python3 tests/bench/overhead.py --calls 1000 --rounds 3 \
  --plan-bench $C/bin/flashjit-plan-bench --json $OUT/overhead.json > $OUT/overhead.log 2>&1
sed -n '/^path/,$p' $OUT/overhead.log | head -20 | cut -c1-110
}
say done
