#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh): what each technique of the
# sm_90a forward gives (issue 13's ablation, as the FA3 paper's Table 2),
# and the tuner at short sequences. Device call:
#   carry [".carry"], command: bash tools/scripts/gpu-ablation.sh
# Steps (FLASHJIT_ABLATION_STEPS, comma-separated; default both):
#   ablation  d = 128, N = 16K, B = 1, H = 16, plain and causal, median of
#             FLASHJIT_AB_ROUNDS (2) interleaved rounds, TFLOP/s
#             [registers spill bytes], each technique added to the last:
#               mma.sync   FLASHJIT_WGMMA=0 (sm_80's kernel), default tiling
#               wgmma      FLASHJIT_KV_RING=0, 128x128 on 8 warps
#               ring       128x128/8, 2 stages, FLASHJIT_PING_PONG=0
#               ping-pong  the same with the consumers' turns
#               nvjitlink  + --overlap-softmax, assembled by nvJitLink
#               overlap    + --overlap-softmax, the driver's JIT (default)
#   short     `flashjit tune` (its table) at d = 128, N = 1024 B = 16 and
#             N = 4096 B = 4, H = 16, plain and causal
#   peers     side_by_side.py, forward, default tilings, at those shapes
#             (FLASHJIT_PEER_CASES) -> $OUT/bench.json
#   persistent  the ForwardPersistentGpu tests, then TFLOP/s [spill bytes]
#             at d = 128, H = 16, N = 1024 B = 16, N = 4096 B = 4 and
#             N = 16K B = 1, plain and causal, of the default tiling and
#             the ring at 128x128/8 (2 stages), each without and with
#             FLASHJIT_PERSISTENT=1 (not in the default steps)
#   pingpong  the ring at 128x128/8, 2 stages, FLASHJIT_PING_PONG=0 and 1,
#             without and with --overlap-softmax (d = 128's default), d = 128, H = 16, N = 16K B = 1
#             and N = 4096 B = 4, plain and causal, median of
#             FLASHJIT_AB_ROUNDS interleaved rounds (not in the defaults)
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_ABLATION_STEPS:-ablation,short,peers}
if step ablation; then
  echo "== ablation, d = 128, N = 16K, B = 1, H = 16 (+${SECONDS}s)"
  rounds=${FLASHJIT_AB_ROUNDS:-2}
  t="--block-m 128 --block-n 128 --warps 8"
  names=(mma.sync wgmma ring ping-pong nvjitlink overlap)
  runs=("FLASHJIT_WGMMA=0|"
        "FLASHJIT_KV_RING=0|$t"
        "FLASHJIT_PING_PONG=0|$t --stages 2"
        "|$t --stages 2"
        "FLASHJIT_ASSEMBLER=nvjitlink|$t --stages 2 --overlap-softmax"
        "|$t --stages 2 --overlap-softmax")
  for m in n c; do
    declare -A R=() last=()
    for ((r = 0; r < rounds; r++)); do
      for i in "${!runs[@]}"; do
        pre=${runs[$i]%%|*}; flags=${runs[$i]#*|}
        x=$(eval "$pre bench_one 128 $m $flags")
        R[$i]+=" ${x%% *}"; last[$i]=${x#* }
      done
    done
    for i in "${!runs[@]}"; do
      echo "d128 $m ${names[$i]}: $(median ${R[$i]}) [${last[$i]}]"
    done
  done
fi
if step short; then
  echo "== the tuner at short sequences, d = 128, H = 16 (+${SECONDS}s)"
  export FLASHJIT_AUTOTUNE=1
  for nb in "1024 16" "4096 4"; do
    set -- $nb
    for m in "" --causal; do
      echo "-- N = $1, B = $2 ${m:-plain}"
      timeout 90 $FJ tune --head-dim 128 $m --seq-len $1 --batch $2 --heads 16 2>&1 | tail -22
    done
  done
fi
if step persistent; then
  forward_tests 150 "*Persistent*"
  echo "== persistent A/B, d = 128, H = 16 (+${SECONDS}s)"
  ring="--block-m 128 --block-n 128 --warps 8 --stages 2"
  for nb in "1024 16" "4096 4" "16384 1"; do
    set -- $nb
    for m in "" --causal; do
      line="N$1 B$2 ${m:-plain}:"
      for cfg in "0|" "1|" "0|$ring" "1|$ring"; do
        p=${cfg%%|*}; f=${cfg#*|}
        r=$(FLASHJIT_PERSISTENT=$p timeout 30 $FJ bench --head-dim 128 $m --seq-len $1 --batch $2 --heads 16 $f --json 2>/dev/null | tail -1 |
          python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("%.1f [%s]" % (j["tflops"], j.get("spill_bytes")))
except Exception: print("fail")')
        label=default; [[ -n $f ]] && label=ring
        line+=" $label persistent=$p $r;"
      done
      echo "$line"
    done
  done
fi
if step pingpong; then
  echo "== ping-pong A/B, d = 128, H = 16 (+${SECONDS}s)"
  rounds=${FLASHJIT_AB_ROUNDS:-2}
  t="--block-m 128 --block-n 128 --warps 8 --stages 2"
  cfgs=("0|$t" "1|$t" "0|$t --overlap-softmax" "1|$t --overlap-softmax")
  for nb in "16384 1" "4096 4"; do
    set -- $nb
    for m in "" --causal; do
      declare -A R=()
      for ((r = 0; r < rounds; r++)); do
        for cfg in "${cfgs[@]}"; do
          R[$cfg]+=" $(FLASHJIT_PING_PONG=${cfg%%|*} timeout 30 $FJ bench --head-dim 128 $m --seq-len $1 --batch $2 --heads 16 ${cfg#*|} --json 2>/dev/null | tail -1 |
            python3 -c 'import json,sys
try: print("%.1f" % json.loads(sys.stdin.read())["tflops"])
except Exception: print("fail")')"
        done
      done
      line="N$1 B$2 ${m:-plain}:"
      for cfg in "${cfgs[@]}"; do
        o=""; [[ $cfg == *overlap* ]] && o=" overlap"
        line+=" pp${cfg%%|*}$o $(median ${R[$cfg]}) (${R[$cfg]# });"
      done
      echo "$line"
    done
  done
fi
if step peers; then
  echo "== peers, forward, default tilings (+${SECONDS}s)"
  export FLASHJIT_AUTOTUNE=0
  left=$((560 - SECONDS)); ((left < 60)) && left=60
  timeout -k 5 $left python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --budget-s 60 \
    --cases "${FLASHJIT_PEER_CASES:-128:1024:n:16:16,128:1024:c:16:16,128:4096:n:4:16,128:4096:c:4:16}" > $OUT/bench.log 2>&1
  tail -12 $OUT/bench.log
fi
echo "== done (+${SECONDS}s)"
