#!/usr/bin/env bash
# On the device machine (after gpu-prepare.sh here): mask_mod regions on the
# GPU (issue 14 item 1). Device call: carry [".carry"], command:
#   bash tools/scripts/gpu-maskmod.sh
# Steps (FLASHJIT_MASKMOD_STEPS, comma-separated; default all but flex):
#   runs      `flashjit run --device cuda` on mask_mod descriptions, each
#             checked against the float64 reference (exit 1 on a mismatch):
#             every GPU path (the sm_90a ring default, wgmma without the
#             ring, mma.sync fp16, split-KV decode, block-sparse), forward
#             and backward, beside a score_mod with a learned bias; varlen
#             with a block-sparse layout; a causal mask_mod bounded per
#             block (no layout)
#   sanitize  memcheck on two mask kernels whose tiles have padding
#   regress   the captured-tensor GPU tests and the forward / backward
#             score-modifier suites (the captured buffers moved into one
#             helper) -> $OUT/captured.log, tests.log, backward.log
#   python    the Python CUDA tests with masks and captured tensors
#   full      layouts with full blocks (2 in a --layout file): a causal
#             mask_mod region with the blocks below the diagonal full must
#             pass, the diagonal marked full too must fail (exit 1: the
#             kernel skipped the mask there), forward and both backwards
#   blocks    --mask-blocks: the layout classified by the kernel's @f_blocks
#             on the GPU, checked against the float64 classification
#             (small problems) and the attention against the mask's
#             reference with no layout, forward and backward, dense and
#             varlen (a row per sequence); memcheck of classifications; bench at B 1, H 16, N 8192, d 128 (the
#             classification's time beside the attention's); block masks
#             built by the kernel, by torch and by flex (block_masks.py)
#   flex      tests/bench/variants.py plain,causal(-mod),window(-mod),document beside
#             FlexAttention (document: the mask_mod region, its block mask
#             from from_mask_mod with the full blocks marked)
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
STEPS=${FLASHJIT_MASKMOD_STEPS:-runs,full,sanitize,regress,python}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
D=$(mktemp -d)
python3 - "$D" <<'PY'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng()
for n in (300, 700, 1000, 3000, 4096):
    cuts = np.sort(rng.choice(np.arange(1, n), 5, replace=False))
    np.save(f"{d}/seg{n}.npy", np.searchsorted(cuts, np.arange(n), side="right").astype(np.float32))
lens, n = [], 0
while n < 8192:
    lens.append(int(rng.integers(1024, 3073)))
    n += lens[-1]
np.save(f"{d}/seg8192.npy", np.repeat(np.arange(len(lens)), lens)[:8192].astype(np.float32))
np.save(d + "/bias.npy", rng.uniform(-2, 2, 4 * 700 * 700).astype(np.float32))
open(d + "/bias.mlir", "w").write("""{
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %bias: memref<?xf32>):
  %n = arith.constant 700 : index
  %hn = arith.muli %h, %n : index
  %r = arith.addi %hn, %i : index
  %rn = arith.muli %r, %n : index
  %x = arith.addi %rn, %j : index
  %v = memref.load %bias[%x] : memref<?xf32>
  %y = arith.addf %s, %v : f32
  attn.yield %y : f32
}""")
for name, diag in (("ok", 1), ("lie", 2)):
    with open(f"{d}/lay_{name}.txt", "w") as f:
        for r in range(8):
            f.write(" ".join("0" if c > r else str(diag) if c == r else "2" for c in range(8)) + "\n")
open(d + "/causal.mlir", "w").write("""{
^bb0(%b: index, %h: index, %i: index, %j: index):
  %le = arith.cmpi sle, %j, %i : index
  attn.yield %le : i1
}""")
PY
M=tests/lit/Inputs/mask-mod-stripes.mlir
if step runs; then
  echo "== mask_mod runs on the GPU (+${SECONDS}s)"
  i=0
  while IFS= read -r a; do
    [[ -z $a ]] && continue
    i=$((i + 1))
    timeout 60 $FJ run $a --device cuda > $OUT/run$i.log 2>&1
    echo "run $i exit $? [$a] $(grep -E -- '-> |error' $OUT/run$i.log | head -1 | cut -c1-150)"
  done <<EOC
