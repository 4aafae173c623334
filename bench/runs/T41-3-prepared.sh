#!/usr/bin/env bash
# T41-3, for the next session (carry [".carry"] after
# `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh`; command
# `bash bench/runs/T41-3-prepared.sh`): what T41 left unrun. The torch GPU
# suites with dq_accum in quad order (the default since T41, run there
# only through the compiled suites); the full softcap forward's exp2 share
# again (T33's -2% at 2/8 predates the fixed row max), two rounds; its
# tiling (three consumer warpgroups; `flashjit tune`); then ncu of the
# quad-order dK/dV kernel (N 4096), time left.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T41-3
torch_suites test_torch_gpu test_torch_plans_gpu test_varlen_gpu
F="--head-dim 128 --seq-len 8192 --heads 16 --score-mod softcap:30"
tf() { local e=$1; shift; bench_env "$F $*" "$e" | tflops_of; }
for r in 1 2; do
  say "round $r full softcap:30 TFLOP/s: emu0 $(tf X=1) emu1 $(tf FLASHJIT_EXP2_EMULATION=1) emu2 $(tf FLASHJIT_EXP2_EMULATION=2) emu3 $(tf FLASHJIT_EXP2_EMULATION=3) | plain $(bench_env "--head-dim 128 --seq-len 8192 --heads 16" X=1 | tflops_of)"
done
# The softcap forward's tiling: three consumer warpgroups, and what the
# autotuner finds (its table in $OUT/tune.log; the cache it writes is the
# machine's, gone after the call).
say "softcap:30 TFLOP/s 192 x 128, 12 warps (no overlapped loop there): $(tf X=1 --block-m 192 --block-n 128 --warps 12) | 128 x 128, 8 warps, not overlapped: $(tf X=1 --block-m 128 --block-n 128 --warps 8)"
timeout 150 $FJ tune $F > $OUT/tune.log 2>&1; say "tune softcap:30 exit $?: $(grep -iE 'winner|best' $OUT/tune.log | head -3 | tr '\n' ' ')"
if (( SECONDS - CALL_T0 < 300 )); then
  say "ncu full set, the default (quad order) dK/dV kernel, plain backward N 4096"
  ncu_stalls bwd-quads '^attention$' $FJ bench --head-dim 128 --seq-len 4096 --heads 16 --backward --repeats 1
fi
say done
