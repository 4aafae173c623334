#!/usr/bin/env bash
# T36-4 (carry [".carry"], this session's final C++: O by its tensor map as
# the tiling flag --output-tma; command `bash bench/runs/T36-4-prepared.sh`).
# On an H200: issue 13's bar table beside cuDNN (two rounds), decode.py
# (issue 13's decode bars, last on an H200 in T11), then --output-tma
# against the default at d 96 and 128 (T36-3 on an H100: d 96 +6%). On any
# other card only that A/B, wider. Steps end by ~400 s (budget).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header 4
left() { (( SECONDS - CALL_T0 < $1 )); }
h200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
ab() { # D N B causal(n|c) EXTRA...: default vs --output-tma, two rounds
  local d=$1 n=$2 b=$3 m=""; [[ $4 == c ]] && m=--causal; shift 4
  local a=() o=() r
  for r in 1 2; do
    a+=($(timeout 40 $FJ bench --head-dim $d $m --seq-len $n --batch $b --heads $((2048 / d)) "$@" --json 2>/dev/null | tflops_of))
    o+=($(FLASHJIT_TMA=qkvo timeout 40 $FJ bench --head-dim $d $m --seq-len $n --batch $b --heads $((2048 / d)) "$@" --json 2>/dev/null | tflops_of))
  done
  echo "d $d N $n B $b $m $*: default ${a[*]} | output-tma ${o[*]}"
}
say "the --output-tma flag (d 96, odd rows): tensor_maps and the check"
timeout 40 $FJ run --device cuda --head-dim 96 --seq-len 1000 --heads 3 --output-tma --json 2>/dev/null | tail -1 |
  python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print({k: j.get(k) for k in ("config", "tensor_maps", "rel_err", "ok")})'
if (( h200 )); then
  say "issue 13's forward bars beside cuDNN (TFLOP/s)"
  forward_bars 150
  say "decode"
  timeout 170 python3 -u tests/bench/decode.py --flashjit $FJ --out $OUT/decode.json > $OUT/decode.log 2>&1
  tail -7 $OUT/decode.log | cut -c1-180
  left 340 && { say "output-tma A/B (TFLOP/s)"; ab 96 16384 1 n; ab 128 16384 1 n; ab 96 4096 4 n; }
else
  say "output-tma A/B (TFLOP/s)"
  ab 96 16384 1 n; ab 96 16384 1 c; ab 96 4096 4 n; ab 96 1024 16 n; ab 128 16384 1 n
  left 150 && { ab 80 16384 1 n; ab 112 16384 1 n; ab 64 16384 1 n; }
fi
say done
