#!/usr/bin/env bash
# T37-3 (carry [".carry"], this session's C++ and binding: Bc 80 past
# d = 128 on the ring, flashjit._fastcall; command
# `bash bench/runs/T37-3-prepared.sh`). The GPU suites with the new
# default; the torch GPU tests of planned calls (the extension's path);
# issue 13's bar table beside cuDNN; the per-call overhead with the plan
# call by ctypes and by the extension; d 192 at Bc 80 against 64.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
call_header T37-3
left() { (( SECONDS - CALL_T0 < $1 )); }
say "GPU suites (forward 4 shards, captured, varlen)"
gpu_suites
say "torch GPU tests: planned calls, graphs"
python_tests_env
timeout 90 python3 -m pytest -q -x python/tests/test_torch_plans_gpu.py -p no:cacheprovider 2>&1 | tail -3
python3 -c 'import flashjit, flashjit._torch_impl as t, torch
q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16, device="cuda")
flashjit.attention(q, q, q)
print("plan call:", t._plan_forward)'
say "issue 13's forward bars beside cuDNN (TFLOP/s)"
forward_bars 170
left 470 && {
say "overhead (host us a call)"
timeout 100 python3 tests/bench/overhead.py --calls 1000 --rounds 3 --parts \
  --plan-bench $C/bin/flashjit-plan-bench > $OUT/overhead.log 2>&1
sed -n '/^path/,$p' $OUT/overhead.log | head -32 | cut -c1-110
}
left 540 && {
say "d 192 N 16K H 10: Bc 80 (default) | Bc 64, two rounds"
T="--block-m 128 --warps 8 --stages 2 --overlap-softmax"
for m in "" --causal; do
  a=() b=()
  for r in 1 2; do
    a+=($(timeout 30 $FJ bench --head-dim 192 $m --seq-len 16384 --batch 1 --heads 10 --json 2>/dev/null | tflops_of))
    b+=($(timeout 30 $FJ bench --head-dim 192 $m --seq-len 16384 --batch 1 --heads 10 $T --block-n 64 --json 2>/dev/null | tflops_of))
  done
  say "d 192 ${m:-full}: ${a[*]} | ${b[*]}"
done
}
say done