--head-dim 128 --heads 16 --seq-len 4096 --mask-mod document --capture $D/seg4096.npy
--head-dim 128 --heads 8 --gqa 2 --causal --seq-len 3000 --mask-mod document --capture $D/seg3000.npy
--head-dim 64 --dtype fp16 --heads 4 --seq-len 1000 --seq-len-kv 700 --mask-mod @$M
--head-dim 96 --heads 4 --window 100,20 --seq-len 1000 --mask-mod @$M
--head-dim 256 --heads 2 --causal --seq-len 1000 --mask-mod document --capture $D/seg1000.npy
--head-dim 128 --heads 4 --seq-len 700 --mask-mod document --capture $D/seg700.npy --block-m 64 --block-n 64 --warps 4
--head-dim 128 --heads 32 --gqa 8 --seq-len 1 --seq-len-kv 4096 --mask-mod document --capture $D/seg4096.npy
--head-dim 128 --heads 4 --seq-len 1000 --mask-mod @$M --block-sparse 0.5 --sparse-block 128
--head-dim 64 --heads 4 --seq-len 700 --score-mod @$D/bias.mlir --capture $D/bias.npy --mask-mod document --capture $D/seg700.npy
--backward --head-dim 128 --heads 8 --gqa 2 --causal --seq-len 3000 --mask-mod document --capture $D/seg3000.npy
--backward --head-dim 64 --heads 4 --seq-len 700 --score-mod @$D/bias.mlir --capture $D/bias.npy --mask-mod document --capture $D/seg700.npy
--backward --deterministic --head-dim 96 --dtype fp16 --heads 4 --seq-len 1000 --seq-len-kv 700 --mask-mod @$M
--head-dim 128 --heads 8 --gqa 2 --causal --seqlens-q 300,1,1000,0 --seqlens-kv 200,40,1000,7 --block-sparse 0.5
--backward --head-dim 128 --heads 8 --gqa 2 --causal --seqlens-q 300,1,1000,0 --seqlens-kv 200,40,1000,7 --block-sparse 0.5
--head-dim 128 --heads 8 --seq-len 2048 --mask-mod @$D/causal.mlir
--backward --head-dim 128 --heads 8 --seq-len 2048 --mask-mod @$D/causal.mlir
EOC
  FLASHJIT_WGMMA=0 timeout 60 $FJ run --device cuda --head-dim 128 --heads 4 --seq-len 1000 --mask-mod @$M 2>&1 | grep -E -- '-> |error' | sed 's/^/[mma.sync] /'
  FLASHJIT_KV_RING=0 timeout 60 $FJ run --device cuda --head-dim 128 --heads 4 --seq-len 1000 --mask-mod document --capture $D/seg1000.npy 2>&1 | grep -E -- '-> |error' | sed 's/^/[no ring] /'
fi
if step full; then
  echo "== full blocks (+${SECONDS}s)"
  for lay in ok lie; do
    for extra in "" "--backward" "--backward --deterministic" "--block-m 64 --block-n 64 --warps 4"; do
      timeout 60 $FJ run --device cuda --head-dim 128 --heads 8 --seq-len 1024 --mask-mod @$D/causal.mlir \
        --layout $D/lay_$lay.txt --sparse-block 128 $extra > $OUT/full.log 2>&1
      echo "layout $lay [$extra]: exit $? $(grep -E -- '-> |error' $OUT/full.log | head -1 | cut -c1-120)"
    done
  done
fi
if step blocks; then
  echo "== mask blocks classified on the GPU (+${SECONDS}s)"
  : > $OUT/blocks.log
  while IFS= read -r a; do
    [[ -z $a ]] && continue
    timeout 90 $FJ run $a --device cuda --mask-blocks > $D/b.log 2>&1
    echo "exit $? [$a] $(grep -E -- '-> |error|mask blocks' $D/b.log | tr '\n' ' ' | cut -c1-260)" | tee -a $OUT/blocks.log
  done <<EOC
