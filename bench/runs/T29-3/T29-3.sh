#!/usr/bin/env bash
# T29 call 3 (THERE): the overlapped loop with its last block's softmax
# skipped (f8c5104). Forward suite in four shards beside the captured
# suite; racecheck; then alone: A/B (A = f8c5104, B = .carry/ab =
# a08826f, the session's start), ncu of the causal forward in both, and
# the d = 128 bar shapes beside cuDNN.
set -u
cd "$(dirname "$0")/.." || exit 2
[[ -f .carry/ab/lib/libflashjit.so.gz && ! -f .carry/ab/lib/libflashjit.so ]] && gzip -dc .carry/ab/lib/libflashjit.so.gz > .carry/ab/lib/libflashjit.so
chmod +x .carry/ab/bin/* 2>/dev/null
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
T0=$SECONDS
say() { echo "[3 +$((SECONDS - T0))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
gt() { # LOG BIN LIMIT [ENV...]
  local log=$1 bin=$2 lim=$3; shift 3
  env "$@" timeout $lim $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
  echo "exit $?" >> $OUT/t-$log.log
}
for i in 0 1 2 3; do gt fwd$i forward 140 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
gt captured captured 140 &
wait
for l in fwd0 fwd1 fwd2 fwd3 captured; do
  say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -5
done
rm -f $OUT/t-*.log
W="--block-m 128 --block-n 128 --warps 8"
sanitize "racecheck memcheck" "--head-dim 128 $W --overlap-softmax --causal --seq-len 300 --seq-len-kv 333 --json"
rm -f $OUT/san.log
say "A/B forward (A = f8c5104, B = a08826f), TFLOP/s"
FLASHJIT_AB_ROUNDS=2 timeout 170 bash tools/scripts/gpu-ab.sh \
  "--head-dim 128" "--head-dim 128 --causal" "--head-dim 128 --causal $W" \
  "--head-dim 128 --seq-len 1024 --batch 16" "--head-dim 128 --seq-len 1024 --batch 16 --causal" \
  "--head-dim 128 --seq-len 1024 --batch 16 $W" "--head-dim 128 --seq-len 4096 --batch 4" 2>&1 | tail -9
say "ncu: the causal forward, A then B"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
m=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
m+=,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
m+=,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio
for who in A B; do
  bin=$C/bin/flashjit; lib=$C/lib
  [[ $who == B ]] && bin=$C/ab/bin/flashjit && lib=$C/ab/lib
  for c in "--causal" ""; do
    LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-} FLASHJIT_CACHE_DIR=/tmp/ncu-$who timeout 80 $NCU --metrics $m --csv --page raw \
      -k regex:"^attention$" -s 2 -c 1 $bin bench --head-dim 128 --seq-len 16384 --heads 16 $c --repeats 3 > $OUT/ncu.csv 2>/dev/null
    echo "$who ${c:-plain}: $(grep '^"' $OUT/ncu.csv | tail -1 | cut -c1-20) exit $?"
    python3 - $OUT/ncu.csv <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if len(rows) >= 3:
    for k, v in zip(rows[0], rows[-1]):
        if "__" in k: print("   ", k, v)
PY
  done
done
rm -f $OUT/ncu.csv
say "d = 128 beside cuDNN"
timeout 120 python3 tests/bench/side_by_side.py --flashjit $C/bin/flashjit --no-backward --no-flex --rounds 2 \
  --cases 128:16384:n,128:16384:c,128:1024:n:16,128:4096:n:4 > $OUT/sbs.log 2>&1
grep -A8 "^side-by-side" $OUT/sbs.log
say done
