#!/usr/bin/env bash
# T42-1 (carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`; command `bash bench/runs/T42-1-prepared.sh`):
# why softcap's forward costs +20% over plain (issue 14's bar: 10%). Its
# tanh and exp2 both run on the multi-function unit, about as busy as the
# tensor cores would be at the same scores a clock (T39), so the two
# consumer warpgroups' softmaxes must run under each other's MMAs. The
# overlapped loop takes no turns at the tensor cores by default (T30, for
# plain): here turns (FLASHJIT_PING_PONG 1, 2) against none, with and
# without 2/8 of the exponentials emulated, two rounds; then ncu's full
# set of the default softcap kernel (the pipes' shares, the stalls); then
# the torch GPU suites with dq_accum in quad order (T41's default), time
# left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T42-1
P="--head-dim 128 --seq-len 8192 --heads 16"
tf() { local a=$1; shift; bench_env "$P $a" "$@" | tflops_of; }
for r in 1 2; do
  say "round $r TFLOP/s softcap:30: pp0 $(tf '--score-mod softcap:30' X=1) pp1 $(tf '--score-mod softcap:30' FLASHJIT_PING_PONG=1) pp2 $(tf '--score-mod softcap:30' FLASHJIT_PING_PONG=2) emu2 $(tf '--score-mod softcap:30' FLASHJIT_EXP2_EMULATION=2) emu2+pp1 $(tf '--score-mod softcap:30' FLASHJIT_EXP2_EMULATION=2 FLASHJIT_PING_PONG=1) | plain pp0 $(tf '' X=1) pp1 $(tf '' FLASHJIT_PING_PONG=1)"
  say "round $r causal softcap:30: default $(tf '--causal --score-mod softcap:30' X=1) pp1 $(tf '--causal --score-mod softcap:30' FLASHJIT_PING_PONG=1) | causal plain $(tf --causal X=1)"
done
say "ncu full set, softcap:30 forward, the default kernel"
ncu_stalls fwd-softcap '^attention$' $FJ bench $P --score-mod softcap:30 --repeats 1
if (( SECONDS - CALL_T0 < 330 )); then
  torch_suites test_torch_plans_gpu test_varlen_gpu test_torch_gpu
elif (( SECONDS - CALL_T0 < 450 )); then
  torch_suites test_torch_plans_gpu test_varlen_gpu
fi
say done
