#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh): attention variants (issue
# 14) on the GPU. Device call: carry [".carry"], command:
#   bash tools/scripts/gpu-variants.sh
# Steps (FLASHJIT_VARIANT_STEPS, comma-separated; default all):
#   tests   the score-modifier GPU tests: ForwardWgmmaGpu's ScoreMods (named
#           and text regions) and BackwardGpu's mod_* cases
#   python  python/tests/test_torch_ops.py (traced functions, sinks, the
#           custom ops' opcheck and autograd) -> $OUT/python-ops.log
#   peers   side_by_side.py, forward, the default tilings, the cases of
#           FLASHJIT_PEER_CASES until FLASHJIT_PEERS_END (420) seconds
# and, not in the default:
#   flex     tests/bench/variants.py (the variants beside FlexAttention, N =
#            8K, d = 128, forward and backward) -> $OUT/variants.json
#   sparsity tests/bench/sparsity.py (block-sparse time against density,
#            beside FlexAttention's block masks and dense sdpa) ->
#            $OUT/sparsity.json, then plot.py -> $OUT/sparsity-sparsity.png
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_VARIANT_STEPS:-tests,python,peers}
if step tests; then
  forward_tests 150 "ScoreMods/*"
  echo "== backward GPU tests, score modifiers (+${SECONDS}s)"
  timeout 150 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no \
    --gtest_filter="*mod_*" > $OUT/backward.log 2>&1
  echo "exit $?" >> $OUT/backward.log
  grep -E "FAILED|PASSED|tests ran|exit" $OUT/backward.log | head -10
fi
if step python; then
  echo "== python: test_torch_ops.py (+${SECONDS}s)"
  timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_ops.py \
    > $OUT/python-ops.log 2>&1
  echo "exit $?" >> $OUT/python-ops.log
  grep -E "FAILED|passed|failed|exit" $OUT/python-ops.log | tail -8
fi
if step peers; then
  peers_forward "${FLASHJIT_PEERS_END:-420}" 30 \
    "${FLASHJIT_PEER_CASES:-128:16384:n:1:16,128:1024:n:16:16,128:4096:n:4:16}"
fi
if step flex; then
  echo "== variants beside FlexAttention (+${SECONDS}s)"
  timeout -k 5 300 python3 tests/bench/variants.py --json $OUT/variants.json > $OUT/variants.log 2>&1
  echo "exit $?" >> $OUT/variants.log
  grep -E "^\||exit|Error" $OUT/variants.log | tail -12
fi
if step sparsity; then
  echo "== block-sparse time against density (+${SECONDS}s)"
  timeout -k 5 240 python3 tests/bench/sparsity.py --flashjit $FJ --out $OUT/sparsity.json > $OUT/sparsity.log 2>&1
  echo "exit $?" >> $OUT/sparsity.log
  tail -12 $OUT/sparsity.log
  python3 tests/bench/plot.py $OUT/sparsity.json --out $OUT 2>&1 | tail -1
fi
echo "== done (+${SECONDS}s)"
