#!/usr/bin/env bash
# T45-1, prepared in T44 (whose last four starts were refused): the most
# of T44-5 and T44-4 that one call holds, for a session that may get one.
# Carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`; command `bash
# bench/runs/T45-1-prepared.sh`, timeout 590.
# (0) float64 with a share of softcap's tanh on the FMA pipe
# (FLASHJIT_TANH_POLYNOMIAL=2, never run); (1) three interleaved rounds,
# d 128, N 8192, H 16: plain and softcap:30 at K 0, 2, 3 (forward), causal
# at K 0 and 2, backward at K 0 and 2; (2) every C++ GPU suite at once
# (forward in four shards: ForwardTanhPolynomialGpu, the ping-pong mode-3
# cases; captured, varlen, backward); (3) on an H200, variants.py (issue
# 14's table); (4) the torch GPU suites, time left (else T44-4.sh next).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T45-1
say "K2 fwd softcap:30: $(FLASHJIT_TANH_POLYNOMIAL=2 check_json --heads 4 --head-dim 128 --score-mod softcap:30 --seq-len 1000)"
say "K2 fwd softcap:2 causal: $(FLASHJIT_TANH_POLYNOMIAL=2 check_json --heads 4 --head-dim 128 --score-mod softcap:2 --causal --seq-len 700 --seq-len-kv 900)"
say "K2 bwd softcap:2: $(FLASHJIT_TANH_POLYNOMIAL=2 check_json --heads 4 --head-dim 128 --backward --score-mod softcap:2 --seq-len 700)"
S="--head-dim 128 --seq-len 8192 --heads 16"
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
K=FLASHJIT_TANH_POLYNOMIAL
for r in 1 2 3; do
  say "round $r TFLOP/s: plain $(tf "$S" X=1) softcap:30 K0 $(tf "$S --score-mod softcap:30" X=1) K2 $(tf "$S --score-mod softcap:30" $K=2) K3 $(tf "$S --score-mod softcap:30" $K=3) | causal plain $(tf "$S --causal" X=1) K0 $(tf "$S --causal --score-mod softcap:30" X=1) K2 $(tf "$S --causal --score-mod softcap:30" $K=2) | bwd plain $(tf "$S --backward" X=1) K0 $(tf "$S --backward --score-mod softcap:30" X=1) K2 $(tf "$S --backward --score-mod softcap:30" $K=2)"
done
# The backward suite beside gpu_suites' (forward in 4 shards, captured,
# varlen), whose wait covers it too.
(timeout 200 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd.log 2>&1; echo "exit $?" >> $OUT/bwd.log) &
gpu_suites
say "backward: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd.log | head -6
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && (( SECONDS - CALL_T0 < 470 )); then
  timeout $((575 - (SECONDS - CALL_T0))) python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A16 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
if (( SECONDS - CALL_T0 < 370 )); then torch_suites test_torch_captured_gpu; fi
say done
