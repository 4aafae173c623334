# Sourced THERE (the GPU machine) by the single-purpose device scripts
# (gpu-ring.sh, gpu-pingpong.sh, gpu-overlap.sh, gpu-wide-ring.sh) from the
# repo root: C (the carried .carry/), OUT, FJ, the unpacked libflashjit.so,
# a fresh cache directory, no autotuning, and nvJitLink from the CUDA
# toolkit or a pip wheel where the loader does not find it; and the helpers
# step, gpu_suites, forward_tests, runtime_tests, sanitize, bench_one,
# tflops_of, peers_forward, median, call_header and say below.
C=$PWD/.carry
: "${OUT:=$PWD/out}"; mkdir -p "$OUT"
[[ -f $C/lib/libflashjit.so.gz && ! -f $C/lib/libflashjit.so ]] && gzip -dc $C/lib/libflashjit.so.gz > $C/lib/libflashjit.so
chmod +x $C/bin/*
export LD_LIBRARY_PATH=$C/lib FLASHJIT_LIBRARY=$C/lib/libflashjit.so FLASHJIT_AUTOTUNE=0 PYTHONUNBUFFERED=1
export FLASHJIT_CACHE_DIR=$(mktemp -d)
if ! ldconfig -p 2>/dev/null | grep -q 'libnvJitLink\.so\.13' && [[ ! -e /usr/local/cuda/lib64/libnvJitLink.so.13 ]]; then
  sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
  export FLASHJIT_NVJITLINK=$(find /usr/local/cuda*/lib64 $sp -name 'libnvJitLink.so.13*' 2>/dev/null | sort | head -1)
fi
FJ=$C/bin/flashjit

