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
_s() { local n=$1 b=$2; shift 2; env "$@" timeout 220 $C/bin/flashjit-$b-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$n.log 2>&1; echo "exit $?" >> $OUT/t-$n.log; }
for i in 0 1 2 3; do _s fwd$i forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
_s captured captured X=1 & _s varlen varlen X=1 & _s backward backward X=1 & wait
for l in fwd0 fwd1 fwd2 fwd3 captured varlen backward; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
done
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && (( SECONDS - CALL_T0 < 470 )); then
  timeout $((575 - (SECONDS - CALL_T0))) python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  say "variants exit $?"
  grep -A16 '^variants, bf16' $OUT/variants.log | cut -c1-200
fi
left=$((575 - (SECONDS - CALL_T0)))
if ((left > 90)); then
  python_tests_env
  (cd python && timeout $left python3 -m pytest -q tests/test_torch_captured_gpu.py -p no:cacheprovider > $OUT/py-captured.log 2>&1; echo "exit $?" >> $OUT/py-captured.log)
  say "test_torch_captured_gpu: $(tail -2 $OUT/py-captured.log | tr '\n' ' ' | cut -c1-200)"
fi
say done
