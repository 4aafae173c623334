#!/usr/bin/env bash
# T42-3, not run in T42 (every start after call 2 was refused): for the
# next session (carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`, `mkdir -p .carry/micro` and, for F in
# warps wgmma, `nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o
# .carry/micro/$F bench/runs/T42-$F.cu`; command `bash
# bench/runs/T42-3-prepared.sh`): (1) the softmax chain's scores a clock
# with 1..8 warps a scheduler (T42-2: turns at the unit did not speed
# softcap up: does one warp a scheduler fill the unit?), and one
# warpgroup's chain of 8 m64n128k16 MMAs against two warpgroups' (does
# one chain alone keep the tensor cores at peak?); (2) T42-2's
# causal plain +3% with turns at the unit (FLASHJIT_PING_PONG=3), across
# shapes (d 128), three interleaved rounds; (3) the forward GPU
# suites with mode 3 forced on every ring kernel; (4) time left, ncu's
# pipe shares of the plain forward, beside T42-1's softcap (tensor and
# xu 64.6% there): how much of softcap's loss plain shares.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T42-3
chmod +x $C/micro/warps $C/micro/wgmma; $C/micro/warps; $C/micro/wgmma
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
