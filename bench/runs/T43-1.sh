#!/usr/bin/env bash
# T43-1: T42-3-prepared.sh (see there) plus bench/runs/T43-mufu.cu (packed
# tanh: scores a clock an SM) and its SASS ops. Carry [".carry"] with
# .carry/micro/{warps,wgmma,mufu} built by nvcc -O3 -gencode
# arch=compute_90a,code=sm_90a.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T43-1
chmod +x $C/micro/*
say "MUFU: packed tanh"; $C/micro/mufu
if command -v cuobjdump >/dev/null; then cuobjdump -sass $C/micro/mufu | grep -oE '(MUFU|F2F|F2FP|HADD2|PRMT)[.A-Z0-9_]*' | sort | uniq -c; else say "no cuobjdump"; fi
$C/micro/warps; $C/micro/wgmma
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
for r in 1 2 3; do
  line=""
  for s in "--seq-len 16384 --heads 16" "--seq-len 8192 --heads 16" "--seq-len 4096 --batch 4 --heads 16" "--seq-len 1024 --batch 16 --heads 16"; do
    line+=" | N${s#--seq-len } default $(tf "--head-dim 128 --causal $s" X=1) pp3 $(tf "--head-dim 128 --causal $s" FLASHJIT_PING_PONG=3)"
  done
  say "round $r causal d128 TFLOP/s$line"
done
if (( SECONDS - CALL_T0 < 200 )); then
  say "forward GPU suites, FLASHJIT_PING_PONG=3 on every ring kernel"
  export FLASHJIT_PING_PONG=3
  gpu_suites
  unset FLASHJIT_PING_PONG
fi
if (( SECONDS - CALL_T0 < 420 )); then
  say "ncu full set, the plain forward (N 8192, H 16, d 128), the default kernel"
  ncu_stalls fwd-plain '^attention$' $FJ bench --head-dim 128 --seq-len 8192 --heads 16 --repeats 1 | sed -n '/Scheduler/,/-- instructions/p'
fi
say done
