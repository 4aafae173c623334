#!/usr/bin/env bash
# T38-4 (carry [".carry"], a0077b4's build; command
# `bash bench/runs/T38-4-prepared.sh`). The learned slopes' backward at N
# 2048, d 128 in the check's whole scope (4 heads: their gradient
# compared), the torch GPU suites (plans, varlen, the binding's GPU tests),
# the CLI's backward of plain, softcap and ALiBi (two rounds), and
# variants.py with every variant (the issue-14 table of this session).
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T38-4
R=bench/runs/T38-alibi-captured.mlir
chk() { timeout 90 $FJ run "$@" --json 2>$OUT/err.txt | tail -1 | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("ok=%s rel=%.2e nan=%s capture=%s heads=%s" % (j["ok"], j["rel_err"], j.get("nan_count"), j.get("capture_grads_rel_err"), j.get("checked_heads")))
except Exception: print("fail")'; }
say "learned slopes backward N 2048 H 4: $(chk --head-dim 128 --heads 4 --seq-len 2048 --score-mod @$R --capture bench/runs/T38-slopes4.npy --backward)"
say "learned slopes backward N 2048 H 4 causal: $(chk --head-dim 128 --heads 4 --seq-len 2048 --causal --score-mod @$R --capture bench/runs/T38-slopes4.npy --backward)"
head -c 300 $OUT/err.txt
python_tests_env
for f in test_torch_gpu test_torch_plans_gpu test_varlen_gpu; do
  (cd python && timeout 200 python3 -m pytest -q tests/$f.py -p no:cacheprovider > $OUT/py-$f.log 2>&1; echo "exit $?" >> $OUT/py-$f.log)
  say "$f: $(tail -2 $OUT/py-$f.log | tr '\n' ' ' | cut -c1-200)"
  grep -E "^FAILED" $OUT/py-$f.log | head -5
done
A="--head-dim 128 --seq-len 8192 --heads 16 --backward --json"
ms() { tail -1 | python3 -c 'import json,sys
try: print(json.loads(sys.stdin.read())["time_ms"])
except Exception: print("fail")'; }
for r in 1 2; do
  say "round $r backward ms: plain $(timeout 60 $FJ bench $A 2>/dev/null | ms) softcap $(timeout 60 $FJ bench $A --score-mod softcap:30 2>/dev/null | ms) alibi $(timeout 60 $FJ bench $A --score-mod alibi:16 2>/dev/null | ms)"
done
timeout 300 python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/var.log 2>&1
grep -A30 '^variants, bf16' $OUT/var.log | cut -c1-170
say done
