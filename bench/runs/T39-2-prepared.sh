#!/usr/bin/env bash
# T39-2 (carry [".carry"], the build of 7b56aca; command `bash
# bench/runs/T39-2-prepared.sh`). Softcap:30's forward with no code change:
# the tuner's whole space at N 8192 (H 16, d 128), then the default
# (overlapped, 2 consumer warpgroups) against three consumer warpgroups
# (Br 192, 12 warps, no overlap) and a share of P's exponentials emulated
# (FLASHJIT_EXP2_EMULATION), two rounds, TFLOP/s, plain beside.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T39-2
export FLASHJIT_CACHE_DIR=$(mktemp -d)
A="--head-dim 128 --seq-len 8192 --heads 16"
timeout 150 $FJ tune $A --score-mod softcap:30 > $OUT/tune.log 2>&1; echo "exit $?" >> $OUT/tune.log
grep -vE '^\s*$' $OUT/tune.log | tail -40 | cut -c1-150
export FLASHJIT_CACHE_DIR=$(mktemp -d)
say "softcap:30 192x128/12 against float64: $(check_json --head-dim 128 --heads 4 --seq-len 1000 --seq-len-kv 1537 --causal --score-mod softcap:30 --block-m 192 --block-n 128 --warps 12)"
b() { timeout 60 $FJ bench $A --json "$@" 2>/dev/null | tflops_of; }
for r in 1 2; do
  say "round $r plain $(b) | softcap $(b --score-mod softcap:30) emu2 $(FLASHJIT_EXP2_EMULATION=2 b --score-mod softcap:30) emu3 $(FLASHJIT_EXP2_EMULATION=3 b --score-mod softcap:30) | 192x128/12 $(b --score-mod softcap:30 --block-m 192 --block-n 128 --warps 12) 192x64/12 $(b --score-mod softcap:30 --block-m 192 --block-n 64 --warps 12) 192x128/12 emu2 $(FLASHJIT_EXP2_EMULATION=2 b --score-mod softcap:30 --block-m 192 --block-n 128 --warps 12) | plain 192x128/12 $(b --block-m 192 --block-n 128 --warps 12)"
done
say "causal: plain $(b --causal) softcap $(b --causal --score-mod softcap:30) 192x128/12 $(b --causal --score-mod softcap:30 --block-m 192 --block-n 128 --warps 12) emu3 $(FLASHJIT_EXP2_EMULATION=3 b --causal --score-mod softcap:30)"
say done
