#!/usr/bin/env bash
# T36-3 (carry [".carry"], made from this session's tree with O by its
# tensor map, FLASHJIT_TMA=qkvo; command `bash bench/runs/T36-3-prepared.sh`):
# (1) the forward, captured and varlen GPU suites with every ring kernel on
# qkvo; (2) `run` checks of qkvo kernels where the map clips (odd rows,
# d 96, Nq != Nkv, GQA, causal, batches, persistent and not); (3)
# compute-sanitizer memcheck and racecheck on qkvo kernels; (4) qkvo
# against the default, interleaved, two rounds; (5) the torch varlen GPU
# tests (T36-1's step ran out of time inside them); (6) the tuning time of
# a new shape (issue 13: under 5 s). Steps skipped near 580 s.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 3
left() { (( SECONDS - CALL_T0 < $1 )); }
say "GPU suites, FLASHJIT_TMA=qkvo"
(export FLASHJIT_TMA=qkvo; gpu_suites)
left 300 && {
say "run checks, qkvo"
export FLASHJIT_TMA=qkvo
run_checks 128 "" "--seq-len 1000 --batch 2 --heads 4" "--causal --seq-len 777 --seq-len-kv 2000 --gqa 2 --heads 8" \
  "--seq-len 4100 --heads 2 --persistent --query-tma" "--seq-len 333 --heads 3 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --query-tma"
run_checks 96 "" "--seq-len 1000 --batch 2 --heads 4 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --query-tma" \
  "--causal --seq-len 517 --heads 2 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --persistent --query-tma"
run_checks 64 "" "--seq-len 999 --heads 4 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --query-tma"
unset FLASHJIT_TMA
}
left 400 && {
say "qkvo / default (TFLOP/s, interleaved, two rounds)"
for c in "128 16384 1" "128 1024 16" "128 4096 4" "96 16384 1" "64 16384 1" "256 16384 1"; do
  set -- $c
  a=() b=()
  for r in 1 2; do
    a+=($(timeout 40 $FJ bench --head-dim $1 --seq-len $2 --batch $3 --heads $((2048 / $1)) --json 2>/dev/null | tflops_of))
    b+=($(FLASHJIT_TMA=qkvo timeout 40 $FJ bench --head-dim $1 --seq-len $2 --batch $3 --heads $((2048 / $1)) --json 2>/dev/null | tflops_of))
  done
  echo "d $1 N $2 B $3: default ${a[*]} | qkvo ${b[*]}"
done
}
left 420 && {
say "sanitizers, qkvo"
(export FLASHJIT_TMA=qkvo
 sanitize memcheck "--head-dim 128 --seq-len 700 --heads 2 --persistent --query-tma"
 sanitize racecheck "--head-dim 96 --seq-len 300 --causal --block-m 128 --block-n 128 --warps 8 --overlap-softmax --query-tma")
}
left 480 && {
say "torch varlen GPU tests"
timeout 90 python3 -m pytest -q -p no:cacheprovider python/tests/test_varlen_gpu.py -k "block or mask or document or backward" 2>&1 | tail -3 | cut -c1-200
}
left 530 && {
say "tuning time of a new shape"
FLASHJIT_TUNE_DIMS="128" timeout $((580 - SECONDS + CALL_T0)) bash tools/scripts/gpu-tune-report.sh 2>&1 | cut -c1-330
}
say done
