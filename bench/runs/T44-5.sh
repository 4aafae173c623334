#!/usr/bin/env bash
# T44-5: a share of softcap's tanh on the FMA pipe
# (FLASHJIT_TANH_POLYNOMIAL=K eighths; T44-3 measured K = 8: -10%): carry
# [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh`;
# command `bash bench/runs/T44-5.sh`, timeout 420; after
# T45-1-prepared.sh, which checks K = 2 against float64 first. (1) three
# interleaved rounds, d 128, N 8192, H 16: plain and softcap:30 at K 0 to
# 4, causal plain and softcap:30 at K 0 and 2 (2 also without the causal
# default's emulated exponentials), backward plain and softcap:30 at K 0
# and 2; (2) ForwardTanhPolynomialGpu (K 2 and 8), time left. If a K
# gains on all three rounds, make it the default (tanhPolynomialEighths,
# as exp2EmulationEighths: by the description) and rerun variants.py.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-5
S="--head-dim 128 --seq-len 8192 --heads 16"
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
for r in 1 2 3; do
  say "round $r TFLOP/s: plain $(tf "$S" X=1) softcap:30 K0 $(tf "$S --score-mod softcap:30" X=1) K1 $(tf "$S --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=1) K2 $(tf "$S --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=2) K3 $(tf "$S --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=3) K4 $(tf "$S --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=4) | causal plain $(tf "$S --causal" X=1) K0 $(tf "$S --causal --score-mod softcap:30" X=1) K2 $(tf "$S --causal --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=2) K2-exp0 $(tf "$S --causal --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=2 FLASHJIT_EXP2_EMULATION=0) | bwd plain $(tf "$S --backward" X=1) K0 $(tf "$S --backward --score-mod softcap:30" X=1) K2 $(tf "$S --backward --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=2)"
done
timeout $((400 - (SECONDS - CALL_T0))) $C/bin/flashjit-forward-gpu-tests --gtest_brief=1 --gtest_color=no --gtest_filter='*TanhPolynomial*' > $OUT/t-tanh.log 2>&1
echo "exit $?" >> $OUT/t-tanh.log
say "ForwardTanhPolynomialGpu: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-tanh.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-tanh.log | head -6
say done
