#!/usr/bin/env bash
# T44-1, prepared in T43 (every start after T43-1 was refused): carry
# [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh`,
# `mkdir -p .carry/micro` and `nvcc -O3 -gencode
# arch=compute_90a,code=sm_90a -o .carry/micro/order
# bench/runs/T43-order.cu`; command `bash bench/runs/T44-1-prepared.sh`
# (T44_DEADLINE=S bounds variants.py's end, default 200 s into the call).
# (1) does 2/8 of the exponentials by arithmetic raise one warp's rate on
# softcap's chain (T43-order.cu)? (2) the causal default (turns at the
# unit, T43) against FLASHJIT_PING_PONG=0, two rounds, and run --json's
# ping_pong; (3) variants.py, every variant, against FlexAttention (issue
# 14's table on the H200; none since T35); (4) the backward, captured and
# varlen GPU suites and the ping-pong cases (mode 3 among them); (5) the
# torch GPU suites, time left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-1
[[ -f $C/micro/order ]] && { chmod +x $C/micro/order; $C/micro/order; }
S="--head-dim 128 --seq-len 8192 --heads 16"
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
for r in 1 2; do
  say "round $r causal plain TFLOP/s: default $(tf "$S --causal" X=1) pp0 $(tf "$S --causal" FLASHJIT_PING_PONG=0)"
done
say "causal default json: $(bench_env "$S --causal" X=1 | grep -o '"ping_pong":[0-9]')"
left=$((${T44_DEADLINE:-200} - (SECONDS - CALL_T0)))
if ((left > 70)); then
  timeout $left python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A40 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
_s() { local n=$1 b=$2; shift 2; timeout 150 $C/bin/flashjit-$b-gpu-tests --gtest_brief=1 --gtest_color=no "$@" > $OUT/t-$n.log 2>&1; echo "exit $?" >> $OUT/t-$n.log; }
_s backward backward & _s captured captured & _s varlen varlen & _s pingpong forward --gtest_filter='Modes/ForwardPingPongGpu.*' & wait
for l in backward captured varlen pingpong; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
if (( SECONDS - CALL_T0 < 330 )); then torch_suites test_torch_gpu test_varlen_gpu; fi
say done
