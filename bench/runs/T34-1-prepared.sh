#!/usr/bin/env bash
# T34-1 (prepared in T33 on 9da284c: split commits and the tile schedule
# on by default): (1) issue 13's forward bar table beside cuDNN (on an
# H200 if one comes: none came in T31-T33); (2) d = 256's candidates
# (persistent alone, the overlapped loop, Bc 80); (3) wide KV blocks at
# d = 128 (Bc 144 / 176): correct, then timed. Steps skipped near 600 s.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
call_header 1
left() { (( SECONDS - CALL_T0 < $1 )); }
say "forward bars beside cuDNN"
forward_bars 170
W128="--block-m 128 --warps 8 --stages 2 --overlap-softmax"
W256="--block-m 128 --warps 8 --stages 2"
left 300 && {
run_checks 256 "$W256 --block-n 80" "--seq-len 777 --seq-len-kv 1333 --batch 2 --heads 4 --gqa 2 --causal" \
  "--seq-len 300 --seq-len-kv 2000 --heads 2 --window 100,0"
run_checks 128 "$W128 --block-n 176 --persistent --query-tma" "--seq-len 777 --seq-len-kv 1333 --batch 2 --heads 4 --gqa 2 --causal"
say "d 256: default | persistent | overlapped | Bc 80 (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout 130 bash tools/scripts/gpu-knobs.sh \
  "-|FLASHJIT_PERSISTENT=1|$W256 --block-n 64 --overlap-softmax|$W256 --block-n 80" \
  "--head-dim 256 --heads 8" "--head-dim 256 --heads 8 --causal" 2>&1 | tail -2 | cut -c1-240
}
left 480 && {
say "d 128: default | Bc 144 | Bc 176 (TFLOP/s)"
FLASHJIT_KNOB_ROUNDS=2 timeout $((585 - SECONDS + CALL_T0)) bash tools/scripts/gpu-knobs.sh \
  "-|$W128 --block-n 144 --persistent --query-tma|$W128 --block-n 176 --persistent --query-tma" \
  "--head-dim 128" "--head-dim 128 --seq-len 1024 --batch 16" 2>&1 | tail -2 | cut -c1-220
}
say done
