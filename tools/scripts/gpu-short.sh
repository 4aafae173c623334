#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh): where the time of the short
# shapes goes (issue 13: d = 128, N = 1024, B = 16 runs at 0.70x cuDNN).
# Device call: carry [".carry"], command: bash tools/scripts/gpu-short.sh
# Steps (FLASHJIT_SHORT_STEPS, comma-separated; default all):
#   prof     ncu (full set, clocks left alone) of one flashjit launch of the
#            shape and of cuDNN's kernel of the same shape; exported as
#            $OUT/<name>-details.csv and the per-instruction stall samples
#            $OUT/<name>-sass.csv; tests/bench/ncu_stalls.py prints the
#            launch figures, the stall reasons and the hottest instructions
#   prof-kv  (not in the default) the flashjit profile alone at Nq = 1024,
#            B = 16, H = 16 and each Nkv of FLASHJIT_SHORT_NKV (128 1024)
#   nkv      flashjit bench at Nq = 1024, B = 16, H = 16 for Nkv = 128 ..
#            4096: time = fixed + slope * Nkv separates a tile's fixed cost
#   tilings  TFLOP/s of other tilings and switches at the shape
#   hf       the Hugging Face sinks test (s_aux -> sinks)
# and, not in the default, for the output stored through shared memory
# (KernelPlacement::stagedStores; FLASHJIT_STAGED_STORES=0 turns it off):
#   tests    every forward GPU test, then the runtime GPU tests
#   shards   every forward GPU test in FLASHJIT_SHARDS (3) concurrent
#            shards (their compiles are most of the time), then the runtime
#            GPU tests and python/tests/test_torch_plans_gpu.py
#   sanitize memcheck and racecheck on staged stores (ring, GQA, Nq != Nkv;
#            the 4-warp tiling; fp16 with a window)
#   ab       TFLOP/s with FLASHJIT_STAGED_STORES=0 and 1, median of
#            FLASHJIT_AB_ROUNDS (2) interleaved rounds: d = 128 at N = 1024
#            B = 16, N = 4096 B = 4, N = 16K B = 1 (H = 16), plain and
#            causal; d = 64, 96, 256 at N = 16K (H = 2048 / d)
#   explore  one round each at d = 128, N = 1024 B = 16 and N = 4096 B = 4
#            (H = 16): the default, persistent, Q by TMA, 192 x 128 / 12
#   peers    side_by_side.py, forward, FLASHJIT_PEER_CASES until
#            FLASHJIT_PEERS_END (570) seconds
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_SHORT_STEPS:-prof,nkv,tilings,hf}
SHAPE=(--head-dim 128 --seq-len 1024 --batch 16 --heads 16)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# profile NAME KERNEL-REGEX CMD...: a full-set report of one launch (after
# two, or with NCU_EXTRA's options), exported.
profile() {
  local name=$1 kern=$2; shift 2
  timeout 180 "$NCU" --clock-control none --set full --import-source no -k "$kern" ${NCU_EXTRA:--s 2} -c 1 -f \
    -o "$OUT/$name" "$@" > "$OUT/$name-ncu.log" 2>&1 || echo "ncu $name: exit $?"
  "$NCU" -i "$OUT/$name.ncu-rep" --csv --page details --print-units base > "$OUT/$name-details.csv" 2>>"$OUT/$name-ncu.log"
  "$NCU" -i "$OUT/$name.ncu-rep" --csv --page raw --print-units base > "$OUT/$name-raw.csv" 2>>"$OUT/$name-ncu.log"
  "$NCU" -i "$OUT/$name.ncu-rep" --csv --page source --print-source sass > "$OUT/$name-sass.csv" 2>>"$OUT/$name-ncu.log" ||
    "$NCU" -i "$OUT/$name.ncu-rep" --csv --page source --print-source=sass > "$OUT/$name-sass.csv" 2>>"$OUT/$name-ncu.log"
  python3 tests/bench/ncu_stalls.py "$OUT/$name-details.csv" "$OUT/$name-raw.csv" "$OUT/$name-sass.csv" \
    > "$OUT/$name-summary.txt" 2>&1
  head -80 "$OUT/$name-summary.txt"
  # Few files come back from a device call: keep the summaries and the
  # compact instruction lists unless asked for the rest.
  [[ ${FLASHJIT_SHORT_KEEP:-0} == 1 ]] ||
    rm -f "$OUT/$name.ncu-rep" "$OUT/$name-raw.csv" "$OUT/$name-sass.csv" "$OUT/$name-details.csv" "$OUT/$name-ncu.log"
}
if step prof-kv; then
  # flashjit alone at Nkv = FLASHJIT_SHORT_NKV's values (default 128 1024):
  # at Nkv = 128 a tile's fixed cost is most of the time.
  for m in ${FLASHJIT_SHORT_NKV:-128 1024}; do
    echo "== ncu, flashjit Nkv $m (+${SECONDS}s)"
    profile fj$m regex:attention $FJ bench "${SHAPE[@]}" --seq-len-kv $m --repeats 3
  done
