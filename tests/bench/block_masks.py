#!/usr/bin/env python3
"""Block masks built three ways, timed in one run on the GPU.

    python3 tests/bench/block_masks.py [--n 8192,32768] [--d 128] [--json F]

Issue 14 item 4: the layout of a mask_mod (the blocks with a kept
element, the full ones marked) from flashjit's compiled classification
kernel (create_block_mask(..., kernel=True, like=q): the region evaluated
on the device by @f_blocks / @f_blocks_list), from flashjit's torch
evaluation (create_block_mask(..., device="cuda"), one row of query blocks
at a time) and from FlexAttention's create_block_mask, for a document mask
(segments of 1024..3072 tokens, a captured segment-id tensor), a causal
mask and a sliding window of 1024 keys, broadcast over batch and heads
(B = H = None). Each figure: the median milliseconds of the whole call
(CUDA events around it, synchronised), and whether flashjit's two
BlockMasks are equal (counts, lists and full marks) with the density of
each. Needs torch with CUDA; exits 0 with a message where it has none.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import side_by_side as sbs  # noqa: E402
import variants  # noqa: E402


def masks(torch, n, device):
    """name -> mask_mod (FlexAttention's signature); the documents are
    variants.py's."""
    seg = variants.document_ids(torch, n, device)
    return {
        "document": lambda b, h, i, j: seg[i] == seg[j],
        "causal": lambda b, h, i, j: j <= i,
        "window": lambda b, h, i, j: (j <= i) & (i - j <= 1024),
    }


def ms_of(torch, fn, repeats=7):
    """Median milliseconds of fn() (the first call, which compiles, apart)."""
    out = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="8192,32768")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    sbs.import_torch()
    torch = sbs.torch
    if torch is None:
        print(f"block_masks.py: {sbs.TORCH_ERR}; nothing timed")
        return 0
    from torch.nn.attention.flex_attention import create_block_mask
    os.environ.setdefault("FLASHJIT_LIBRARY",
                          os.path.join(ROOT, ".carry", "lib", "libflashjit.so"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import flashjit

    rows = []
    for n in (int(x) for x in args.n.split(",") if x):
        q = torch.empty(1, 1, n, args.d, device="cuda", dtype=torch.bfloat16)
        for name, fn in masks(torch, n, "cuda").items():
            r = {"mask": name, "n": n}
            try:
                r["kernel_ms"], bk = ms_of(torch, lambda: flashjit.create_block_mask(
                    fn, None, None, n, n, device="cuda", kernel=True, like=q))
                r["torch_ms"], bt = ms_of(torch, lambda: flashjit.create_block_mask(
                    fn, None, None, n, n, device="cuda"))
                r["same"] = bool(
                    (bk.to_dense() == bt.to_dense()).all()
                    and (bk.to_dense(full_only=True)
                         == bt.to_dense(full_only=True)).all())
                r["density"] = bk.density()
            except Exception as e:  # noqa: BLE001
                r["flashjit_error"] = sbs.short(e)
            try:
                r["flex_ms"], _ = ms_of(torch, lambda: create_block_mask(
                    fn, None, None, n, n, device="cuda"))
            except Exception as e:  # noqa: BLE001
                r["flex_error"] = sbs.short(e)
            rows.append(r)
            sbs.log(json.dumps(r))
    print("| mask | N | flashjit kernel ms | flashjit torch ms | flex ms | "
          "same layout | density |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        def cell(key):
            v = r.get(key)
            return f"{v:.3f}" if isinstance(v, float) else (
                str(v) if v is not None else r.get("flashjit_error", "-"))
        print(f"| {r['mask']} | {r['n']} | {cell('kernel_ms')} | "
              f"{cell('torch_ms')} | {cell('flex_ms') if 'flex_ms' in r else r.get('flex_error', '-')} | "
              f"{r.get('same', '-')} | {cell('density')} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
