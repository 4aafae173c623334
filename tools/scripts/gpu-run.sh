#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# tools/scripts/gpu-prepare.sh assembled .carry/ here. Device call:
#   carry [".carry"], command: bash tools/scripts/gpu-run.sh
#
# Steps (each goes on when another fails):
#   1. env      GPU, driver, torch; unpack libflashjit.so.gz; find nvJitLink
#   2. tests    every .carry/bin/*-gpu-tests (GoogleTest, --gtest_brief=1)
#               -> $OUT/gpu-tests.log; pass/fail/skip counted from summaries
#   2a. python  python/tests with torch -> $OUT/python-tests.log
#   2b. sanitize  compute-sanitizer memcheck/racecheck on small runs, forward
#               and backward -> $OUT/sanitize.log
#   3. bench    tests/bench/side_by_side.py -> $OUT/bench.json, bench.log:
#               per case the forward, then the backward (flashjit bench
#               --backward vs the sdpa-flash and sdpa-cudnn backward)
#   4. ncu      only with FLASHJIT_NCU=1 and ncu present: a full profile of one
#               flashjit launch ($OUT/ncu_fwd.ncu-rep) and the DRAM bytes of
#               flashjit, naive and sdpa-flash at B=1 H=16 N=4096 d=128
#               ($OUT/ncu_summary.txt)
#   5. anchors  only with FLASHJIT_ANCHORS=1: anchor_bench.py --part sdpa --quick
# Printed last: the bench table and "gpu tests: N passed, N failed, N skipped".
# Exit status: 1 when a gpu test failed (or a test binary crashed), else 0.
#
# Environment:
#   FLASHJIT_QUICK=1          reduced bench set (bar case + one causal), no flex
#   FLASHJIT_STEPS=LIST       steps to run, default "tests,bench" (+ncu, +anchors)
#   FLASHJIT_NCU=1            add the ncu step (about 1-3 minutes)
#   FLASHJIT_NCU_KERNEL=...   ncu -k filter for flashjit's kernel (regex:attention)
#   FLASHJIT_ANCHORS=1        add the anchors step
#   FLASHJIT_BENCH_ARGS=...   extra arguments for every 'flashjit bench'
#   FLASHJIT_CASES=SPEC       bench cases, d:N:c|n[:B[:H]],... (side_by_side.py)
#   FLASHJIT_BENCH_BACKWARD=0 bench the forward only
#   FLASHJIT_DEADLINE_S=560   wall-clock plan for the whole script (device limit 600)
#   FLASHJIT_TEST_TIMEOUT_S=180  per test binary
#   FLASHJIT_PYTHON_TIMEOUT_S=240  the python step
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
: "${OUT:=$ROOT/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$SECONDS
DEADLINE=${FLASHJIT_DEADLINE_S:-560}
CARRY=$ROOT/.carry
FJ=$CARRY/bin/flashjit
TMPD=$(mktemp -d /tmp/flashjit-run.XXXXXX)

steps=${FLASHJIT_STEPS:-tests,python,sanitize,bench}
[[ ${FLASHJIT_NCU:-0} == 1 ]] && steps+=",ncu"
[[ ${FLASHJIT_ANCHORS:-0} == 1 ]] && steps+=",anchors"
has_step() { [[ ",$steps," == *",$1,"* ]]; }
left() { echo $((DEADLINE - (SECONDS - T0))); }
say() { echo "[gpu-run +$((SECONDS - T0))s] $*"; }

# ------------------------------------------------------------------ 1. env --
say "steps: $steps; OUT=$OUT"
if [[ ! -d $CARRY ]]; then
  say "WARNING: .carry/ is missing: run tools/scripts/gpu-prepare.sh here and carry [\".carry\"]"
fi
if [[ -f $CARRY/lib/libflashjit.so.gz && ! -f $CARRY/lib/libflashjit.so ]]; then
  gzip -dc "$CARRY/lib/libflashjit.so.gz" >"$CARRY/lib/libflashjit.so" ||
    say "WARNING: could not unpack libflashjit.so.gz"