--head-dim 128 --heads 4 --seq-len 4096 --mask-mod document --capture $D/seg4096.npy
--head-dim 128 --heads 8 --gqa 2 --causal --seq-len 3000 --mask-mod document --capture $D/seg3000.npy
--head-dim 64 --dtype fp16 --heads 4 --seq-len 1000 --seq-len-kv 700 --mask-mod @$M --sparse-block 64
--head-dim 128 --heads 2 --seq-len 1000 --mask-mod @$D/causal.mlir --sparse-block 160 --block-m 32 --block-n 32 --warps 2
--head-dim 128 --heads 32 --gqa 8 --seq-len 1 --seq-len-kv 4096 --mask-mod document --capture $D/seg4096.npy
--backward --head-dim 128 --heads 8 --gqa 2 --causal --seq-len 3000 --mask-mod document --capture $D/seg3000.npy
--backward --deterministic --head-dim 96 --dtype fp16 --heads 4 --seq-len 1000 --seq-len-kv 700 --mask-mod @$M
--head-dim 128 --heads 4 --mask-mod @$M --seqlens-q 1000,7,3000,200 --seqlens-kv 900,4000,3000,1
--backward --head-dim 64 --heads 4 --mask-mod @$D/causal.mlir --seqlens-q 1000,7,3000,200 --seqlens-kv 900,4000,3000,1 --sparse-block 64
EOC
  sanitize memcheck "--head-dim 64 --heads 2 --seq-len 700 --seq-len-kv 300 --mask-mod document --capture $D/seg700.npy --mask-blocks --sparse-block 64" \
    "--head-dim 64 --heads 2 --mask-mod @$M --mask-blocks --seqlens-q 300,7,100 --seqlens-kv 200,400,1 --sparse-block 64"
  for dir in "" "--backward"; do
    timeout 120 $FJ bench $dir --head-dim 128 --heads 16 --seq-len 8192 --mask-mod document --capture $D/seg8192.npy --mask-blocks --json > $D/bb.json 2>&1
    echo "bench [$dir] exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('time_ms', d['time_ms'], 'density', d['density'], 'mask_blocks', d['mask_blocks'])" $D/bb.json 2>&1 | tail -1)" | tee -a $OUT/blocks.log
    timeout 120 $FJ bench $dir --head-dim 128 --heads 16 --seq-len 8192 --mask-mod document --capture $D/seg8192.npy --json > $D/bd.json 2>&1
    echo "bench no layout [$dir] exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('time_ms', d['time_ms'])" $D/bd.json 2>&1 | tail -1)" | tee -a $OUT/blocks.log
  done
  # Where the document forward's time goes (T22-A: 0.401 ms where its
  # visited blocks predict 0.27): a random layout of the same density and
  # no mask (the sparse walk alone), then the document's classified layout
  # with the mask (the mask's partial blocks on top).
  for dens in 0.28; do
    timeout 120 $FJ bench --head-dim 128 --heads 16 --seq-len 8192 --block-sparse $dens --json > $D/br.json 2>&1
    echo "bench random layout $dens, no mask: exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('time_ms', d['time_ms'], 'density', d['density'])" $D/br.json 2>&1 | tail -1)" | tee -a $OUT/blocks.log
  done
  # The layouts built three ways (the kernel, flashjit's torch evaluation,
  # flex's create_block_mask), timed in this run.
  timeout -k 5 180 python3 tests/bench/block_masks.py --n 8192,32768 > $D/bm.log 2>&1
  echo "block_masks.py exit $?" | tee -a $OUT/blocks.log
  grep -E "^\||Error" $D/bm.log | tee -a $OUT/blocks.log
fi
if step sanitize; then
  echo "== memcheck on mask kernels (+${SECONDS}s)"
  sanitize memcheck \
    "--head-dim 64 --causal --heads 2 --seq-len 300 --seq-len-kv 700 --mask-mod document --capture $D/seg700.npy" \
    "--backward --head-dim 64 --heads 4 --seq-len 700 --score-mod @$D/bias.mlir --capture $D/bias.npy --mask-mod document --capture $D/seg700.npy"
fi
if step regress; then
  echo "== captured-tensor GPU tests (+${SECONDS}s)"
  timeout 150 $C/bin/flashjit-captured-gpu-tests --gtest_brief=1 --gtest_color=no \
    > $OUT/captured.log 2>&1
  echo "exit $?" >> $OUT/captured.log
  grep -E "FAILED|PASSED|tests ran|exit" $OUT/captured.log | head -10
  forward_tests 120 "ScoreMods/*"
  timeout 120 $C/bin/flashjit-backward-gpu-tests --gtest_brief=1 --gtest_color=no \
    --gtest_filter="*mod_*" > $OUT/backward.log 2>&1
  echo "exit $?" >> $OUT/backward.log
  grep -E "FAILED|PASSED|tests ran|exit" $OUT/backward.log | head -10
fi
if step python; then
  echo "== python mask / captured tests on CUDA (+${SECONDS}s)"
  timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -k "mask or captured or Captured or document" \
    python/tests/test_torch_gpu.py python/tests/test_torch_captured_gpu.py python/tests/test_torch_ops.py \
    python/tests/test_varlen_gpu.py > $OUT/python.log 2>&1
  echo "exit $?" >> $OUT/python.log
  grep -E "FAILED|passed|failed|exit|Error" $OUT/python.log | tail -8
fi
if step flex; then
  echo "== variants beside FlexAttention (+${SECONDS}s)"
  timeout -k 5 ${FLASHJIT_FLEX_S:-240} python3 tests/bench/variants.py \
    --variants ${FLASHJIT_FLEX_VARIANTS:-plain,causal,causal-mod,window,window-mod,document} --json $OUT/variants.json > $OUT/variants.log 2>&1
  echo "exit $?" >> $OUT/variants.log
  grep -E "^\||exit|Error" $OUT/variants.log | tail -12
fi
echo "== done (+${SECONDS}s)"
