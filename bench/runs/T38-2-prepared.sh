#!/usr/bin/env bash
# T38-2 (carry [".carry"], this session's build with the bias product;
# command `bash bench/runs/T38-2-prepared.sh`). ALiBi's bias as one more
# k-step of Q K^T on the overlapped loop (BiasProduct.h,
# TileToGPUConstants.cpp): first the GPU checks (flashjit run against
# float64 with the named modifier and the traced lambda of variants.py,
# plain/causal/odd lengths; the forward, captured and varlen GPU suites),
# then variants.py (plain, alibi: flashjit over plain and against flex in
# one run) and the CLI's forward TFLOP/s of plain and ALiBi, two rounds.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T38-2
R=bench/runs/T38-alibi-lambda.mlir
chk() { timeout 60 $FJ run "$@" --json 2>$OUT/err.txt | tail -1 | python3 -c 'import json,sys
try:
  j=json.loads(sys.stdin.read()); print("ok=%s rel=%.2e lse=%.2e nan=%s" % (j["ok"], j["rel_err"], j["lse_rel_err"], j["nan_count"]))
except Exception: print("fail")'; }
for a in "--score-mod alibi:16 --heads 16 --seq-len 4096" \
         "--score-mod alibi:16 --heads 16 --seq-len 4096 --causal" \
         "--score-mod alibi:16 --heads 16 --seq-len 1000 --seq-len-kv 1537" \
         "--score-mod alibi:16 --heads 16 --seq-len 1537 --seq-len-kv 1000 --causal" \
         "--score-mod @$R --heads 16 --seq-len 4096" \
         "--score-mod @$R --heads 16 --seq-len 777 --causal --batch 2"; do
  say "run $a: $(chk --head-dim 128 $a)"
done
head -c 300 $OUT/err.txt
gpu_suites
timeout 200 python3 tests/bench/variants.py --variants plain,alibi \
  --json $OUT/variants.json > $OUT/var.log 2>&1
grep -A12 '^variants, bf16' $OUT/var.log | cut -c1-170
tail -3 $OUT/var.log | cut -c1-300
A="--head-dim 128 --seq-len 8192 --heads 16 --json"
for r in 1 2; do
  t() { timeout 60 $FJ bench $A "$@" 2>/dev/null | tflops_of; }
  say "round $r TFLOP/s: plain $(t) alibi $(t --score-mod alibi:16) lambda $(t --score-mod @$R) causal $(t --causal) alibi-causal $(t --causal --score-mod alibi:16)"
done
say done
