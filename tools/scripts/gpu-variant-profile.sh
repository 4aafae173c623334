#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh` here; device
# call with carry [".carry"]: bash tools/scripts/gpu-variant-profile.sh
#
# Where the forward variants' cost over the plain kernel goes (issue 14's
# 10% bar), measured before any change is made for it:
#   1. ncu on one forward launch each of plain, alibi:16, softcap:30 and
#      the document mask (B 1, H 16, N 8192, d 128, bf16): duration, the
#      issue-slot use of the XU (transcendentals and int<->float
#      conversions), FMA, ALU and tensor pipes, instructions executed and
#      the top warp stall reasons -> $OUT/profile-<variant>.csv, and a
#      table of the main figures printed last
#   2. python: the document mask through flashjit.attention timed three
#      ways (GPU events around one call, a host loop of 50 calls, and the
#      kernels torch.profiler sees) -> $OUT/document-host.log
# Environment: FLASHJIT_PROFILE_STEPS (default ncu,python).
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
steps=${FLASHJIT_PROFILE_STEPS:-ncu,python}
has() { [[ ",$steps," == *",$1,"* ]]; }
say() { echo "[gpu-variant-profile +${SECONDS}s] $*"; }

shape="--batch 1 --heads 16 --seq-len 8192 --head-dim 128"
python3 -c 'import numpy as np
n, l, k = 8192, [], 0
while sum(l) < n:
    l.append(min(1024 + 1024 * (k % 3), n - sum(l))); k += 1
np.save("'"$OUT"'/seg8192.npy", np.repeat(np.arange(len(l)), l).astype(np.int32))'

if has ncu; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  # The pipe metrics that this ncu has (names differ between versions).
  want=$("$NCU" --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' |
    grep -E '^(sm__inst_executed_pipe_(xu|fma|alu|fmaheavy|fp16|uniform)|sm__pipe_tensor_op_(gmma|hmma)_cycles_active|sm__pipe_(fma|alu|xu|shared)_cycles_active|smsp__inst_executed|sm__cycles_elapsed|gpu__time_duration)$' |
    sort -u)
  metrics=""
  for m in $want; do
    case $m in
      gpu__time_duration) metrics+="$m.sum," ;;
      sm__cycles_elapsed|smsp__inst_executed) metrics+="$m.sum,$m.avg," ;;
      *) metrics+="$m.avg.pct_of_peak_sustained_active,$m.sum," ;;
    esac
  done
  metrics+="smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,"
  metrics+="smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio"
  say "metrics: $metrics"
  while read -r name args; do
    [[ -z $name ]] && continue
    timeout 150 "$NCU" --metrics "$metrics" --csv --page raw -k regex:"^attention$" -s 2 -c 1 \
      "$FJ" bench $shape $args --repeats 3 >"$OUT/profile-$name.csv" 2>"$OUT/profile-$name.err"
    say "$name: ncu exit $? ($(wc -l <"$OUT/profile-$name.csv") lines)"
  done <<CASES
plain
alibi --score-mod alibi:16
softcap --score-mod softcap:30
document --mask-mod document --capture $OUT/seg8192.npy --mask-blocks
CASES
  # The executed instructions by opcode (one launch each; a separate call
  # so that an ncu without the metric loses only this).
  for name in plain alibi softcap; do
    args=""; [[ $name == alibi ]] && args="--score-mod alibi:16"; [[ $name == softcap ]] && args="--score-mod softcap:30"
    timeout 100 "$NCU" --metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum --print-metric-instances values \
      -k regex:"^attention$" -s 2 -c 1 "$FJ" bench $shape $args --repeats 3 >"$OUT/opcodes-$name.txt" 2>&1
    say "$name opcodes: ncu exit $?"
  done
  python3 - "$OUT" <<'PY'
import csv, glob, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "profile-*.csv"))):
    name = os.path.basename(f)[8:-4]
    lines = [l for l in open(f) if l.startswith('"')]
    if len(lines) < 3:
        print(f"{name}: no ncu rows; see profile-{name}.err"); continue
    r = list(csv.reader(lines))
    head, data = r[0], r[-1]
    rows[name] = dict(zip(head, data))
keys = sorted({k for v in rows.values() for k in v if "__" in k})
names = list(rows)
print("| metric | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for k in keys:
    print(f"| {k} | " + " | ".join(rows[n].get(k, "-") for n in names) + " |")
for f in sorted(glob.glob(os.path.join(out, "opcodes-*.txt"))):
    text = open(f).read()
    i = text.find("sass__inst_executed_per_opcode")
    print(os.path.basename(f), text[i:i + 1500].replace("\n", " ")[:1500] if i >= 0 else text[-600:])
PY
fi

if has python; then
  say "document mask through flashjit.attention: device vs host time"
  timeout -k 5 150 python3 - "$OUT/seg8192.npy" >"$OUT/document-host.log" 2>&1 <<'PY'
import sys, time
import numpy as np, torch
import flashjit
seg = torch.from_numpy(np.load(sys.argv[1]).astype(np.int64)).cuda()
q, k, v = [torch.randn(1, 16, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
def document(b, h, i, j):
    return seg[i] == seg[j]
bm = flashjit.create_block_mask(document, None, None, 8192, 8192, device="cuda")
def call():
    return flashjit.attention(q, k, v, mask_mod=document, block_mask=bm)
for _ in range(5):
    call()
torch.cuda.synchronize()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ev = []
for _ in range(20):
    e0.record(); call(); e1.record(); torch.cuda.synchronize(); ev.append(e0.elapsed_time(e1))
print("one call, events, ms: median %.3f min %.3f" % (sorted(ev)[10], min(ev)))
t = time.perf_counter()
for _ in range(50):
    call()
host = (time.perf_counter() - t) / 50
torch.cuda.synchronize()
wall = (time.perf_counter() - t) / 50
print("50 calls: host %.1f us per call (to return), wall %.3f ms per call (to sync)" % (host * 1e6, wall * 1e3))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        call()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12))
PY
  echo "exit $?" >>"$OUT/document-host.log"
  grep -E "one call|50 calls|exit" "$OUT/document-host.log"
fi
say done