fi
chmod +x "$CARRY"/bin/* 2>/dev/null
export LD_LIBRARY_PATH=$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# nvJitLink: flashjit dlopens libnvJitLink.so.13 (or $FLASHJIT_NVJITLINK).
if [[ -z ${FLASHJIT_NVJITLINK:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnvJitLink\.so\.13' &&
  [[ ! -e /usr/local/cuda/lib64/libnvJitLink.so.13 ]]; then
  sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
  # shellcheck disable=SC2086
  cand=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib $sp -name 'libnvJitLink.so.13*' \
    2>/dev/null | sort | head -1)
  if [[ -n $cand ]]; then
    export FLASHJIT_NVJITLINK=$cand
  fi
fi

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  uname -srm
  ldd --version 2>&1 | head -1
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv 2>&1 || echo "nvidia-smi failed"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)' 2>&1
  echo "ncu: $(command -v ncu || echo none)"
  echo "FLASHJIT_NVJITLINK=${FLASHJIT_NVJITLINK:-<default dlopen>}"
  echo "ldconfig nvJitLink: $(ldconfig -p 2>/dev/null | grep -c nvJitLink) entries"
  if [[ -x $FJ ]]; then
    echo "ldd $FJ:"
    ldd "$FJ" 2>&1
    echo "flashjit --help (first lines):"
    timeout 30 "$FJ" --help 2>&1 | head -5
  else
    echo "$FJ: missing"
  fi
  [[ -f $CARRY/MANIFEST.txt ]] && cat "$CARRY/MANIFEST.txt"
} >"$OUT/env.txt" 2>&1
grep -E '^NVIDIA|^torch|^FLASHJIT_NVJITLINK|failed' "$OUT/env.txt" | head -4
if [[ -x $FJ ]] && ldd "$FJ" 2>&1 | grep -q 'not found'; then
  say "WARNING: flashjit misses libraries: $(ldd "$FJ" 2>&1 | grep 'not found' | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- 2. tests --
t_pass=0 t_fail=0 t_skip=0 t_bins=0
t_notes=()
if has_step tests; then
  : >"$OUT/gpu-tests.log"
  shopt -s nullglob
  bins=("$CARRY"/bin/*-gpu-tests)
  shopt -u nullglob
  for b in "${bins[@]}"; do
    name=$(basename "$b")
    t_bins=$((t_bins + 1))
    say "test binary $name"
    echo "===== $name" >>"$OUT/gpu-tests.log"
    timeout "${FLASHJIT_TEST_TIMEOUT_S:-180}" "$b" --gtest_brief=1 --gtest_color=no >"$TMPD/t.log" 2>&1
    rc=$?
    echo "exit $rc" >>"$TMPD/t.log"
    tee -a "$OUT/gpu-tests.log" <"$TMPD/t.log"
    ran=$(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran.*/\1/p' "$TMPD/t.log" | tail -1)
    passed=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?\..*/\1/p' "$TMPD/t.log" | tail -1)
    skipped=$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?\.$/\1/p' "$TMPD/t.log" | tail -1)
    if [[ -z $ran ]]; then
      # No summary: crashed, hung (124 = timeout) or could not start.
      t_fail=$((t_fail + 1))
      t_notes+=("$name: no summary, exit $rc (crash/timeout); see gpu-tests.log")
      continue
    fi
    passed=${passed:-0} skipped=${skipped:-0}
    failed=$((ran - passed - skipped))
    if ((failed == 0 && rc != 0)); then
      failed=1
      t_notes+=("$name: every test passed or skipped but exit $rc")
    fi
    t_pass=$((t_pass + passed)) t_skip=$((t_skip + skipped)) t_fail=$((t_fail + failed))
  done
  if ((t_bins == 0)); then
    t_notes+=("no .carry/bin/*-gpu-tests binary (did gpu-prepare.sh run?)")
    echo "no gpu test binaries" >>"$OUT/gpu-tests.log"
  fi
fi

