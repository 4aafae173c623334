#!/usr/bin/env bash
# T37-6 (carry [".carry"], the final build as T37-4; command
# `bash bench/runs/T37-6-prepared.sh`). Issue 13's forward bar table with
# flashjit timed as the peers are: `flashjit bench --cold-l2` (each timed
# launch after a zeroing of twice the L2, as do_bench flushes before the
# peers'), beside cuDNN, two rounds; flashjit-py (the binding under
# do_bench) in the same table.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T37-6
say "forward bars, flashjit with --cold-l2 (TFLOP/s)"
timeout 200 python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --no-flex --rounds 2 \
  --flashjit-args=--cold-l2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:4096:n:4,64:16384:n,64:16384:c,96:16384:n,96:16384:c,256:16384:n,256:16384:c \
  > $OUT/sbs.log 2>&1
grep -A14 "^side-by-side" $OUT/sbs.log | cut -c1-100
say done
