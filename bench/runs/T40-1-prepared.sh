#!/usr/bin/env bash
# T40-1 (carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`; command `bash bench/runs/T40-1-prepared.sh`).
# One call for what T39 left unrun, and the backward's Q/dO ring by tensor
# maps (FLASHJIT_BWD_RING=2; its TMA form is new, FLASHJIT_TMA=0 the
# cp.async form T28 timed):
#  A. the banded softcap forward's default exp2 share (3/8) against float64,
#     then the forward / captured / varlen suites;
#  B. the staged dK/dV stores (FLASHJIT_BWD_STAGED_STORES=1) against
#     float64 (six shapes), racecheck, the backward suite with them;
#  C. the TMA ring likewise, under memcheck (GQA has no ring);
#  D. backward ms (N 8192, H 16, d 128), two interleaved rounds: default,
#     staged, ring by maps; plain, causal, window 1024;
#  E. softcap TFLOP/s: the default share against 0 and 2 eighths;
#  F. ncu: where the default dK/dV kernel's warps stall (N 4096).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T40-1
left() { (( SECONDS - CALL_T0 < $1 )); }
for a in "--score-mod softcap:30 --causal --seq-len 4096" "--score-mod softcap:50 --causal --seq-len 1000 --seq-len-kv 1537" "--score-mod softcap:30 --window 300,0 --seq-len 2048 --gqa 2" "--score-mod softcap:50 --causal --seq-len 1 --seq-len-kv 5000"; do
  say "A $a: $(check_json --head-dim 128 --heads 4 $a)"
done
gpu_suites
bwd_checks() ( # TAG TOOL VAR=VALUE...: float64 checks, a sanitizer, the backward suite
  tag=$1 tool=$2; shift 2
  export "$@"
  for a in "--head-dim 128 --seq-len 2048" "--head-dim 128 --causal --seq-len 300 --seq-len-kv 1000" "--head-dim 64 --seq-len 1500 --window 200,0" "--head-dim 96 --head-dim-v 64 --seq-len 900" "--head-dim 128 --block-sparse 0.3 --seq-len 1024" "--head-dim 128 --score-mod softcap:30 --causal --seq-len 1000"; do
    say "$tag $a: $(check_json --heads 4 --backward $a)"
  done
  sanitize "$tool" "--head-dim 128 --heads 2 --seq-len 700 --seq-len-kv 900 --causal --backward"
  timeout 120 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd-$tag.log 2>&1; echo "exit $?" >> $OUT/bwd-$tag.log
  say "$tag backward suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd-$tag.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd-$tag.log | head -6
)
bwd_checks B-staged racecheck FLASHJIT_BWD_STAGED_STORES=1
bwd_checks C-ring-tma memcheck FLASHJIT_BWD_RING=2
A="--head-dim 128 --seq-len 8192 --heads 16 --backward --json"
ms() { env "$@" timeout 60 $FJ bench $A $M 2>/dev/null | ms_of; }
for r in 1 2; do
  for m in plain causal window; do
    M=""; [[ $m == causal ]] && M=--causal; [[ $m == window ]] && M="--window 1024,0"
    say "D round $r $m backward ms: default $(ms X=1) staged $(ms FLASHJIT_BWD_STAGED_STORES=1) ring-tma $(ms FLASHJIT_BWD_RING=2)"
  done
done
F="--head-dim 128 --seq-len 8192 --heads 16 --json"
tf() { env "$@" timeout 60 $FJ bench $F $M 2>/dev/null | tflops_of; }
M="--causal"; say "E causal TFLOP/s: plain $(tf X=1) | softcap:30 default $(M="--causal --score-mod softcap:30" tf X=1) emu0 $(M="--causal --score-mod softcap:30" tf FLASHJIT_EXP2_EMULATION=0) emu2 $(M="--causal --score-mod softcap:30" tf FLASHJIT_EXP2_EMULATION=2)"
M="--window 4096,0 --score-mod softcap:50"; say "E window 4096 softcap:50 TFLOP/s: default $(tf X=1) emu0 $(tf FLASHJIT_EXP2_EMULATION=0)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -n $NCU ]] && left 440; then
  n=bwd-plain
  say "F ncu full set, the default dK/dV kernel, plain backward N 4096"
  timeout $((575 - (SECONDS - CALL_T0))) "$NCU" --clock-control none --set full --import-source no \
    -k regex:'^attention$' -s 1 -c 1 -f -o "$OUT/$n" \
    $FJ bench --head-dim 128 --seq-len 4096 --heads 16 --backward --repeats 1 > "$OUT/$n-ncu.log" 2>&1 || say "ncu exit $?"
  "$NCU" -i "$OUT/$n.ncu-rep" --csv --page details --print-units base > "$OUT/$n-details.csv" 2>/dev/null
  "$NCU" -i "$OUT/$n.ncu-rep" --csv --page raw --print-units base > "$OUT/$n-raw.csv" 2>/dev/null
  "$NCU" -i "$OUT/$n.ncu-rep" --csv --page source --print-source sass > "$OUT/$n-sass.csv" 2>/dev/null
  python3 tests/bench/ncu_stalls.py "$OUT/$n-details.csv" "$OUT/$n-raw.csv" "$OUT/$n-sass.csv" > "$OUT/$n-summary.txt" 2>&1
  head -60 "$OUT/$n-summary.txt"
  rm -f "$OUT/$n.ncu-rep" "$OUT/$n-raw.csv" "$OUT/$n-sass.csv" "$OUT/$n-details.csv"
fi
say done