# -------------------------------------------------------------- 2a. python --
# The Python binding with torch on the GPU (outputs vs torch's float64 math
# SDPA, GQA, strides, masks, streams, graphs).
if has_step python; then
  if ! python3 -c "import pytest" 2>/dev/null && ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$TMPD/site" "$CARRY"/wheels/*.whl &&
      export PYTHONPATH="$TMPD/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  say "python binding tests (torch, GPU)"
  FLASHJIT_AUTOTUNE=0 FLASHJIT_LIBRARY=$CARRY/lib/libflashjit.so timeout -k 5 "${FLASHJIT_PYTHON_TIMEOUT_S:-240}" python3 -m pytest -q -p no:cacheprovider --durations=12 \
    python/tests 2>&1 | tee "$OUT/python-tests.log" | tail -5
fi

# ------------------------------------------------------------ 2b. sanitize --
# A subset under compute-sanitizer: memcheck (out-of-bounds, misaligned) on
# tails, odd head dims, 2-byte copies, GQA, sparse; racecheck on shared memory.
if has_step sanitize; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  if [[ -z $CS ]]; then
    say "compute-sanitizer: not found, step skipped"
  else
    san_fail=0
    while read -r tool args; do
      [[ -z $tool ]] && continue
      say "sanitize $tool: $args"
      # shellcheck disable=SC2086
      if ! timeout -k 5 120 "$CS" --tool "$tool" --error-exitcode 9 "$FJ" run --device cuda --json $args \
          >>"$OUT/sanitize.log" 2>&1; then
        san_fail=$((san_fail + 1)); say "  FAILED (see sanitize.log)"
      fi
    done <<'CASES'
memcheck --head-dim 33 --head-dim-v 40 --causal --seq-len 77 --seq-len-kv 130
memcheck --head-dim 100 --gqa 2 --heads 4 --window 9,3 --seq-len 200 --dtype fp16
memcheck --head-dim 64 --block-sparse 0.5 --seq-len 300 --packed-qkv
memcheck --head-dim 300 --head-dim-v 400 --seq-len 65
racecheck --head-dim 128 --causal --seq-len 256
racecheck --head-dim 64 --block-sparse 0.6 --seq-len 384
memcheck --backward --head-dim 33 --head-dim-v 40 --causal --gqa 2 --heads 2 --seq-len 77 --seq-len-kv 130
memcheck --backward --head-dim 300 --head-dim-v 400 --block-sparse 0.5 --sparse-block 32 --seq-len 65
racecheck --backward --head-dim 64 --block-sparse 0.6 --seq-len 384 --dtype fp16
CASES
    echo "sanitize: $san_fail failed" | tee -a "$OUT/sanitize.log"
  fi
fi

# ---------------------------------------------------------------- 3. bench --
reserve=20
has_step ncu && reserve=200
has_step anchors && reserve=$((reserve + 150))
if has_step bench; then
  limit=$(($(left) - reserve))
  ((limit < 60)) && limit=60
  budget=$((limit * 2 / 3))
  say "bench (hard limit ${limit}s, flex/naive budget ${budget}s)"
  args=(--flashjit "$FJ" --out "$OUT/bench.json" --budget-s "$budget")
  [[ ${FLASHJIT_QUICK:-0} == 1 ]] && args+=(--quick)
  [[ -n ${FLASHJIT_CASES:-} ]] && args+=(--cases "$FLASHJIT_CASES")
  timeout -k 10 "$limit" python3 tests/bench/side_by_side.py "${args[@]}" 2>&1 | tee "$OUT/bench.log"
  rc=${PIPESTATUS[0]}
  ((rc != 0)) && say "WARNING: bench exited $rc (124: hit its ${limit}s limit; bench.json holds the finished cases)"
fi

