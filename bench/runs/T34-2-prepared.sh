#!/usr/bin/env bash
# T34-2 (prepared in T33 on 9da284c): (1) variants beside FlexAttention,
# forward and backward (issue 14's table; split commits on by default
# now); (2) the backward with split commits against without, on this
# card; (3) the document layout's forward, persistent or not; (4) the
# per-call overhead. Steps skipped near 600 s.
cd "$(dirname "$0")/.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 2
left() { (( SECONDS - CALL_T0 < $1 )); }
say "variants beside FlexAttention (ms)"
timeout 260 python3 tests/bench/variants.py --variants plain,softcap,alibi,window,document > $OUT/var.log 2>&1
tail -9 $OUT/var.log | cut -c1-170
left 400 && {
say "backward: split commits (default) | without (TFLOP/s, N 8192, B 1, H 16)"
FLASHJIT_KNOB_ROUNDS=2 timeout 100 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_BWD_SPLIT_COMMITS=0" \
  "--backward --head-dim 128 --seq-len 8192" "--backward --head-dim 128 --seq-len 8192 --causal" 2>&1 | tail -2 | cut -c1-200
}
left 470 && {
python3 - > /tmp/doc.txt <<'PY'
n, b = 8192, 128
lens, t, k = [], 0, 0
while t < n:
    lens.append(min(1024 + 1024 * (k % 3), n - t)); t += lens[-1]; k += 1
seg = [i for i, l in enumerate(lens) for _ in range(l // b)]
for i in seg:
    print(" ".join("2" if j == i else "0" for j in seg))
PY
say "document layout (N 8192, listed-and-full blocks): default | persistent + Q by TMA"
FLASHJIT_KNOB_ROUNDS=2 timeout 60 bash tools/scripts/gpu-knobs.sh "-|FLASHJIT_PERSISTENT=1 FLASHJIT_TMA=qkv" \
  "--head-dim 128 --seq-len 8192 --layout /tmp/doc.txt" 2>&1 | tail -1 | cut -c1-200
}
left 530 && {
say "overhead (host us a call)"
timeout $((588 - SECONDS + CALL_T0)) python3 tests/bench/overhead.py --calls 1000 --rounds 2 --parts \
  --plan-bench $C/bin/flashjit-plan-bench > $OUT/overhead.log 2>&1
grep -E "flashjit.attention|sdpa|plan" $OUT/overhead.log | head -8 | cut -c1-120
}
say done