fi
if step prof; then
  echo "== ncu, flashjit (+${SECONDS}s): $NCU"
  if [[ -z $NCU ]]; then echo "ncu not found"; else
    profile fj1024 regex:attention $FJ bench "${SHAPE[@]}" --repeats 3
    echo "== ncu, cuDNN (+${SECONDS}s)"
    NCU_EXTRA="--profile-from-start off" profile cudnn1024 "regex:cudnn|fmha|sm90|flash|attn" \
      python3 tests/bench/side_by_side.py --ncu-target sdpa-cudnn --cases 128:1024:n:16:16
    echo "== ncu, flashjit N = 16K (+${SECONDS}s)"
    profile fj16k regex:attention $FJ bench --head-dim 128 --seq-len 16384 --batch 1 --heads 16 --repeats 3
  fi
fi
if step nkv; then
  echo "== Nq 1024 B 16 H 16 d 128, Nkv sweep: flashjit (+${SECONDS}s)"
  for m in 128 256 512 1024 2048 4096; do
    r=$(timeout 60 $FJ bench "${SHAPE[@]}" --seq-len-kv $m --json 2>/dev/null | tail -1 |
      python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("%.1f TFLOP/s %.2f us" % (j["tflops"], j["time_ms"]*1e3))
except Exception as e: print("fail", e)')
    echo "Nkv $m: $r"
  done
fi
if step tilings; then
  echo "== tilings at N 1024 B 16 (+${SECONDS}s)"
  for t in "" "--block-m 128 --block-n 128 --warps 8 --stages 2" "--block-m 128 --block-n 128 --warps 8 --stages 3 --overlap-softmax" \
    "--block-m 128 --block-n 64 --warps 8 --stages 2" "--block-m 128 --block-n 64 --warps 8 --stages 4" \
    "--block-m 192 --block-n 128 --warps 12 --stages 2" "--block-m 64 --block-n 128 --warps 4"; do
    echo "[$t] $(timeout 60 $FJ bench "${SHAPE[@]}" $t --json 2>/dev/null | tflops_of)"
  done
  echo "[FLASHJIT_PING_PONG=0] $(FLASHJIT_PING_PONG=0 timeout 60 $FJ bench "${SHAPE[@]}" --json 2>/dev/null | tflops_of)"
  echo "[FLASHJIT_TMA=qkv FLASHJIT_PERSISTENT=1] $(FLASHJIT_TMA=qkv FLASHJIT_PERSISTENT=1 timeout 60 $FJ bench "${SHAPE[@]}" --json 2>/dev/null | tflops_of)"
fi
if step hf; then
  echo "== python: HF sinks test (+${SECONDS}s)"
  timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider python/tests/test_hf_gpu.py -k sinks \
    > $OUT/hf-sinks.log 2>&1
  echo "exit $?" >> $OUT/hf-sinks.log
  grep -E "FAILED|passed|failed|exit|Error" $OUT/hf-sinks.log | tail -8
fi
if step tests; then
  forward_tests 330 "*"
  runtime_tests
fi
if step shards; then
  n=${FLASHJIT_SHARDS:-3}
  echo "== forward GPU tests in $n shards (+${SECONDS}s)"
  for ((i = 0; i < n; ++i)); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout 420 $C/bin/flashjit-forward-gpu-tests --gtest_brief=1 \
      --gtest_color=no > $OUT/tests-$i.log 2>&1 &
  done
  wait
  for ((i = 0; i < n; ++i)); do
    echo "shard $i: $(grep -E "FAILED|PASSED|tests ran" $OUT/tests-$i.log | tr '\n' ' ')"
  done
  runtime_tests
  echo "== python: test_torch_plans_gpu.py (+${SECONDS}s)"
  timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_plans_gpu.py > $OUT/python-plans.log 2>&1
  echo "exit $?" >> $OUT/python-plans.log
  grep -E "FAILED|passed|failed|exit" $OUT/python-plans.log | tail -5
fi
if step sanitize; then
  echo "== sanitizers (+${SECONDS}s)"
  sanitize "memcheck racecheck" \
    "--head-dim 128 --causal --gqa 2 --heads 2 --seq-len 300 --seq-len-kv 700" \
    "--head-dim 64 --block-m 64 --block-n 128 --warps 4 --seq-len 333" \
    "--head-dim 96 --dtype fp16 --window 50,20 --seq-len 333"
fi
if step ab; then
  echo "== staged stores A/B (+${SECONDS}s): TFLOP/s off / on"
  rounds=${FLASHJIT_AB_ROUNDS:-2}
  for sh in "128 1024 16 16 n" "128 1024 16 16 c" "128 4096 4 16 n" "128 4096 4 16 c" "128 16384 1 16 n" \
    "128 16384 1 16 c" "64 16384 1 32 n" "96 16384 1 21 n" "256 16384 1 8 n"; do
    read -r d n bb hh m <<< "$sh"
    mask=""; [[ $m == c ]] && mask=--causal
    declare -A got=()
    for ((r = 0; r < rounds; ++r)); do
      for e in 0 1; do
        got[$e]+=" $(FLASHJIT_STAGED_STORES=$e timeout 60 $FJ bench --head-dim $d $mask --seq-len $n --batch $bb --heads $hh --json 2>/dev/null | tflops_of)"
      done
    done
    echo "d$d N$n B$bb H$hh $m: $(median ${got[0]}) / $(median ${got[1]})  (rounds:${got[0]} /${got[1]})"
    unset got
  done
fi
if step explore; then
  echo "== explore, staged stores on (+${SECONDS}s)"
  for sh in "1024 16 n" "1024 16 c" "4096 4 n" "4096 4 c"; do
    read -r n bb m <<< "$sh"
    mask=""; [[ $m == c ]] && mask=--causal
    a=(--head-dim 128 $mask --seq-len $n --batch $bb --heads 16 --json)
    echo "N$n B$bb $m: default $(timeout 60 $FJ bench "${a[@]}" 2>/dev/null | tflops_of)" \
      "persistent $(FLASHJIT_PERSISTENT=1 timeout 60 $FJ bench "${a[@]}" 2>/dev/null | tflops_of)" \
      "persistent+qkv $(FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv timeout 60 $FJ bench "${a[@]}" 2>/dev/null | tflops_of)" \
      "192x128/12 $(timeout 60 $FJ bench "${a[@]}" --block-m 192 --block-n 128 --warps 12 --stages 2 2>/dev/null | tflops_of)" \
      "192x128/12 persistent $(FLASHJIT_PERSISTENT=1 timeout 60 $FJ bench "${a[@]}" --block-m 192 --block-n 128 --warps 12 --stages 2 2>/dev/null | tflops_of)"
  done
fi
if step peers; then
  peers_forward "${FLASHJIT_PEERS_END:-570}" 30 \
    "${FLASHJIT_PEER_CASES:-128:1024:n:16:16,128:1024:c:16:16,128:4096:n:4:16,128:4096:c:4:16}"
fi
echo "== done (+${SECONDS}s)"
