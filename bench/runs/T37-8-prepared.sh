#!/usr/bin/env bash
# T37-8 (carry [".carry"], this session's final build; command
# `bash bench/runs/T37-8-prepared.sh`). Where the document backward's time
# goes from Python: variants.py (plain, document; ms, flex in the same run)
# beside the CLI's own timing of the same kernels (T37-7: document backward
# 0.908 ms by `flashjit bench --backward`, where variants.py read 1.017 in
# T36).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T37-8
timeout 150 python3 tests/bench/variants.py --variants plain,document > $OUT/var.log 2>&1
tail -6 $OUT/var.log | cut -c1-170
A="--head-dim 128 --seq-len 8192 --heads 16 --json"
say "CLI plain backward ms: $(timeout 40 $FJ bench $A --backward 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["time_ms"])')"
say done