# sanitize "TOOL ..." "RUN ARGS" ...: each compute-sanitizer tool on
# `flashjit run ARGS --device cuda` for each ARGS, one line each.
sanitize() {
  local tools=$1 tool a; shift
  local cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in $tools; do
    for a in "$@"; do
      timeout 90 $cs --tool $tool --error-exitcode 9 $FJ run $a --device cuda > $OUT/san.log 2>&1
      echo "$tool [$a]: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|-> ok|error' $OUT/san.log | head -2 | tr '\n' ' ')"
    done
  done
}
# bench_one D n|c FLAGS...: "TFLOP/s registers spill_bytes" of one
# `flashjit bench` at N = 16K, B = 1, H = 2048 / D ("fail - -" if none).
bench_one() {
  local d=$1 m=$2; shift 2
  local mask=""; [[ $m == c ]] && mask=--causal
  timeout 60 $FJ bench --head-dim $d $mask --seq-len 16384 --batch 1 --heads $((2048 / d)) "$@" --json 2>/dev/null | tail -1 |
    python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("%.1f %s %s" % (j["tflops"], j.get("registers"), j.get("spill_bytes")))
except Exception: print("fail - -")'
}
# tflops_of: the "tflops" of the last `flashjit bench --json` line on stdin,
# "%.1f" ("fail" if none).
tflops_of() {
  tail -1 | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("%.1f" % j["tflops"])
except Exception: print("fail")'
}
# peers_forward END BUDGET CASES: side_by_side.py, forward, the default
# tilings, CASES (d:N:c|n:B:H,...) with BUDGET seconds per peer, until END
# seconds into the script -> $OUT/bench.json, bench.log (its tail printed).
peers_forward() {
  echo "== peers, forward, default tilings (+${SECONDS}s)"
  local left=$(($1 - SECONDS)); ((left < 60)) && left=60
  timeout -k 5 $left python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward \
    --budget-s $2 --cases "$3" > $OUT/bench.log 2>&1
  tail -14 $OUT/bench.log
}
# runtime_tests: the runtime GPU tests (prepared launches, CUDA graphs) ->
# $OUT/runtime.log, their summary lines printed.
runtime_tests() {
  echo "== runtime GPU tests (+${SECONDS}s)"
  timeout 90 $C/bin/flashjit-runtime-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/runtime.log 2>&1
  echo "exit $?" >> $OUT/runtime.log
  grep -E "FAILED|PASSED|tests ran|exit" $OUT/runtime.log | head -10
}
# python_tests_env: PYTHONPATH for the binding and its tests, and pytest
# from the carried wheels ($C/wheels) where the machine has none.
python_tests_env() {
  export PYTHONPATH=$PWD/python:$PWD/python/tests${PYTHONPATH:+:$PYTHONPATH}
  if ! python3 -c "import pytest" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/fj-site $C/wheels/*.whl &&
      export PYTHONPATH=/tmp/fj-site:$PYTHONPATH
  fi
}
# torch_suites FILE...: python/tests/FILE.py each with pytest (200 s at
# most) -> $OUT/py-FILE.log; a summary line each and its failed tests.
torch_suites() {
  local f
  python_tests_env
  for f in "$@"; do
    (cd python && timeout 200 python3 -m pytest -q tests/$f.py -p no:cacheprovider > $OUT/py-$f.log 2>&1; echo "exit $?" >> $OUT/py-$f.log)
    say "$f: $(tail -2 $OUT/py-$f.log | tr '\n' ' ' | cut -c1-200)"
    grep -E "^FAILED" $OUT/py-$f.log | head -5
  done
}
# ncu_stalls NAME KERNEL-REGEX CMD...: ncu's full set of the first launch
# of KERNEL-REGEX in CMD (until 575 s into the call), summarised by
# tests/bench/ncu_stalls.py -> $OUT/NAME-summary.txt (its head printed);
# the report and CSVs removed. Nothing where the machine has no ncu.
ncu_stalls() {
  local n=$1 k=$2; shift 2
  local ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n $ncu ]] || { say "no ncu"; return; }
  timeout $((575 - (SECONDS - CALL_T0))) "$ncu" --clock-control none --set full --import-source no \
    -k regex:"$k" -s 1 -c 1 -f -o "$OUT/$n" "$@" > "$OUT/$n-ncu.log" 2>&1 || say "ncu exit $?"
  "$ncu" -i "$OUT/$n.ncu-rep" --csv --page details --print-units base > "$OUT/$n-details.csv" 2>/dev/null
  "$ncu" -i "$OUT/$n.ncu-rep" --csv --page raw --print-units base > "$OUT/$n-raw.csv" 2>/dev/null
  "$ncu" -i "$OUT/$n.ncu-rep" --csv --page source --print-source sass > "$OUT/$n-sass.csv" 2>/dev/null
  python3 tests/bench/ncu_stalls.py "$OUT/$n-details.csv" "$OUT/$n-raw.csv" "$OUT/$n-sass.csv" > "$OUT/$n-summary.txt" 2>&1
  head -60 "$OUT/$n-summary.txt"
  rm -f "$OUT/$n.ncu-rep" "$OUT/$n-raw.csv" "$OUT/$n-sass.csv" "$OUT/$n-details.csv"
}
# forward_bars SECONDS: issue 13's forward bar table beside cuDNN
# (side_by_side.py, two interleaved rounds) -> $OUT/sbs.log and
# $OUT/bench.json; the table printed.
forward_bars() {
  timeout $1 python3 tests/bench/side_by_side.py --flashjit $FJ --out $OUT/bench.json --no-backward --no-flex --rounds 2 \
    --cases 128:16384:n,128:16384:c,128:1024:n:16,128:4096:n:4,64:16384:n,64:16384:c,96:16384:n,96:16384:c,256:16384:n,256:16384:c \
    > $OUT/sbs.log 2>&1
  grep -A14 "^side-by-side" $OUT/sbs.log | cut -c1-100
}
# run_checks D TILING CASE...: `flashjit run --device cuda` at head dim D
# with TILING on each CASE: its rel_err and verdict (or error), a line each.
run_checks() {
  local d=$1 tiling=$2 p r; shift 2
  for p in "$@"; do
    r=$(timeout 40 $FJ run --device cuda --head-dim $d $p $tiling 2>&1 | grep -oE -- "rel_err [^ ]+|-> [A-Za-z]+|error: .{0,90}" | tr '\n' ' ')
    echo "d $d [$tiling] [$p]: $r"
  done
}
# check_json RUN-ARGS...: one `flashjit run --json` against float64 as one
# line: ok, its rel_err, O's and lse's, the NaN count ("fail" if none).
check_json() {
  timeout 90 $FJ run "$@" --json 2>$OUT/err.txt | tail -1 | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("ok=%s rel=%.2e o=%.2e lse=%.2e nan=%s" % (j["ok"], j["rel_err"], j.get("o_rel_err", -1), j.get("lse_rel_err", -1), j.get("nan_count")))
except Exception: print("fail")'
}
# ms_of: the "time_ms" of the last `flashjit bench --json` line on stdin
# ("fail" if none).
ms_of() {
  tail -1 | python3 -c 'import json,sys
try: print(json.loads(sys.stdin.read())["time_ms"])
except Exception: print("fail")'
}
# variants_table TAG VARIANTS-ARGS...: tests/bench/variants.py ARGS (300 s at
# most) -> $OUT/variants-TAG.json and .log; its tables printed.
variants_table() {
  local tag=$1; shift
  timeout 300 python3 tests/bench/variants.py --json $OUT/variants-$tag.json "$@" > $OUT/variants-$tag.log 2>&1
  grep -A30 '^variants, bf16' $OUT/variants-$tag.log | cut -c1-170
}
# bench_env "BENCH-ARGS" VAR=VALUE...: one `flashjit bench BENCH-ARGS --json`
# with VAR=VALUE in its environment (pipe it to ms_of or tflops_of).
bench_env() { local args=$1; shift; env "$@" timeout 60 $FJ bench $args --json 2>/dev/null; }
# median VALUE...: the median of the values that are not "fail".
median() { printf '%s\n' "$@" | grep -v fail | sort -g | awk '{v[NR]=$1} END {print NR ? v[int((NR+1)/2)] : "fail"}'; }
# step NAME: whether NAME is one of the comma-separated $STEPS.
step() { [[ ,$STEPS, == *,$1,* ]]; }
# gpu_suites: the forward GPU tests in four parallel shards beside the
# captured and varlen suites (200 s each at most): a summary line per run
# and the names of its failed tests.
gpu_suites() {
  local l i
  _suite() { local log=$1 bin=$2; shift 2
    env "$@" timeout 200 $C/bin/flashjit-$bin-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/t-$log.log 2>&1
    echo "exit $?" >> $OUT/t-$log.log; }
  for i in 0 1 2 3; do _suite fwd$i forward GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i & done
  _suite captured captured & _suite varlen varlen &
  wait
  for l in fwd0 fwd1 fwd2 fwd3 captured varlen; do
    say "$l: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/t-$l.log | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]' $OUT/t-$l.log | head -6
  done
  rm -f $OUT/t-*.log
}
# forward_tests SECONDS FILTER: the forward GPU tests of FILTER ->
# $OUT/tests.log, their summary lines printed.
forward_tests() {
  echo "== forward GPU tests (+${SECONDS}s)"
  timeout $1 $C/bin/flashjit-forward-gpu-tests --gtest_brief=1 --gtest_color=no \
    --gtest_filter="$2" > $OUT/tests.log 2>&1
  echo "exit $?" >> $OUT/tests.log
  grep -E "FAILED|PASSED|tests ran|exit" $OUT/tests.log | head -30
}
# call_header TAG: what every call script prints first (the card, its
# driver, clock and temperature; the carried build) and `say MSG`, which
# prints MSG after "[TAG +Ns]", N the seconds since the header.
call_header() {
  CALL_TAG=$1 CALL_T0=$SECONDS
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  echo "build: $(sed -n 2p "$C/MANIFEST.txt")"
}
say() { echo "[$CALL_TAG +$((SECONDS - CALL_T0))s] $*"; }
