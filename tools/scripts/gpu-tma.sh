#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh): the K/V ring's copies by
# the tensor memory accelerator (TileToGPUTma.cpp; FLASHJIT_TMA). Device
# call: carry [".carry"], command: bash tools/scripts/gpu-tma.sh
# Steps (FLASHJIT_TMA_STEPS, comma-separated; default all but peers):
#   tests     every forward GPU test (the ring's suites run by tensor maps
#             now; ForwardTmaGpu both ways), then the runtime GPU tests
#             (prepared launches, CUDA graphs) -> $OUT/tests.log
#   sanitize  memcheck, racecheck and synccheck on ring kernels by TMA
#   ab        TFLOP/s of the default tilings with FLASHJIT_TMA=0 and 1,
#             median of FLASHJIT_AB_ROUNDS (2) interleaved rounds: d = 64,
#             96, 128, 256 at N = 16K, B = 1, H = 2048 / d, and d = 128 at
#             N = 1024 B = 16, N = 4096 B = 4 (H = 16), plain and causal
#   tilings   ring tilings by tensor maps against the defaults, where the
#             defaults do not take the ring (d = 64 causal, d = 96, d = 256
#             unmasked) and at d = 128, N = 16K, B = 1, H = 2048 / d;
#             TFLOP/s [registers, spill bytes], median of the rounds
#   defaults  the default-tiling forward tests (Matrix/ and ScoreMods/
#             ForwardGpu), then the defaults' TFLOP/s [registers, spill
#             bytes] where T15 changed them (d = 64 causal, d = 96, d = 256)
#   query     Q by the producer's tensor map (FLASHJIT_TMA=qkv) against Q
#             by the consumers' cp.async (FLASHJIT_TMA=kv), each one-tile-
#             per-program and persistent (FLASHJIT_PERSISTENT=1), d = 128,
#             H = 16, N = 1024 B = 16, N = 4096 B = 4, N = 16K B = 1, plain
#             and causal, the default tiling and the ring at 128x128/8;
#             median of FLASHJIT_AB_ROUNDS (2) interleaved rounds
#   peers     side_by_side.py, forward, default tilings, the issue's cases
#             (FLASHJIT_PEER_CASES) -> $OUT/bench.json, until FLASHJIT_PEERS_END
#             (570) seconds into the script
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_TMA_STEPS:-tests,sanitize,ab}
# A hang (a barrier that never completes) must not eat the call: two
# short runs first, and nothing else when they fail.
echo "== smoke (+${SECONDS}s)"
for a in "--head-dim 128 --causal --seq-len 1000" "--head-dim 96 --gqa 2 --heads 4 --seq-len 777 --seq-len-kv 1234 --block-m 128 --block-n 64 --warps 8"; do
  timeout 30 $FJ run $a --device cuda --json > $OUT/smoke.log 2>&1
  rc=$?
  echo "[$a] exit $rc $(grep -o '"rel_err":[^,]*\|"tma":[a-z]*\|"ok":[a-z]*' $OUT/smoke.log | tr '\n' ' ')"
  ((rc == 0)) || { tail -5 $OUT/smoke.log; echo "== smoke failed: stop"; exit 1; }
done
if step tests; then
  forward_tests 330 "*"
  runtime_tests
fi
if step sanitize; then
  echo "== sanitizers (+${SECONDS}s)"
  sanitize "memcheck racecheck synccheck" \
    "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --causal --gqa 2 --heads 2 --seq-len 300 --seq-len-kv 700" \
    "--head-dim 96 --dtype fp16 --block-m 128 --block-n 64 --warps 8 --stages 3 --window 50,20 --seq-len 333"
