#!/usr/bin/env python3
"""An edit of the tile stage reaches the GPU: soft-cap the scores of the
tile IR (S -> c * tanh(S / c)), run the edited kernel on the CPU and on the
GPU on the same inputs (--seed), and compare both with a float64 numpy
reference of the soft-capped attention (and of the plain one, which must be
far off). Prints one line per device; exit 1 if a check fails.

usage: edit_check.py FLASHJIT_BINARY WORKDIR [DEVICES, default cpu,cuda]
"""
import json
import os
import re
import subprocess
import sys

import numpy as np

CAP = 2.0


def soft_capped(tile: str, br: int, bc: int) -> str:
    m = re.search(r"(%\w+) = (tile\.dot .*\{transpose_rhs\} .*)", tile)
    if not m:
        sys.exit("edit_check: no tile.dot {transpose_rhs} in the tile stage")
    ty = f"tensor<{br}x{bc}xf32>"
    edit = (f"%raw_s = {m.group(2)}\n"
            f"    %cap = arith.constant dense<{CAP}> : {ty}\n"
            f"    %inv = arith.constant dense<{1 / CAP}> : {ty}\n"
            f"    %sd = arith.mulf %raw_s, %inv : {ty}\n"
            f"    %th = math.tanh %sd : {ty}\n"
            f"    {m.group(1)} = arith.mulf %th, %cap : {ty}")
    return tile[:m.start()] + edit + tile[m.end():]


def reference(q, k, v, scale, cap):
    s = np.einsum("bhnd,bhmd->bhnm", q, k)
    if cap:
        s = cap * np.tanh(s / cap)
    s = scale * s
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    return np.einsum("bhnm,bhmd->bhnd", p / p.sum(-1, keepdims=True), v)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    fj, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    d, br, bc = 64, 128, 64
    tile = subprocess.run([fj, "compile", "--head-dim", str(d), "--block-m",
                           str(br), "--block-n", str(bc), "--emit", "tile"],
                          check=True, capture_output=True, text=True).stdout
    path = os.path.join(work, "softcap.mlir")
    with open(path, "w") as f:
        f.write(soft_capped(tile, br, bc))
    ok = True
    outs = {}
    devices = (sys.argv[3] if len(sys.argv) > 3 else "cpu,cuda").split(",")
    for dev in devices:
        io = os.path.join(work, dev)
        r = subprocess.run([fj, "run", "--input", path, "--device", dev,
                            "--seq-len", "1000", "--heads", "2", "--seed", "7",
                            "--json", "--dump-io", io],
                           capture_output=True, text=True)
        run = json.loads(r.stdout.strip().splitlines()[-1])
        q, k, v, o = (np.load(os.path.join(io, f"{t}.npy")).astype(np.float64)
                      for t in "qkvo")
        scale = run["problem"]["scale"]
        capped = rel(o, reference(q, k, v, scale, CAP))
        plain = rel(o, reference(q, k, v, scale, None))
        outs[dev] = o
        good = capped < 1e-2 and plain > 1e-1 and r.returncode == 1
        ok &= good
        print(f"edit_check {dev}: soft-capped rel_err {capped:.2e}, vs the "
              f"plain attention {plain:.2e}, flashjit's check of the "
              f"description exit {r.returncode} -> {'ok' if good else 'FAIL'}")
    if len(outs) == 2:
        cross = rel(outs["cuda"], outs["cpu"])
        ok &= cross < 1e-2
        print(f"edit_check cpu vs cuda: rel diff {cross:.2e}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
