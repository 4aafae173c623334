#!/usr/bin/env python3
"""Variable-length batches: flashjit's varlen forward beside its peers.

One process on one card, so that the ratios come from one run. Per case (a
list of sequence lengths, query heads H, KV heads, d; bf16; causal or not):

  flashjit         flashjit bench --seqlens-q L1,L2,... --heads H --gqa G
                   --head-dim d [--causal] --json (its warm-up and median of
                   CUDA-event timings; TFLOP/s over the sequences' own
                   query-key pairs)
  flashjit-padded  the same batch padded to the longest sequence: flashjit
                   bench --batch B --seq-len max (what a library without
                   varlen runs; its TFLOP/s counted on the real pairs, so
                   the two compare as times)
  fa2-varlen       torch.ops.aten._flash_attention_forward with cum_seq_q /
                   cum_seq_k: the FlashAttention-2 varlen kernel inside
                   PyTorch (what nested-tensor sdpa runs), q (total, H, d)
  flex-document    FlexAttention over the packed batch with a document
                   mask_mod (its BlockMask built once, outside the timing)

Peers by triton.testing.do_bench(warmup=25, rep=100, median); 3 interleaved
rounds, medians. TFLOP/s = 4 * H * d * sum(Nq_b * Nkv_b) / time (halved for
causal), for every column.

With --backward, flashjit's backward (`bench --backward`, after one
forward) varlen and padded only (the peers' varlen backward is not
called here). --peers picks the torch peers (fa2-varlen, flex-document;
"none" for flashjit alone; FlexAttention compiles per case).

  varlen.py [--flashjit PATH] [--cases NAME=L1/L2/...:H:HKV:D:c|n,...]
            [--rounds R] [--backward] [--peers fa2-varlen,flex-document|none]
            [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Sixteen sequences of 256..2048 tokens (about 16K), and a decode-like mix.
DEFAULT_CASES = ("mixed16=2048/256/1024/1536/512/2048/768/1280/1792/384/896/"
                 "2048/640/1152/1664/256:16:16:128:n,"
                 "mixed16c=2048/256/1024/1536/512/2048/768/1280/1792/384/896/"
                 "2048/640/1152/1664/256:16:16:128:c,"
                 "long4=8192/4096/2048/1024:16:4:128:c")


def parse_cases(spec):
    out = []
    for part in spec.split(","):
        name, rest = part.split("=")
        lens, h, hkv, d, m = rest.split(":")
        out.append(dict(name=name, lens=[int(x) for x in lens.split("/")],
                        H=int(h), Hkv=int(hkv), d=int(d), causal=m == "c"))
    return out


def flops(c):
    pairs = sum(n * n for n in c["lens"])
    f = 4.0 * c["H"] * c["d"] * pairs
    return f / 2 if c["causal"] else f


def run_flashjit(exe, c, padded, backward=False):
    cmd = [exe, "bench", "--heads", str(c["H"]), "--gqa",
           str(c["H"] // c["Hkv"]), "--head-dim", str(c["d"]), "--json"]
    if backward:
        cmd.append("--backward")
    if c["causal"]:
        cmd.append("--causal")
    if padded:
        cmd += ["--batch", str(len(c["lens"])), "--seq-len", str(max(c["lens"]))]
    else:
        cmd += ["--seqlens-q", ",".join(str(n) for n in c["lens"])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    try:
        j = json.loads(r.stdout.strip().splitlines()[-1])
    except Exception:
        print("flashjit failed:", " ".join(cmd), r.stderr[-400:], file=sys.stderr)
        return None
    if not j.get("ok"):
        print("flashjit check failed:", j, file=sys.stderr)
        return None
    return j["time_ms"]


def torch_peers(c, wanted):
    """{name: fn} of the torch peers in wanted for case c (skipping what is
    missing)."""
    import itertools

    import torch
    dev, dt = "cuda", torch.bfloat16
    lens = c["lens"]
    total = sum(lens)
    q = torch.randn(total, c["H"], c["d"], device=dev, dtype=dt)
    k = torch.randn(total, c["Hkv"], c["d"], device=dev, dtype=dt)
    v = torch.randn(total, c["Hkv"], c["d"], device=dev, dtype=dt)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), device=dev,
                      dtype=torch.int32)
    peers = {}
    g = c["H"] // c["Hkv"]
    if "fa2-varlen" in wanted:
        kr = k.repeat_interleave(g, dim=1) if g > 1 else k
        vr = v.repeat_interleave(g, dim=1) if g > 1 else v
        try:
            def fa2():
                return torch.ops.aten._flash_attention_forward(
                    q, kr, vr, cu, cu, max(lens), max(lens), 0.0,
                    c["causal"], False)
            fa2()
            peers["fa2-varlen"] = fa2
        except Exception as e:  # not in this build of torch
            print("fa2-varlen unavailable:", str(e)[:200], file=sys.stderr)
    if "flex-document" in wanted:
        try:
            from torch.nn.attention.flex_attention import (create_block_mask,
                                                           flex_attention)
            doc = torch.repeat_interleave(torch.arange(len(lens), device=dev),
                                          torch.tensor(lens, device=dev))
            causal = c["causal"]

            def mask_mod(b, h, qi, kj):
                same = doc[qi] == doc[kj]
                return same & (kj <= qi) if causal else same
            bm = create_block_mask(mask_mod, 1, None, total, total, device=dev)
            flex = torch.compile(flex_attention)
            qf, kf, vf = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))

            def run_flex():
                return flex(qf, kf, vf, block_mask=bm, enable_gqa=g > 1)
            run_flex()
            peers["flex-document"] = run_flex
        except Exception as e:
            print("flex-document unavailable:", str(e)[:200], file=sys.stderr)
    return peers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashjit", default=os.path.join(ROOT, "build", "bin", "flashjit"))
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backward", action="store_true",
                    help="flashjit's backward, varlen and padded (no peers)")
    ap.add_argument("--peers", default="fa2-varlen,flex-document",
                    help='comma-separated torch peers, or "none"')
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from triton.testing import do_bench
    rows = []
    for c in parse_cases(a.cases):
        times = {"flashjit": [], "flashjit-padded": []}
        wanted = [] if a.backward or a.peers == "none" else a.peers.split(",")
        peers = torch_peers(c, wanted) if wanted else {}
        for name in peers:
            times[name] = []
        for _ in range(a.rounds):
            for padded, name in ((False, "flashjit"), (True, "flashjit-padded")):
                t = run_flashjit(a.flashjit, c, padded, a.backward)
                if t is not None:
                    times[name].append(t)
            for name, fn in peers.items():
                times[name].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        med = {k: statistics.median(v) for k, v in times.items() if v}
        scale = 2.5 if a.backward else 1.0  # the backward's five matmuls
        row = dict(case=c["name"], lens=c["lens"], H=c["H"], Hkv=c["Hkv"], d=c["d"],
                   causal=c["causal"], backward=a.backward, ms=med,
                   tflops={k: scale * flops(c) / (t * 1e-3) / 1e12
                           for k, t in med.items()})
        rows.append(row)
        print(c["name"], " ".join("%s %.3f ms (%.0f TFLOP/s)" % (k, t, row["tflops"][k])
                                  for k, t in med.items()), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
