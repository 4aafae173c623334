#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# tools/scripts/gpu-prepare.sh assembled .carry/ here (device call: carry
# [".carry"], command: bash tools/scripts/gpu-python-extra.sh). The PyTorch
# side of issue 15, in one go, under 6 minutes:
#   1. pytest: test_torch_ops.py (opcheck, torch.compile fullgraph, CUDA
#      graph), test_torch_gpu.py and test_torch_captured_gpu.py (the
#      binding on torch CUDA tensors: the per-call path changed),
#      test_hf_gpu.py (transformers backend)
#      -> $OUT/python-extra.log, $OUT/python-extra.xml
#   2. tests/bench/overhead.py (with .carry/bin/flashjit-plan-bench, the C++
#      plan call) -> $OUT/overhead.json, overhead.log
# Printed last: a summary table (per test file: passed / failed / skipped;
# the per-call times). Exit 1 if a test failed or the overhead is above
# its 10 us target.
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
: "${OUT:=$ROOT/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLASHJIT_AUTOTUNE=0
T0=$SECONDS
say() { echo "[gpu-python-extra +$((SECONDS - T0))s] $*"; }
CARRY=$ROOT/.carry
LIB=$CARRY/lib/libflashjit.so
if [[ -f $LIB.gz && ! -f $LIB ]]; then
  gzip -dc "$LIB.gz" >"$LIB" || say "WARNING: could not unpack $LIB.gz"
fi
[[ -f $LIB ]] || { say "ERROR: $LIB missing: run tools/scripts/gpu-prepare.sh here first"; exit 2; }
export FLASHJIT_LIBRARY=$LIB PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
TMPD=$(mktemp -d /tmp/flashjit-extra.XXXXXX)
trap 'rm -rf "$TMPD"' EXIT
if ! python3 -c "import pytest" 2>/dev/null && ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$TMPD/site" "$CARRY"/wheels/*.whl &&
    export PYTHONPATH="$PYTHONPATH:$TMPD/site"
fi
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.cuda.is_available()); import transformers; print("transformers", transformers.__version__)' 2>&1 | sed 's/^/  /'

say "pytest: torch ops, torch GPU binding, transformers"
timeout -k 10 270 python3 -m pytest -q -rfEs -p no:cacheprovider \
  --junitxml="$OUT/python-extra.xml" -s \
  python/tests/test_torch_ops.py python/tests/test_torch_gpu.py \
  python/tests/test_torch_captured_gpu.py python/tests/test_torch_plans_gpu.py \
  python/tests/test_hf_gpu.py >"$OUT/python-extra.log" 2>&1
py_rc=$?
tail -25 "$OUT/python-extra.log"
((py_rc == 124)) && say "WARNING: pytest hit its 270 s limit"

say "overhead benchmark"
# The C++ plan benchmark rows too, when gpu-prepare.sh carried it.
plan_bench=$CARRY/bin/flashjit-plan-bench
[[ -x $plan_bench ]] || plan_bench=""
timeout -k 5 150 python3 tests/bench/overhead.py --json "$OUT/overhead.json" \
  --plan-bench "$plan_bench" >"$OUT/overhead.log" 2>&1
oh_rc=$?
cat "$OUT/overhead.log"

echo
echo "================ summary (+$((SECONDS - T0))s) ================"
python3 - "$OUT/python-extra.xml" "$OUT/python-extra.log" <<'PYEOF'
import collections, re, sys, xml.etree.ElementTree as ET
counts = collections.defaultdict(lambda: [0, 0, 0])
try:
    root = ET.parse(sys.argv[1]).getroot()
    for case in root.iter("testcase"):
        parts = (case.get("classname") or case.get("name") or "?").split(".")
        f = next((x for x in parts if x.startswith("test_")), parts[-1])
        kind = 0
        if case.find("failure") is not None or case.find("error") is not None:
            kind = 1
        elif case.find("skipped") is not None:
            kind = 2
        counts[f][kind] += 1
except Exception as e:
    print(f"no junit xml ({e}); see python-extra.log")
print(f"{'test file':<24}{'passed':>8}{'failed':>8}{'skipped':>9}")
for f, (p, x, s) in sorted(counts.items()):
    print(f"{f:<24}{p:>8}{x:>8}{s:>9}")
for line in open(sys.argv[2], errors="replace"):
    if line.startswith("[hf]"):
        print(line.rstrip())
PYEOF
if [[ -f $OUT/overhead.json ]]; then
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print("per call (us):", ", ".join(f"{k} {v:.2f}" for k, v in d["us_per_call"].items()),
      "| kernel ~%.1f us" % d["kernel_us"], "| target ok" if d["ok"] else "| ABOVE TARGET")
' "$OUT/overhead.json"
else
  echo "overhead: no overhead.json (exit $oh_rc; see overhead.log)"
fi
echo "pytest exit $py_rc, overhead exit $oh_rc"
((py_rc == 0 && oh_rc == 0)) || exit 1
exit 0
