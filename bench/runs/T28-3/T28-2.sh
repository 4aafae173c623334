#!/usr/bin/env bash
# T28 call 2 (THERE): the forward's rescale threshold (A = this tree, B =
# .carry/ab = 9dc08ac without it): every forward GPU suite in shards with
# the backward, captured and ring-2 backward suites beside; then alone:
# A/B timing of forwards, the per-call overhead (packed launch off/on),
# the document mask's Python time with and without a sync per call.
set -u
cd "$(dirname "$0")/.." || exit 2
[[ -f .carry/ab/lib/libflashjit.so.gz && ! -f .carry/ab/lib/libflashjit.so ]] && gzip -dc .carry/ab/lib/libflashjit.so.gz > .carry/ab/lib/libflashjit.so
chmod +x .carry/ab/bin/* 2>/dev/null
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
T0=$SECONDS
say() { echo "[2 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
gt() { # LOG BIN LIMIT [ENV...]
  local log=$1 bin=$2 lim=$3; shift 3
  env "$@" timeout $lim $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log
}
for i in 0 1 2 3; do gt fwd$i forward 150 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
gt backward backward 150 & gt captured captured 150 & gt ring backward 150 FLASHJIT_BWD_RING=2 &
wait
for l in fwd0 fwd1 fwd2 fwd3 backward captured ring; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -5
done
say "A/B forward (A = rescale threshold 8, B = 9dc08ac), TFLOP/s"
FLASHJIT_AB_ROUNDS=2 timeout 200 bash tools/scripts/gpu-ab.sh \
  "--head-dim 128 --seq-len 8192" "--head-dim 128 --seq-len 8192 --score-mod alibi:16" \
  "--head-dim 128 --seq-len 8192 --score-mod softcap:30" "--head-dim 128 --causal" \
  "--head-dim 128" "--head-dim 128 --seq-len 1024 --batch 16" 2>&1 | tail -9
say "overhead (packed launch off, then on)"
for pk in 0 1; do
  FLASHJIT_PACKED_LAUNCH=$pk timeout 75 python3 tests/bench/overhead.py --calls 1000 --rounds 2 --parts \
    --plan-bench $C/bin/flashjit-plan-bench > $OUT/overhead-$pk.log 2>&1
  echo "packed=$pk exit $?"; grep -E "^\|" $OUT/overhead-$pk.log | head -16
done
say "document mask from Python: per call with and without a sync"
timeout 90 python3 - <<'PY' 2>&1 | tail -12
import time, torch, flashjit
n=8192
lengths, total, k = [], 0, 0
while total < n:
    lengths.append(min(1024 + 1024 * (k % 3), n - total)); total += lengths[-1]; k += 1
seg = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))
q, k_, v = [torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
def document(b, h, i, j): return seg[i] == seg[j]
bm = flashjit.create_block_mask(document, None, None, n, n, device="cuda")
call = lambda: flashjit.attention(q, k_, v, mask_mod=document, block_mask=bm)
for _ in range(5): call()
torch.cuda.synchronize()
for sync in (True, False, True, False):
    t = time.perf_counter()
    for _ in range(40):
        call()
        if sync: torch.cuda.synchronize()
    torch.cuda.synchronize()
    print("sync per call" if sync else "no sync      ", "%.3f ms per call" % ((time.perf_counter() - t) / 40 * 1e3))
e = [torch.cuda.Event(enable_timing=True) for _ in range(41)]
for i in range(40):
    e[i].record(); call()
e[40].record(); torch.cuda.synchronize()
d = sorted(e[i].elapsed_time(e[i + 1]) for i in range(40))
print("events between back-to-back calls: median %.3f min %.3f max %.3f ms" % (d[20], d[0], d[-1]))
PY
say done
