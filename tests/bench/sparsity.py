#!/usr/bin/env python3
"""Block-sparse attention: time against the density of the layout.

    python3 tests/bench/sparsity.py [--flashjit BIN] [--d 128] [--n 16384]
        [--h 16] [--densities 0.05,0.1,...] [--out F.json]

For each density, `flashjit bench --block-sparse DENS` (a random layout of
128 x 128 blocks, its own CUDA-event median) and FlexAttention
(torch.compile(flex_attention)) with a random block mask of the same
density; dense scaled_dot_product_attention (FLASH_ATTENTION and
CUDNN_ATTENTION backends) as the reference lines. Writes a JSON with a
"sparsity" key, which tests/bench/plot.py draws as time against density
(<stem>-sparsity.png). Peers that cannot run (no torch, no CUDA) are
recorded as missing; without flashjit's binary nothing is timed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import side_by_side as sbs  # noqa: E402

DENSITIES = "0.05,0.1,0.2,0.3,0.5,0.7,1.0"
BLOCK = 128


def flashjit_ms(binary, d, n, h, density):
    """(milliseconds, error) of one `flashjit bench --block-sparse`."""
    cmd = [binary, "bench", "--head-dim", str(d), "--seq-len", str(n), "--batch", "1",
           "--heads", str(h), "--block-sparse", str(density), "--json"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return None, (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        j = json.loads(r.stdout.strip().splitlines()[-1])
        return j["time_ms"], None
    except Exception as e:  # noqa: BLE001
        return None, sbs.short(e)


def peers(d, n, h, densities):
    """{density: flex ms} and {sdpa backend: dense ms}, or the reason."""
    sbs.import_torch()
    torch = sbs.torch
    if torch is None:
        return {}, {}, sbs.TORCH_ERR
    q, k, v = [torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    dense = {}
    p = sbs.Peers(True)
    for name in ("sdpa-flash", "sdpa-cudnn"):
        f = p.sdpa(name, False)
        try:
            dense[name] = sbs.bench_ms(lambda: f(q, k, v))
        except Exception as e:  # noqa: BLE001
            dense[name] = sbs.short(e)
    flex = {}
    if p.flex is None:
        return flex, dense, p.flex_err
    blocks = (n + BLOCK - 1) // BLOCK
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dens in densities:
        keep = torch.rand(blocks, blocks, device="cuda", generator=gen) < dens
        keep |= torch.eye(blocks, dtype=torch.bool, device="cuda")  # no empty rows

        def mask(b, hh, i, j, keep=keep):
            return keep[i // BLOCK, j // BLOCK]
        try:
            bm = p.create_block_mask(mask, None, None, n, n, device="cuda", BLOCK_SIZE=BLOCK)
            flex[dens] = sbs.bench_ms(lambda: p.flex(q, k, v, block_mask=bm))
        except Exception as e:  # noqa: BLE001
            flex[dens] = sbs.short(e)
    return flex, dense, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashjit", default=os.path.join(ROOT, "build", "bin", "flashjit"))
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--densities", default=DENSITIES)
    ap.add_argument("--no-peers", action="store_true", help="flashjit only")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args()
    densities = [float(x) for x in args.densities.split(",") if x]
    if not os.access(args.flashjit, os.X_OK):
        print(f"sparsity.py: no flashjit binary at {args.flashjit}; nothing timed")
        return 2
    rows = []
    for dens in densities:
        ms, err = flashjit_ms(args.flashjit, args.d, args.n, args.h, dens)
        rows.append(dict(density=dens, flashjit_ms=ms, flashjit_error=err))
        sbs.log(f"density {dens}: flashjit {ms if ms is not None else err}")
    flex, dense, why = ({}, {}, "--no-peers") if args.no_peers else peers(
        args.d, args.n, args.h, densities)
    for r in rows:
        f = flex.get(r["density"])
        if isinstance(f, float):
            r["flex_ms"] = f
        elif f is not None:
            r["flex_error"] = f
    data = dict(meta=dict(started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          d=args.d, N=args.n, H=args.h, B=1, block=BLOCK, peers_missing=why),
                sparsity=rows, dense={k: v for k, v in dense.items() if isinstance(v, float)})
    print("| density | flashjit ms | flex ms |")
    print("|---|---|---|")
    for r in rows:
        fj = f"{r['flashjit_ms']:.3f}" if r["flashjit_ms"] is not None else r["flashjit_error"]
        print(f"| {r['density']} | {fj} | {r.get('flex_ms', '-')} |")
    for k, v in data["dense"].items():
        print(f"dense {k}: {v:.3f} ms")
    if why:
        print(f"peers: {why}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(data, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
