#!/usr/bin/env bash
# T39-3 (carry [".carry"], the build with the banded softcap's default
# exp2 share; command `bash bench/runs/T39-3-prepared.sh`). A softcap
# forward with a causal or sliding-window mask now emulates 3/8 of P's
# exponentials by default: against float64 (C 30 and 50, causal, window,
# Nq != Nkv, decode), the forward / captured / varlen GPU suites, TFLOP/s
# at N 8192, H 16, d 128, two rounds: the default against
# FLASHJIT_EXP2_EMULATION=0 and =2, plain causal beside; then issue 14's
# variants beside FlexAttention (variants.py, every variant).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T39-3
for a in "--score-mod softcap:30 --causal --seq-len 4096" "--score-mod softcap:50 --causal --seq-len 1000 --seq-len-kv 1537" "--score-mod softcap:30 --window 300,0 --seq-len 2048 --gqa 2" "--score-mod softcap:50 --causal --seq-len 1 --seq-len-kv 5000"; do
  say "$a: $(check_json --head-dim 128 --heads 4 $a)"
done
gpu_suites
A="--head-dim 128 --seq-len 8192 --heads 16 --json"
b() { timeout 60 $FJ bench $A "$@" 2>/dev/null | tflops_of; }
for r in 1 2; do
  say "round $r causal: plain $(b --causal) | softcap:30 default $(b --causal --score-mod softcap:30) emu0 $(FLASHJIT_EXP2_EMULATION=0 b --causal --score-mod softcap:30) emu2 $(FLASHJIT_EXP2_EMULATION=2 b --causal --score-mod softcap:30) | softcap:50 default $(b --causal --score-mod softcap:50) emu0 $(FLASHJIT_EXP2_EMULATION=0 b --causal --score-mod softcap:50) | window 4096 softcap:50 default $(b --window 4096,0 --score-mod softcap:50) emu0 $(FLASHJIT_EXP2_EMULATION=0 b --window 4096,0 --score-mod softcap:50)"
done
variants_table all
say done
