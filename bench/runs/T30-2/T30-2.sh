#!/usr/bin/env bash
# T30 probe: plain N16K A/B, ncu A/B, N1K B16 knobs on A.
cd "$(dirname "$0")/.." || exit 2
if [[ -f .carry/ab/lib/libflashjit.so.gz && ! -f .carry/ab/lib/libflashjit.so ]]; then
  gzip -dc .carry/ab/lib/libflashjit.so.gz >.carry/ab/lib/libflashjit.so
fi
chmod +x .carry/ab/bin/* .carry/bin/* 2>/dev/null
source tools/scripts/gpu-env.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "gmma metrics:"; $NCU --query-metrics --chip gh100 2>/dev/null | grep -i -E "gmma|pipe_tensor" | awk '{print $1}' | head -12
FLASHJIT_AB_ROUNDS=4 timeout 200 bash tools/scripts/gpu-ab.sh "--head-dim 128" "--head-dim 128 --seq-len 1024 --batch 16" 2>&1 | tail -2
timeout 200 bash tools/scripts/gpu-ab-profile.sh "--head-dim 128" "--head-dim 128 --seq-len 1024 --batch 16" 2>&1 | tail -4
cache=$(mktemp -d)
t() { FLASHJIT_CACHE_DIR=$cache env "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tflops"])' 2>/dev/null || echo fail; }
P="bench --batch 16 --heads 16 --seq-len 1024 --head-dim 128 --json"
W="--block-m 128 --block-n 128 --warps 8 --overlap-softmax"
for r in 1 2 3; do
  line="round $r:"
  line+=" default=$(t .carry/bin/flashjit $P)"
  for pp in 0 2; do line+=" pp$pp=$(t FLASHJIT_PING_PONG=$pp .carry/bin/flashjit $P)"; done
  line+=" st3=$(t .carry/bin/flashjit $P $W --stages 3)"
  line+=" st1=$(t .carry/bin/flashjit $P $W --stages 1)"
  line+=" bn64=$(t .carry/bin/flashjit $P --block-m 128 --block-n 64 --warps 8 --overlap-softmax)"
  echo "$line"
done
