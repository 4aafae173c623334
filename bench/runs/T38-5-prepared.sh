#!/usr/bin/env bash
# T38-5 (carry [".carry"], the build with FoldConstantFactors; command
# `bash bench/runs/T38-5-prepared.sh`). The backward's constant factors
# folded (softcap's dK/dV step 12 -> 6 f32 ops a score): the softcap
# backward against float64, the backward and captured GPU suites, the CLI's
# backward of plain, softcap and ALiBi (three rounds), variants.py's plain
# and softcap.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T38-5
chk() { timeout 90 $FJ run "$@" --json 2>$OUT/err.txt | tail -1 | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("ok=%s rel=%.2e nan=%s" % (j["ok"], j["rel_err"], j.get("nan_count")))
except Exception: print("fail")'; }
for a in "--score-mod softcap:30 --seq-len 2048" "--score-mod softcap:30 --seq-len 1000 --seq-len-kv 1537 --causal" "--score-mod softcap:50 --seq-len 777" "--score-mod softcap:30 --seq-len 600 --deterministic"; do
  say "backward $a: $(chk --head-dim 128 --heads 4 --backward $a)"
done
timeout 200 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd.log 2>&1; echo "exit $?" >> $OUT/bwd.log
say "backward suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd.log | head -6
timeout 120 $C/bin/flashjit-captured-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/cap.log 2>&1; echo "exit $?" >> $OUT/cap.log
say "captured suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/cap.log | tr '\n' ' ')"
A="--head-dim 128 --seq-len 8192 --heads 16 --backward --json"
ms() { tail -1 | python3 -c 'import json,sys
try: print(json.loads(sys.stdin.read())["time_ms"])
except Exception: print("fail")'; }
for r in 1 2 3; do
  say "round $r backward ms: plain $(timeout 60 $FJ bench $A 2>/dev/null | ms) softcap $(timeout 60 $FJ bench $A --score-mod softcap:30 2>/dev/null | ms) alibi $(timeout 60 $FJ bench $A --score-mod alibi:16 2>/dev/null | ms)"
done
timeout 150 python3 tests/bench/variants.py --variants plain,softcap --json $OUT/variants.json > $OUT/var.log 2>&1
grep -A14 '^variants, bf16' $OUT/var.log | cut -c1-170
say done
