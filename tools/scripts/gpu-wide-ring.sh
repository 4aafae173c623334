#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh): the K/V ring past d = 128
# and with three consumer warpgroups (T13).
#   tests     the ring and overlap GPU tests (FLASHJIT_GTEST_FILTER)
#   sanitize  memcheck and racecheck on a d = 256 ring and a 12-warp ring
#   ab        TFLOP/s, N = 16K, B = 1, H = 2048 / d, median of
#             FLASHJIT_AB_ROUNDS (2): the default tiling against the ring
#             tilings, each "d mask | tiling" of FLASHJIT_AB_TILINGS
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_WIDE_STEPS:-tests,sanitize,ab}
step tests && forward_tests 240 "${FLASHJIT_GTEST_FILTER:-*KvRing*:*Overlap*}"
if step sanitize; then
  echo "== sanitizers (+${SECONDS}s)"
  sanitize "memcheck racecheck" \
    "--head-dim 256 --block-m 128 --block-n 64 --warps 8 --stages 2 --causal --gqa 2 --heads 2 --seq-len 300 --seq-len-kv 700" \
    "--head-dim 64 --block-m 192 --block-n 128 --warps 12 --stages 2 --seq-len 600"
fi
if step ab; then
  echo "== A/B, N = 16K, B = 1, H = 2048 / d (+${SECONDS}s)"
  rounds=${FLASHJIT_AB_ROUNDS:-2}
  IFS=';' read -ra tilings <<< "${FLASHJIT_AB_TILINGS:-256 n|;256 n|--block-m 128 --block-n 64 --warps 8 --stages 2;256 n|--block-m 128 --block-n 64 --warps 8 --stages 2 --overlap-softmax;256 n|--block-m 128 --block-n 32 --warps 8 --stages 4;256 c|;256 c|--block-m 128 --block-n 64 --warps 8 --stages 2;256 c|--block-m 128 --block-n 64 --warps 8 --stages 2 --overlap-softmax;64 n|;64 n|--block-m 192 --block-n 128 --warps 12 --stages 2;64 c|;64 c|--block-m 192 --block-n 128 --warps 12 --stages 2;96 n|;96 n|--block-m 192 --block-n 64 --warps 12 --stages 3;128 n|;128 n|--block-m 192 --block-n 64 --warps 12 --stages 3}"
  for t in "${tilings[@]}"; do
    c=${t%%|*}; flags=${t#*|}
    R=(); x=
    for ((r = 0; r < rounds; r++)); do x=$(bench_one $c $flags); R+=(${x%% *}); done
    echo "d$c [${flags:-default}]: $(median "${R[@]}") [${x#* }]"
  done
fi
echo "== done (+${SECONDS}s)"
