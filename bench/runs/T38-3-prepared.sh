#!/usr/bin/env bash
# T38-3 (carry [".carry"], the build after 0eb8f8c with the softcap
# backward's P d s'/d s at once and captured slopes through the bias
# product; command `bash bench/runs/T38-3-prepared.sh`). The sanitizers on
# ALiBi's bias product (its shared operand written before the roles split),
# the captured slopes on the GPU against float64, the backward, captured
# and forward GPU suites, the torch GPU tests of captured tensors and
# variants, then variants.py (plain, softcap, alibi) and the CLI's forward
# of the captured slopes beside plain.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T38-3
R=bench/runs/T38-alibi-captured.mlir S=bench/runs/T38-slopes16.npy
sanitize "racecheck memcheck" "--head-dim 128 --score-mod alibi:4 --heads 4 --seq-len 700 --seq-len-kv 1100" \
  "--head-dim 128 --score-mod @$R --capture $S --heads 16 --seq-len 300 --causal"
chk() { timeout 60 $FJ run "$@" --json 2>$OUT/err.txt | tail -1 | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("ok=%s rel=%.2e lse=%.2e nan=%s %s" % (j["ok"], j["rel_err"], j.get("lse_rel_err", 0), j.get("nan_count"), j.get("capture_grads_rel_err", "")))
except Exception: print("fail")'; }
for a in "--seq-len 4096" "--seq-len 1000 --seq-len-kv 1537 --causal" "--seq-len 2048 --backward" "--seq-len 777 --backward --causal"; do
  say "captured slopes $a: $(chk --head-dim 128 --heads 16 --score-mod @$R --capture $S $a)"
done
say "softcap backward: $(chk --head-dim 128 --heads 16 --seq-len 2048 --score-mod softcap:30 --backward)"
head -c 300 $OUT/err.txt
gpu_suites
timeout 200 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no > $OUT/bwd.log 2>&1; echo "exit $?" >> $OUT/bwd.log
say "backward suite: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test|^exit' $OUT/bwd.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \] [A-Z]' $OUT/bwd.log | head -6
python_tests_env
(cd python && timeout 170 python3 -m pytest -q -x tests/test_torch_captured_gpu.py -p no:cacheprovider > $OUT/py.log 2>&1; echo "exit $?" >> $OUT/py.log)
say "torch captured GPU: $(tail -2 $OUT/py.log | tr '\n' ' ')"
timeout 200 python3 tests/bench/variants.py --variants plain,softcap,alibi \
  --json $OUT/variants.json > $OUT/var.log 2>&1
grep -A14 '^variants, bf16' $OUT/var.log | cut -c1-170
A="--head-dim 128 --seq-len 8192 --heads 16 --json"
for r in 1 2; do
  t() { timeout 60 $FJ bench $A "$@" 2>/dev/null | tflops_of; }
  say "round $r TFLOP/s: plain $(t) alibi $(t --score-mod alibi:16) captured-slopes $(t --score-mod @$R --capture $S) softcap $(t --score-mod softcap:30)"
done
say done
