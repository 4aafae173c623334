#!/usr/bin/env bash
# T38-1 (prepared in T37; carry [".carry"] rebuilt from main; command
# `bash bench/runs/T38-1-prepared.sh`). Issue 14's backward bars: T37-8
# found variants.py's backward ((fwd + bwd) - fwd) 0.14-0.16 ms above the
# CLI's timing of the same kernels (plain 3.489 against 3.333 ms), with
# flex in between (3.414). variants.py now also times the backward alone
# (autograd.grad on a retained graph, both sides); the CLI's figures beside
# it, warm and with --cold-l2.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T38-1
timeout 240 python3 tests/bench/variants.py --variants plain,document,window,softcap,alibi \
  --json $OUT/variants.json > $OUT/var.log 2>&1
grep -A20 '^variants, bf16' $OUT/var.log | cut -c1-170
A="--head-dim 128 --seq-len 8192 --heads 16 --backward --json"
ms() { tail -1 | python3 -c 'import json,sys
try: print(json.loads(sys.stdin.read())["time_ms"])
except Exception: print("fail")'; }
say "CLI plain backward ms: warm $(timeout 40 $FJ bench $A 2>/dev/null | ms), cold-l2 $(timeout 40 $FJ bench $A --cold-l2 2>/dev/null | ms)"
D="--mask-mod document --capture bench/runs/T37-7-seg8192.npy --mask-blocks"
say "CLI document backward ms: warm $(timeout 40 $FJ bench $A $D 2>/dev/null | ms), cold-l2 $(timeout 40 $FJ bench $A $D --cold-l2 2>/dev/null | ms)"
say done
