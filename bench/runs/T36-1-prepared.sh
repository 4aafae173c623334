#!/usr/bin/env bash
# T36-1 (carry [".carry"], made at the end of T35 from its final tree:
# `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh` after the build;
# command `bash bench/runs/T36-1-prepared.sh`):
# (1) the torch GPU tests of block masks, CUDA graphs, the layout's checks,
# captured tensors and varlen (T35's flashjit_backward_kv_major path ran on
# an H100 in T35; the varlen transpose, c9a0073, has not run on a GPU);
# (2) variants.py, all seven, beside FlexAttention on the H200 (the
# document backward with the transpose given: 1.076 -> 1.037 ms on the
# H100 in T35); (3) decode.py (issue 13's decode bars; last on an H200 in
# T11). Steps skipped near 590 s.
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
python_tests_env
call_header 1
left() { (( SECONDS - CALL_T0 < $1 )); }
say "torch GPU tests: block masks, graphs, captured"
timeout 170 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py python/tests/test_torch_ops.py \
  python/tests/test_torch_captured_gpu.py python/tests/test_varlen_gpu.py \
  -k "block or graph or layout or mask or document or backward or find_their" 2>&1 | tail -4 | cut -c1-200
left 330 && {
say "variants beside FlexAttention (ms)"
timeout 200 python3 tests/bench/variants.py > $OUT/var.log 2>&1
tail -9 $OUT/var.log | cut -c1-170
}
left 330 && {
say "decode"
timeout $((585 - SECONDS + CALL_T0)) python3 -u tests/bench/decode.py --flashjit $FJ --out $OUT/decode.json > $OUT/decode.log 2>&1
tail -14 $OUT/decode.log | cut -c1-180
}
say done
