#!/usr/bin/env bash
# T36-5 (carry [".carry"], command `bash bench/runs/T36-5-prepared.sh`): the
# tiling switches alone (--output-tma, --persistent, --overlap-softmax,
# --query-tma) on the device default tiling (CliOptions::tilingSwitchesOnly):
# the config each `run` took, its tensor maps and check; then d 96 N 16K
# with and without --output-tma, two rounds.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
show() { python3 -c 'import json,sys
t=sys.stdin.read().strip().splitlines()
try:
  j=json.loads(t[-1]); print({k: j.get(k) for k in ("config", "tensor_maps", "kv_ring", "rel_err", "ok", "tflops")})
except Exception: print("not json:", " | ".join(t[-2:])[:300])'; }
for a in "--head-dim 96 --seq-len 1000 --heads 3 --output-tma" "--head-dim 128 --seq-len 1000 --heads 3 --persistent" \
         "--head-dim 96 --seq-len 1000 --heads 3 --overlap-softmax" "--head-dim 64 --seq-len 777 --heads 3 --causal --query-tma"; do
  echo "run $a"; timeout 40 $FJ run --device cuda $a --json 2>&1 | show; echo "  exit ${PIPESTATUS[0]}"
done
for r in 1 2; do for f in "" "--output-tma"; do echo "bench d96 N16K $f: $(timeout 40 $FJ bench --head-dim 96 --seq-len 16384 --heads 21 $f --json 2>/dev/null | tflops_of)"; done; done
