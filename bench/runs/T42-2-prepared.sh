#!/usr/bin/env bash
# T42-2 (carry [".carry"] after `FLASHJIT_SKIP_BUILD=1 bash
# tools/scripts/gpu-prepare.sh`; command `bash bench/runs/T42-2-prepared.sh`):
# turns at the multi-function unit (FLASHJIT_PING_PONG=3, new): T42-1's ncu
# put softcap's forward at 64.6% of the tensor pipe and 64.6% of the unit
# (xu), both WGs' softmaxes free to meet on the unit. Mode 3 orders them:
# each warpgroup's softmax between bar.sync on its turn barrier (after its
# products are issued) and bar.arrive on the next one's. First the SASS
# order (no MUFU above the BAR.SYNC or below the BAR.ARV) and float64
# checks, then TFLOP/s against the default, two rounds.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T42-2
P="--head-dim 128 --seq-len 8192 --heads 16"
say "SASS of mode 3's softcap kernel: barriers and MUFU runs in order"
FLASHJIT_PING_PONG=3 $FJ compile --head-dim 128 --score-mod softcap:30 --emit cubin -o $OUT/sc3.cubin --target sm_90a
cuobjdump -sass $OUT/sc3.cubin 2>/dev/null | grep -E "BAR|MUFU|HGMMA|DEPBAR|EXIT" | awk '{print $2}' | uniq -c | head -40 | tr '\n' ' '; echo
for a in "--score-mod softcap:30" "--score-mod softcap:30 --causal --seq-len 1000 --seq-len-kv 1537" \
         "--score-mod softcap:2 --gqa 4 --heads 8 --window 300,40" "--causal" ""; do
  say "pp3 float64 [$a]: $(FLASHJIT_PING_PONG=3 check_json --device cuda --head-dim 128 --seq-len 2048 --heads 4 $a)"
done
say "synccheck, pp3 softcap causal: $(FLASHJIT_PING_PONG=3 sanitize 'synccheck' '--head-dim 128 --seq-len 1024 --heads 2 --causal --score-mod softcap:30' | tr '\n' ' ')"
tf() { local a=$1; shift; bench_env "$P $a" "$@" | tflops_of; }
S="--score-mod softcap:30"
for r in 1 2; do
  a=$(tf "$S" X=1) b=$(tf "$S" FLASHJIT_PING_PONG=3)
  say "round $r softcap:30: pp0 $a pp3 $b emu2+pp3 $(tf "$S" FLASHJIT_EXP2_EMULATION=2 FLASHJIT_PING_PONG=3) emu3+pp3 $(tf "$S" FLASHJIT_EXP2_EMULATION=3 FLASHJIT_PING_PONG=3) | plain pp0 $(tf '' X=1) pp3 $(tf '' FLASHJIT_PING_PONG=3)"
  say "round $r causal softcap:30: default $(tf "--causal $S" X=1) pp3 $(tf "--causal $S" FLASHJIT_PING_PONG=3) emu0+pp3 $(tf "--causal $S" FLASHJIT_EXP2_EMULATION=0 FLASHJIT_PING_PONG=3) | causal plain $(tf --causal X=1) pp3 $(tf --causal FLASHJIT_PING_PONG=3)"
done
# ncu only where the turns won the last round (the device time is short).
if python3 -c "import sys; sys.exit(0 if float('$b') > float('$a') else 1)" 2>/dev/null; then
  say "ncu full set, softcap:30 forward with turns at the unit (pp3)"
  FLASHJIT_PING_PONG=3 ncu_stalls fwd-softcap-pp3 '^attention$' $FJ bench $P $S --repeats 1 | sed -n '/Scheduler/,/-- instructions/p'
fi
say done
