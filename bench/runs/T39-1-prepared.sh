#!/usr/bin/env bash
# T39-1 (carry [".carry"], the build of the half-precision softmax; command
# `bash bench/runs/T39-1-prepared.sh`). Softcap's tanh and P in f16, two
# scores an instruction (tanh.approx.f16x2, fma.rn.f16x2, ex2.approx.f16x2):
# the MUFU unit's f16x2 throughput first (.carry/micro, built from
# bench/runs/T39-mufu.cu and T39-chain.cu), then softcap against float64
# with and without it (FLASHJIT_HALF_SOFTMAX=0), the forward GPU suites,
# the CLI's forward TFLOP/s (two rounds) and variants.py's softcap beside
# FlexAttention.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T39-1
chmod +x $C/micro/* 2>/dev/null
$C/micro/mufu; $C/micro/chain
for a in "--seq-len 4096" "--seq-len 1000 --seq-len-kv 1537 --causal" "--seq-len 2048 --scale 1.0" "--seq-len 777 --batch 2 --gqa 2 --heads 4 --window 100,20"; do
  for cap in 30 2; do
    say "softcap:$cap $a: half $(check_json --head-dim 128 --heads 4 --score-mod softcap:$cap $a) | f32 $(FLASHJIT_HALF_SOFTMAX=0 check_json --head-dim 128 --heads 4 --score-mod softcap:$cap $a)"
  done
done
say "backward softcap:30 N 2048 (its forward's lse): $(check_json --head-dim 128 --heads 4 --score-mod softcap:30 --seq-len 2048 --backward)"
gpu_suites
A="--head-dim 128 --seq-len 8192 --heads 16 --json"
for r in 1 2; do
  say "round $r TFLOP/s: plain $(timeout 60 $FJ bench $A 2>/dev/null | tflops_of) softcap $(timeout 60 $FJ bench $A --score-mod softcap:30 2>/dev/null | tflops_of) softcap-f32 $(FLASHJIT_HALF_SOFTMAX=0 timeout 60 $FJ bench $A --score-mod softcap:30 2>/dev/null | tflops_of) | causal $(timeout 60 $FJ bench $A --causal 2>/dev/null | tflops_of) softcap $(timeout 60 $FJ bench $A --causal --score-mod softcap:30 2>/dev/null | tflops_of) softcap-f32 $(FLASHJIT_HALF_SOFTMAX=0 timeout 60 $FJ bench $A --causal --score-mod softcap:30 2>/dev/null | tflops_of)"
done
timeout 150 python3 tests/bench/variants.py --variants plain,softcap --json $OUT/variants.json > $OUT/var.log 2>&1
grep -A14 '^variants, bf16' $OUT/var.log | cut -c1-170
say done
