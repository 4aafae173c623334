#!/usr/bin/env bash
# Runs THERE (the GPU machine), from the repo root, after
# `FLASHJIT_SKIP_BUILD=1 bash tools/scripts/gpu-prepare.sh` here; device
# call with carry [".carry"]: bash tools/scripts/gpu-host-profile.sh
#
# Where the host time of one flashjit.attention call with a traced
# mask_mod goes (the document mask, B 1, H 16, N 8192, d 128: ~275 us a
# call on the H200 machine, T28): the host time of 50 calls in a row (a
# function of the script's own, traced every call; then
# flashjit.variants.document, traced once), the trace alone, then
# cProfile of 50 calls by own time (the 22 costliest).
set -u
cd "$(dirname "$0")/../.." || exit 2
source tools/scripts/gpu-env.sh
export PYTHONPATH=$PWD/python
timeout 80 python3 - <<'PY' 2>&1 | tail -45
import time, cProfile, pstats, torch, flashjit
from flashjit import _arguments
n = 8192
lengths, total, k = [], 0, 0
while total < n:  # tests/bench/variants.py's documents
    lengths.append(min(1024 + 1024 * (k % 3), n - total)); total += lengths[-1]; k += 1
seg = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"),
                              torch.tensor(lengths, device="cuda"))
q, k_, v = [torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
def document(b, h, i, j):
    return seg[i] == seg[j]
bm = flashjit.create_block_mask(document, None, None, n, n, device="cuda")
call = lambda: flashjit.attention(q, k_, v, mask_mod=document, block_mask=bm)
for _ in range(5):
    call()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(50):
    call()
print("host us per call: %.1f" % ((time.perf_counter() - t) / 50 * 1e6))
torch.cuda.synchronize()
variant = flashjit.variants.document(seg)  # traced once (T32)
for _ in range(5):
    flashjit.attention(q, k_, v, mask_mod=variant, block_mask=bm)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(50):
    flashjit.attention(q, k_, v, mask_mod=variant, block_mask=bm)
print("host us per call, variants.document: %.1f"
      % ((time.perf_counter() - t) / 50 * 1e6))
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(50):
    _arguments._score_mod_and_captures(None, document)
print("the trace alone, us: %.1f" % ((time.perf_counter() - t) / 50 * 1e6))
pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    call()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
PY
