#!/usr/bin/env bash
# Runs THERE (the GPU machine): ncu on one forward (or backward) launch of
# two flashjit builds, A = .carry/bin/flashjit (this tree) and B =
# .carry/ab/bin/flashjit (the base, as for tools/scripts/gpu-ab.sh), for
# each case, and prints one compact table: duration, warp instructions
# executed, tensor-pipe activity, L2 hit rate, DRAM bytes read and the
# main stall reasons per issue. ncu locks the clocks, so only the ratios
# between the rows count. With FLASHJIT_PROFILE_KNOBS="KNOB|KNOB..." (each
# a space-separated list of VAR=VALUE, "-" for none, as gpu-knobs.sh's)
# it profiles build A alone under each setting instead (e.g.
# "-|FLASHJIT_PERSISTENT=1": the causal persistent kernel's L2 traffic).
#
# Usage: bash tools/scripts/gpu-ab-profile.sh CASE ...
#   CASE = "flashjit bench" flags, quoted, e.g. "--head-dim 128 --causal";
#   the problem is --batch 1 --heads 16 --seq-len 16384 unless a case says.
# Only the table is printed (T29-3 lost a call's summaries to a profile
# that printed every column of ncu's CSV).
set -u
cd "$(dirname "$0")/../.." || exit 2
A=.carry/bin/flashjit
B=.carry/ab/bin/flashjit
knobs=()
[[ -n ${FLASHJIT_PROFILE_KNOBS:-} ]] && IFS='|' read -r -a knobs <<<"$FLASHJIT_PROFILE_KNOBS"
((${#knobs[@]})) && B=$A
for f in "$A" "$B"; do
  [[ -x $f ]] || { echo "gpu-ab-profile: $f is missing" >&2; exit 2; }
done
((${#@} > 0)) || { echo "usage: gpu-ab-profile.sh CASE ..." >&2; exit 2; }
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "gpu-ab-profile: no ncu" >&2; exit 2; }
stall=smsp__average_warps_issue_stalled
metrics="gpu__time_duration.sum,smsp__inst_executed.sum"
metrics+=",sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",lts__t_sector_hit_rate.pct,dram__bytes_read.sum"
for s in wait barrier long_scoreboard math_pipe_throttle dispatch_stall; do
  metrics+=",${stall}_${s}_per_issue_active.ratio"
done
problem="--batch 1 --heads 16 --seq-len 16384"
work=$(mktemp -d /tmp/flashjit-ab-profile.XXXXXX)

printf '%-44s %-2s %10s %12s %7s %6s %8s %6s %6s %6s %6s %6s\n' case "" "us" "warp inst" \
  "tensor%" "L2hit%" "DRAM MB" wait barr lscb math disp
rows=(A B)
((${#knobs[@]})) && rows=("${!knobs[@]}")
for c in "$@"; do
  for who in "${rows[@]}"; do
    bin=$A settings=()
    [[ $who == B ]] && bin=$B
    if ((${#knobs[@]})); then
      [[ ${knobs[$who]} != "-" ]] && read -r -a settings <<<"${knobs[$who]}"
      who=K$who
    fi
    root=$(dirname "$(dirname "$bin")")
    env "${settings[@]}" LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      FLASHJIT_CACHE_DIR=$work/cache-$who timeout 120 "$NCU" --metrics "$metrics" \
      --csv --page raw --print-units base -k regex:"^attention" -s 2 -c 1 \
      "$bin" bench $problem $c --repeats 3 >"$work/$who.csv" 2>/dev/null
    python3 - "$work/$who.csv" "$c" "$who" <<'PY'
import csv, sys
path, case, who = sys.argv[1:4]
rows = list(csv.reader(l for l in open(path) if l.startswith('"')))
if len(rows) < 3:
    print(f"{case[:44]:<44} {who:<2} no ncu rows"); sys.exit()
r = dict(zip(rows[0], rows[-1]))
def num(key):
    v = r.get(key, "").replace(",", "")
    try: return float(v)
    except ValueError: return float("nan")
s = "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio"
print(f"{case[:44]:<44} {who:<2} {num('gpu__time_duration.sum') / 1e3:10.1f} "
      f"{num('smsp__inst_executed.sum'):12.4g} "
      f"{num('sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'):7.1f} "
      f"{num('lts__t_sector_hit_rate.pct'):6.1f} {num('dram__bytes_read.sum') / 1e6:8.1f} "
      + " ".join(f"{num(s % k):6.2f}" for k in
                 ("wait", "barrier", "long_scoreboard", "math_pipe_throttle", "dispatch_stall")))
PY
  done
done
rm -rf "$work"