# ------------------------------------------------------------------ 4. ncu --
if has_step ncu; then
  # shellcheck disable=SC2012
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [[ -z $NCU ]]; then
    say "ncu: not found, step skipped"
    echo "ncu not found" >"$OUT/ncu_summary.txt"
  else
    KSEL=${FLASHJIT_NCU_KERNEL:-regex:attention}
    shape=(--head-dim 128 --seq-len 4096 --batch 1 --heads 16)
    # shellcheck disable=SC2206
    fjcmd=("$FJ" bench "${shape[@]}" --json ${FLASHJIT_BENCH_ARGS:-})
    metrics=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
    ncu_export() { # name report.ncu-rep -> $TMPD/name.csv
      "$NCU" -i "$2" --csv --page raw --print-units base >"$TMPD/$1.csv" 2>>"$TMPD/ncu.log" ||
        "$NCU" -i "$2" --csv --page details --print-units base >"$TMPD/$1.csv" 2>>"$TMPD/ncu.log"
    }
    say "ncu: full set, one flashjit launch ($KSEL)"
    timeout 150 "$NCU" --clock-control none --set full -k "$KSEL" -c 1 -f -o "$OUT/ncu_fwd" \
      "${fjcmd[@]}" >>"$TMPD/ncu.log" 2>&1 || say "ncu full: exit $?"
    say "ncu: DRAM bytes, flashjit"
    timeout 90 "$NCU" --clock-control none --metrics "$metrics" -k "$KSEL" -c 1 -f -o "$TMPD/fj" \
      "${fjcmd[@]}" >>"$TMPD/ncu.log" 2>&1 || say "ncu flashjit: exit $?"
    ncu_export flashjit "$TMPD/fj.ncu-rep"
    for impl in naive sdpa-flash; do
      say "ncu: DRAM bytes, $impl"
      timeout 90 "$NCU" --clock-control none --metrics "$metrics" --profile-from-start off -f -o "$TMPD/$impl" \
        python3 tests/bench/side_by_side.py --ncu-target "$impl" --cases 128:4096:n \
        >>"$TMPD/ncu.log" 2>&1 || say "ncu $impl: exit $?"
      ncu_export "$impl" "$TMPD/$impl.ncu-rep"
    done
    {
      python3 tests/bench/side_by_side.py --cases 128:4096:n --ncu-summary \
        flashjit="$TMPD/flashjit.csv" naive="$TMPD/naive.csv" sdpa-flash="$TMPD/sdpa-flash.csv" 2>&1
      echo
      echo "full-set report: ncu_fwd.ncu-rep ($(stat -c %s "$OUT/ncu_fwd.ncu-rep" 2>/dev/null || echo missing) bytes; files over 16 MiB do not come back)"
      echo "--- ncu log (tail)"
      grep -v '^"' "$TMPD/ncu.log" | tail -40
      for f in flashjit naive sdpa-flash; do
        echo "--- $f.csv (head)"
        head -c 3000 "$TMPD/$f.csv" 2>/dev/null
      done
    } >"$OUT/ncu_summary.txt"
  fi
fi

# -------------------------------------------------------------- 5. anchors --
if has_step anchors; then
  if [[ -f $CARRY/anchors/anchor_bench.py ]]; then
    lim=$(($(left) - 15))
    ((lim < 30)) && lim=30
    say "anchors: anchor_bench.py --part sdpa --quick (limit ${lim}s)"
    timeout -k 10 "$lim" python3 "$CARRY/anchors/anchor_bench.py" --part sdpa --quick >"$TMPD/anchors.log" 2>&1 ||
      say "anchors: exit $?"
    tail -40 "$TMPD/anchors.log" >>"$OUT/env.txt"
  else
    say "anchors: .carry/anchors/anchor_bench.py missing"
  fi
fi

# -------------------------------------------------------------- summary ----
echo
echo "================ summary (+$((SECONDS - T0))s) ================"
if has_step ncu && [[ -f $OUT/ncu_summary.txt ]]; then
  sed -n '1,/^$/p' "$OUT/ncu_summary.txt" | grep -v '^    ' | head -8
  echo
fi
if has_step bench; then
  if [[ -f $OUT/bench.json ]]; then
    python3 tests/bench/side_by_side.py --print-table "$OUT/bench.json" 2>&1
  else
    echo "bench: no bench.json (see bench.log)"
  fi
fi
for n in "${t_notes[@]}"; do echo "  test note: $n"; done
rm -rf "$TMPD"
if has_step tests; then
  echo "gpu tests: $t_pass passed, $t_fail failed, $t_skip skipped"
  ((t_fail == 0)) || exit 1
fi
exit 0
