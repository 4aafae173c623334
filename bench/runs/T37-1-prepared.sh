#!/usr/bin/env bash
# T37-1 (carry [".carry"], main at b354b89; command
# `bash bench/runs/T37-1-prepared.sh`). On whatever card comes: issue 13's
# forward bar table beside cuDNN (two rounds), decode.py (issue 13's decode
# bars), the per-call overhead (issue 15), then --output-tma against the
# default at d 80 and 96 (NOTES T36, Next 2). Steps end by ~560 s.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T37-1
left() { (( SECONDS - CALL_T0 < $1 )); }
ab() { # D N B causal(n|c): default vs --output-tma, two interleaved rounds
  local d=$1 n=$2 b=$3 m=""; [[ $4 == c ]] && m=--causal
  local a=() o=() r
  for r in 1 2; do
    a+=($(timeout 40 $FJ bench --head-dim $d $m --seq-len $n --batch $b --heads $((2048 / d)) --json 2>/dev/null | tflops_of))
    o+=($(FLASHJIT_TMA=qkvo timeout 40 $FJ bench --head-dim $d $m --seq-len $n --batch $b --heads $((2048 / d)) --json 2>/dev/null | tflops_of))
  done
  echo "d $d N $n B $b $m: default ${a[*]} | output-tma ${o[*]}"
}
say "issue 13's forward bars beside cuDNN (TFLOP/s)"
forward_bars 170
say "decode"
timeout 170 python3 -u tests/bench/decode.py --flashjit $FJ --out $OUT/decode.json > $OUT/decode.log 2>&1
tail -8 $OUT/decode.log | cut -c1-180
left 450 && {
say "overhead (host us a call)"
timeout 80 python3 tests/bench/overhead.py --calls 1000 --rounds 2 \
  --plan-bench $C/bin/flashjit-plan-bench > $OUT/overhead.log 2>&1
grep -E "flashjit.attention|sdpa|plan|cuLaunch" $OUT/overhead.log | head -10 | cut -c1-120
}
left 500 && { say "output-tma A/B (TFLOP/s)"; ab 96 16384 1 n; ab 80 16384 1 n; }
left 540 && ab 96 4096 4 n
say done
