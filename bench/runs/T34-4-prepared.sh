#!/usr/bin/env bash
# T34-4 (carry [".carry"], the T34-B build): why the window forward
# (1024 keys, N 8192, H 16) fell from 0.168 ms (T22) to 0.288 (T34-A):
# tilings and knobs on it, causal N 1024 B 16 beside for scale; then the
# decode bars (decode.py, unbuffered, its own time).
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 5
R="--block-m 128 --block-n 128 --warps 8 --stages 2"
say "window 1024 N 8192 H 16 (TFLOP/s): default | no overlap | 1 stage overlap | 64x128 w4 | 192x128 w12 | ping-pong off"
FLASHJIT_KNOB_ROUNDS=2 timeout 200 bash tools/scripts/gpu-knobs.sh \
  "-|$R|--block-m 128 --block-n 128 --warps 8 --stages 1 --overlap-softmax|--block-m 64 --block-n 128 --warps 4 --stages 2|--block-m 192 --block-n 128 --warps 12 --stages 2|FLASHJIT_PING_PONG=0" \
  "--head-dim 128 --seq-len 8192 --window 1024,0" "--head-dim 128 --seq-len 8192 --causal" 2>&1 | tail -2 | cut -c1-300
for a in "--window 1024,0" "--causal"; do
  timeout 30 $FJ bench --head-dim 128 --seq-len 8192 --heads 16 $a --json 2>&1 | tail -1 | cut -c1-400
done
say "decode"
timeout 300 python3 -u tests/bench/decode.py --flashjit $FJ --out $OUT/decode.json > $OUT/decode.log 2>&1
tail -14 $OUT/decode.log | cut -c1-180
say done
