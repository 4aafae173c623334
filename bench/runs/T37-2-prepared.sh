#!/usr/bin/env bash
# T37-2 (carry [".carry"], main at b354b89; command
# `bash bench/runs/T37-2-prepared.sh`). d 256 at N 16K, H 8 (T37-1: 695
# against cuDNN's 697, the thinnest bar): the default (128 x 64 overlapped)
# against Bc 80, persistent with Q by TMA (Bc 64, 80) and O by TMA, full and
# causal, two interleaved rounds; then the pieces of the eager Python call
# (issue 15: 13.8 us against the bar of 10).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T37-2
T="--block-m 128 --warps 8 --stages 2 --overlap-softmax"
cfgs=("" "$T --block-n 64" "$T --block-n 80" "$T --block-n 64 --persistent --query-tma"
      "$T --block-n 80 --persistent --query-tma" "$T --block-n 64 --output-tma" "$T --block-n 96")
names=(default bc64 bc80 bc64-pers-qtma bc80-pers-qtma bc64-qkvo bc96)
for m in "" --causal; do
  declare -A res=()
  for r in 1 2; do
    for i in "${!cfgs[@]}"; do
      res[$i]+=" $(timeout 40 $FJ bench --head-dim 256 $m --seq-len 16384 --batch 1 --heads 8 ${cfgs[$i]} --json 2>$OUT/err.txt | tflops_of)"
    done
  done
  for i in "${!cfgs[@]}"; do say "d 256 ${m:-full} ${names[$i]}:${res[$i]}"; done
  unset res
done
head -c 300 $OUT/err.txt
say "overhead parts (host us)"
timeout 150 python3 tests/bench/overhead.py --calls 1000 --rounds 3 --parts \
  --plan-bench $C/bin/flashjit-plan-bench > $OUT/overhead.log 2>&1
sed -n '/^path/,$p' $OUT/overhead.log | head -40 | cut -c1-110
say done