fi
if step ab; then
  echo "== TMA A/B, default tilings (+${SECONDS}s)"
  rounds=${FLASHJIT_AB_ROUNDS:-2}
  shapes=("64 16384 1" "96 16384 1" "128 16384 1" "256 16384 1" "128 1024 16" "128 4096 4")
  for sh in "${shapes[@]}"; do
    set -- $sh
    h=$((2048 / $1)); (($2 < 16384)) && h=16
    for m in "" --causal; do
      declare -A R=()
      for ((r = 0; r < rounds; r++)); do
        for t in 0 1; do
          R[$t]+=" $(FLASHJIT_TMA=$t timeout 40 $FJ bench --head-dim $1 $m --seq-len $2 --batch $3 --heads $h --json 2>/dev/null | tflops_of)"
        done
      done
      echo "d$1 N$2 B$3 ${m:-plain}: cp.async $(median ${R[0]}) (${R[0]# }); tma $(median ${R[1]}) (${R[1]# })"
    done
  done
fi
if step tilings; then
  echo "== ring tilings by TMA, N = 16K (+${SECONDS}s)"
  rounds=${FLASHJIT_AB_ROUNDS:-2}
  t() { echo "--block-m $1 --block-n $2 --warps $3 --stages $4 ${5:-}"; }
  cands=("64|c|" "64|c|$(t 128 128 8 2)" "64|c|$(t 128 64 8 2)" "64|c|$(t 192 128 12 2)"
         "96|n|" "96|n|$(t 128 128 8 2)" "96|n|$(t 192 128 12 2)" "96|n|$(t 128 64 8 2)"
         "96|c|" "96|c|$(t 128 128 8 2)" "96|c|$(t 128 64 8 2)"
         "256|n|" "256|n|$(t 128 64 8 2)"
         "128|n|" "128|n|$(t 128 128 8 2)" "128|n|$(t 128 128 8 3 --overlap-softmax)" "128|n|$(t 192 128 12 2)"
         "128|c|$(t 128 128 8 3 --overlap-softmax)")
  declare -A R=() L=()
  for ((r = 0; r < rounds; r++)); do
    for c in "${cands[@]}"; do
      IFS='|' read -r d m f <<< "$c"
      x=$(bench_one $d $m $f); R[$c]+=" ${x%% *}"; L[$c]=${x#* }
    done
  done
  for c in "${cands[@]}"; do
    IFS='|' read -r d m f <<< "$c"
    echo "d$d $m [${f:-default}]: $(median ${R[$c]}) (${R[$c]# }) [${L[$c]}]"
  done
fi
if step defaults; then
  forward_tests 150 "Matrix/ForwardGpu.*:ScoreMods/ForwardGpu.*"
  echo "== the new defaults, N = 16K (+${SECONDS}s)"
  for dm in "64 c" "96 n" "96 c" "256 n" "128 n"; do
    echo "d${dm% *} ${dm#* }: $(bench_one $dm)"
  done
fi
if step query; then
  echo "== Q by TMA, persistent or not (+${SECONDS}s)"
  rounds=${FLASHJIT_AB_ROUNDS:-2}
  modes=("kv 0" "kv 1" "qkv 0" "qkv 1")
  for sh in "1024 16" "4096 4" "16384 1"; do
    set -- $sh
    for m in "" --causal; do
      for f in "" "--block-m 128 --block-n 128 --warps 8 --stages 2"; do
        declare -A R=()
        for ((r = 0; r < rounds; r++)); do
          for mode in "${modes[@]}"; do
            R[$mode]+=" $(FLASHJIT_TMA=${mode% *} FLASHJIT_PERSISTENT=${mode#* } timeout 40 $FJ bench --head-dim 128 $m --seq-len $1 --batch $2 --heads 16 $f --json 2>/dev/null | tflops_of)"
          done
        done
        line="N$1 B$2 ${m:-plain} [${f:-default}]:"
        for mode in "${modes[@]}"; do line+=" tma=${mode% *}/p${mode#* } $(median ${R[$mode]})"; done
        echo "$line"
      done
    done
  done
fi
if step peers; then
  peers_forward "${FLASHJIT_PEERS_END:-570}" 40 \
    "${FLASHJIT_PEER_CASES:-128:16384:n:1:16,128:16384:c:1:16,64:16384:n:1:32,96:16384:n:1:21,256:16384:n:1:8,256:16384:c:1:8,128:4096:n:4:16}"
fi
echo "== done (+${SECONDS}s)"
