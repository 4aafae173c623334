#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# tools/scripts/gpu-prepare.sh assembled .carry/ here: the overlapped KV
# loop's H200 run (--overlap-softmax, README "The overlapped loop"; T12 in
# bench/NOTES.md). Device call:
#   carry [".carry"], command: bash tools/scripts/gpu-overlap.sh
# Steps (FLASHJIT_OVERLAP_STEPS, comma-separated; default all but peers):
#   tests     the forward GPU tests of the ring, ping-pong and overlap
#             (FLASHJIT_GTEST_FILTER overrides) -> $OUT/tests.log
#   sanitize  memcheck, racecheck, synccheck on two overlapped kernels
#   ab        FLASHJIT_AB_ROUNDS (3) interleaved rounds, N = 16K, B = 1,
#             H = 2048 / d (FLASHJIT_AB_CASES "D n|c;..."): the default
#             tiling through nvJitLink and through the driver's JIT, the ring
#             tiling with and without --overlap-softmax; TFLOP/s medians,
#             [registers spill bytes] of the last round
#   peers     side_by_side.py, forward, default tilings -> $OUT/bench.json
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_OVERLAP_STEPS:-tests,sanitize,ab}
step tests && forward_tests 300 "${FLASHJIT_GTEST_FILTER:-*Overlap*:*KvRing*:*PingPong*}"
if step sanitize; then
  echo "== sanitizers on the overlapped loop (+${SECONDS}s)"
  sanitize "memcheck racecheck synccheck" \
    "--head-dim 64 --block-m 128 --block-n 64 --warps 8 --stages 3 --causal --gqa 2 --heads 2 --seq-len 300 --seq-len-kv 700 --overlap-softmax" \
    "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --block-sparse 0.5 --sparse-block 128 --seq-len 600 --overlap-softmax"
fi
if step ab; then
  echo "== A/B, N = 16K, B = 1, H = 2048 / d (+${SECONDS}s)"
  rounds=${FLASHJIT_AB_ROUNDS:-3}
  ring="--block-m 128 --block-n 128 --warps 8 --stages 2"
  # Per case: the default tiling assembled by nvJitLink (separate
  # compilation) and by the driver's JIT (whole program, the default), and
  # on the ring tiling (d <= 128) without and with --overlap-softmax.
  IFS=';' read -ra cases <<< "${FLASHJIT_AB_CASES:-128 n;128 c;64 n;64 c;96 n;256 n}"
  for c in "${cases[@]}"; do
    set -- $c
    L=(); D=(); P=(); O=(); l=; dd=; p=; o=
    for ((r = 0; r < rounds; r++)); do
      l=$(FLASHJIT_ASSEMBLER=nvjitlink bench_one $1 $2); L+=(${l%% *})
      dd=$(bench_one $1 $2); D+=(${dd%% *})
      if (($1 <= 128)); then
        p=$(bench_one $1 $2 $ring); P+=(${p%% *})
        o=$(bench_one $1 $2 $ring --overlap-softmax); O+=(${o%% *})
      fi
    done
    echo "d$1 $2: default nvjitlink $(median "${L[@]}") [${l#* }] driver $(median "${D[@]}") [${dd#* }]" \
         "| ring $(median "${P[@]}") [${p#* }] overlap $(median "${O[@]}") [${o#* }]"
  done
fi
if step peers; then
  echo "== peers, forward, default tilings (+${SECONDS}s)"
  left=$((560 - SECONDS)); ((left < 60)) && left=60
  timeout -k 5 $left python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --budget-s 60 \
    --cases "${FLASHJIT_PEER_CASES:-128:16384:n,128:16384:c,64:16384:n,96:16384:n,256:16384:n}" > $OUT/bench.log 2>&1
  tail -25 $OUT/bench.log
fi
echo "== done (+${SECONDS}s)"
