#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh here): captured tensors of
# score modifiers on the GPU (issue 14) and the decode split sweep (issue
# 13). Device call: carry [".carry"], command:
#   bash tools/scripts/gpu-captured.sh
# Steps (FLASHJIT_CAPTURED_STEPS, comma-separated; default all but flex):
#   captured  flashjit-captured-gpu-tests (every case; the deterministic
#             captured gradients twice each) -> $OUT/captured.log
#   regress   the forward GPU suites the argument change touches (score
#             modifiers, split-KV, the ring, persistent) -> $OUT/tests.log
#   backward  flashjit-backward-gpu-tests' score-modifier cases
#   sanitize  memcheck on captured kernels whose tiles have padding rows and
#             columns (the gathers must stay inside the tensors), and on
#             deterministic captured gradients (their words' conversion)
#   decode    tests/bench/decode.py: FLASHJIT_DECODE_RUNS, CASE@SPLITS,...
#             (each case's default split count, then those)
#   python    the Python captured-tensor tests on CUDA -> $OUT/python.log
#   flex      tests/bench/variants.py beside FlexAttention -> variants.json
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_CAPTURED_STEPS:-captured,regress,backward,sanitize,decode,python}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
if step captured; then
  echo "== captured-tensor GPU tests (+${SECONDS}s)"
  timeout 330 $C/bin/flashjit-captured-gpu-tests --gtest_brief=1 --gtest_color=no \
    > $OUT/captured.log 2>&1
  echo "exit $?" >> $OUT/captured.log
  grep -E "FAILED|PASSED|tests ran|exit|rel_err" $OUT/captured.log | head -20
fi
if step regress; then
  forward_tests 200 "ScoreMods/*:*SplitKv*:*Persistent*:Tilings/ForwardKvRingGpu*"
fi
if step backward; then
  echo "== backward GPU tests, score modifiers (+${SECONDS}s)"
  timeout 150 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no \
    --gtest_filter="*mod_*" > $OUT/backward.log 2>&1
  echo "exit $?" >> $OUT/backward.log
  grep -E "FAILED|PASSED|tests ran|exit" $OUT/backward.log | head -10
fi
if step sanitize; then
  echo "== memcheck on captured kernels (+${SECONDS}s)"
  D=$(mktemp -d)
  python3 - "$D" <<'PY'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng()
np.save(d + "/bias.npy", rng.uniform(-2, 2, 2 * 70 * 90).astype(np.float32))
np.save(d + "/seg.npy", np.sort(rng.integers(0, 4, 90)).astype(np.float32))
src = open("tests/gpu/CapturedGpuTests.cpp").read()
r = src[src.index('kBiasAndDocuments = R"(') + 23:]
open(d + "/bias.mlir", "w").write(r[:r.index(')";')].replace("{N}", "70").replace("{M}", "90"))
PY
  sanitize memcheck \
    "--head-dim 64 --causal --heads 2 --seq-len 70 --seq-len-kv 90 --score-mod @$D/bias.mlir --capture $D/bias.npy --capture $D/seg.npy" \
    "--head-dim 128 --heads 4 --seq-len 70 --seq-len-kv 90 --score-mod @tests/lit/Inputs/score-mod-slopes.mlir --capture tests/lit/Inputs/slopes4.npy" \
    "--head-dim 64 --gqa 4 --heads 4 --seq-len 1 --seq-len-kv 3000 --score-mod @tests/lit/Inputs/score-mod-slopes.mlir --capture tests/lit/Inputs/slopes4.npy" \
    "--backward --head-dim 64 --causal --heads 2 --seq-len 70 --seq-len-kv 90 --score-mod @$D/bias.mlir --capture $D/bias.npy --capture $D/seg.npy" \
    "--backward --head-dim 128 --heads 4 --seq-len 70 --seq-len-kv 90 --score-mod @tests/lit/Inputs/score-mod-slopes.mlir --capture tests/lit/Inputs/slopes4.npy" \
    "--backward --deterministic --head-dim 64 --causal --heads 2 --seq-len 70 --seq-len-kv 90 --score-mod @$D/bias.mlir --capture $D/bias.npy --capture $D/seg.npy" \
    "--backward --deterministic --head-dim 128 --heads 4 --seq-len 70 --seq-len-kv 90 --score-mod @tests/lit/Inputs/score-mod-slopes.mlir --capture tests/lit/Inputs/slopes4.npy"
fi
if step decode; then
  # CASE:SPLITS... pairs; the first run of each case is its default.
  for cs in ${FLASHJIT_DECODE_RUNS:-1:32:4:1:131072:128@99,100 16:32:4:1:32768:128@6}; do
    c=${cs%@*} sp=${cs#*@}
    echo "== decode $c (+${SECONDS}s)"
    for v in "" ${sp//,/ }; do
      [[ -n $v ]] && v="--kv-splits $v"
      timeout 80 python3 tests/bench/decode.py --flashjit "$FJ" --rounds 2 --cases $c \
        ${v:+--flashjit-args "$v"} --out "$OUT/decode-$(tr -dc 'a-z0-9' <<<"$c$v").json" 2>&1 | tail -1 | sed "s/^/[${v:-default}] /"
    done
  done
fi
if step python; then
  echo "== python captured tests (+${SECONDS}s)"
  timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider -k "captured or Captured" \
    python/tests/test_torch_gpu.py python/tests/test_torch_captured_gpu.py python/tests/test_torch_ops.py \
    > $OUT/python.log 2>&1
  echo "exit $?" >> $OUT/python.log
  grep -E "FAILED|passed|failed|exit|Error" $OUT/python.log | tail -8
fi
if step flex; then
  echo "== variants beside FlexAttention (+${SECONDS}s)"
  timeout -k 5 ${FLASHJIT_FLEX_S:-300} python3 tests/bench/variants.py \
    ${FLASHJIT_FLEX_VARIANTS:+--variants $FLASHJIT_FLEX_VARIANTS} --json $OUT/variants.json > $OUT/variants.log 2>&1
  echo "exit $?" >> $OUT/variants.log
  grep -E "^\||exit|Error" $OUT/variants.log | tail -12
  grep -c '"variant"' $OUT/variants.log | sed 's/^/variant rows logged: /'
fi
echo "== done (+${SECONDS}s)"
