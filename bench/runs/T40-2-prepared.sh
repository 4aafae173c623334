#!/usr/bin/env bash
# T40-2 (carry [".carry"], the build with the staged dK/dV stores on by
# default; command `bash bench/runs/T40-2-prepared.sh`): issue 14's
# backward bars beside FlexAttention with the new default (variants.py
# plain, window, document; N 8192, H 16, d 128), the backward with the
# stores off in the same call (CLI, ms), and the banded softcap's share:
# two interleaved rounds of 0, 2 and the default 3 eighths (causal
# softcap:30, window 4096 softcap:50; T40-1 had one round each).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T40-2
say "staged default, backward check: $(check_json --head-dim 128 --heads 4 --backward --seq-len 1000 --causal)"
A="--head-dim 128 --seq-len 8192 --heads 16 --backward --json"
ms() { env "$@" timeout 60 $FJ bench $A $M 2>/dev/null | ms_of; }
M="--window 1024,0"; say "window backward ms: default $(ms X=1) off $(ms FLASHJIT_BWD_STAGED_STORES=0) default $(ms X=1) off $(ms FLASHJIT_BWD_STAGED_STORES=0)"
F="--head-dim 128 --seq-len 8192 --heads 16 --json"
tf() { env "$@" timeout 60 $FJ bench $F $M 2>/dev/null | tflops_of; }
for r in 1 2; do
  M="--causal --score-mod softcap:30"; c="emu0 $(tf FLASHJIT_EXP2_EMULATION=0) emu2 $(tf FLASHJIT_EXP2_EMULATION=2) default(3) $(tf X=1)"
  M="--window 4096,0 --score-mod softcap:50"; w="emu0 $(tf FLASHJIT_EXP2_EMULATION=0) emu2 $(tf FLASHJIT_EXP2_EMULATION=2) default(3) $(tf X=1)"
  say "round $r TFLOP/s causal softcap:30: $c | window 4096 softcap:50: $w"
done
timeout 240 python3 tests/bench/variants.py --json $OUT/variants.json --variants plain,window,document > $OUT/variants.log 2>&1
echo "variants exit $?"
grep -A30 '^variants, bf16' $OUT/variants.log | cut -c1-170
say done
