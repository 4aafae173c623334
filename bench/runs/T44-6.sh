#!/usr/bin/env bash
# T44-6: the least of T44-5 that fits the session's last device time
# (about 150 s): float64 at K = 2 (FLASHJIT_TANH_POLYNOMIAL=2), then two
# interleaved rounds of plain and softcap:30 at K 0, 2 and 3, d 128,
# N 8192, H 16. Carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`; command `bash bench/runs/T44-6.sh`.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T44-6
say "K2 fwd softcap:2 causal: $(FLASHJIT_TANH_POLYNOMIAL=2 check_json --heads 4 --head-dim 128 --score-mod softcap:2 --causal --seq-len 700 --seq-len-kv 900)"
S="--head-dim 128 --seq-len 8192 --heads 16 --repeats 10"
tf() { local a=$1; shift; bench_env "$a" "$@" | tflops_of; }
for r in 1 2; do
  say "round $r TFLOP/s: plain $(tf "$S" X=1) softcap:30 K0 $(tf "$S --score-mod softcap:30" X=1) K2 $(tf "$S --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=2) K3 $(tf "$S --score-mod softcap:30" FLASHJIT_TANH_POLYNOMIAL=3)"
done
say done
