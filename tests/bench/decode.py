#!/usr/bin/env python3
"""Decode benchmark: flashjit's split-KV forward against PyTorch's peers.

One process on one card, so that the ratios come from one run. Per case
(B, query heads, KV heads, Nq, Nkv, d; bf16):

  flashjit     flashjit bench --batch B --heads H --gqa H/Hkv --seq-len Nq
                              --seq-len-kv Nkv --head-dim d --json --cold-l2
                              [extra]
               (its own warm-up and median of CUDA-event timings; its
               default tiling for these shapes is the split-KV one).
               --cold-l2 (the default; --flashjit-timing warm drops it)
               zeroes twice the L2 before each timed launch, as do_bench
               does for the peers: both start cold, and the host's launch
               latency is not inside the figure (without it `flashjit
               bench` records its start event on an idle GPU, so the
               launch's own latency is; how much of a decode's ~85 us
               that is has not been measured)
  sdpa-flash   F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
               under SDPBackend.FLASH_ATTENTION
  sdpa-cudnn   ... under SDPBackend.CUDNN_ATTENTION
  copy         y.copy_(x) of a tensor the size of K and V: the card's copy
               bandwidth (bytes read + written / time)

The bandwidth of an attention is the bytes of K and V over its time (Q and O
are a rounding error at decode). Peers by triton.testing.do_bench(warmup=25,
rep=100, median) as in side_by_side.py; 3 interleaved rounds of (flashjit,
sdpa-flash), medians.

  decode.py [--flashjit PATH] [--cases B:H:HKV:NQ:NKV:D,...] [--out FILE]
            [--flashjit-timing cold-l2|warm] [--flashjit-args="..."]
(write --flashjit-args=VALUE when the value is one option, e.g.
--flashjit-args=--kv-splits=8: argparse takes a lone "--x" for an option)
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CASES = "16:32:4:1:32768:128,1:32:4:1:131072:128,16:32:4:4:32768:128,1:8:8:1:131072:128"


def parse_cases(spec):
    out = []
    for part in spec.split(","):
        b, h, hkv, nq, nkv, d = (int(x) for x in part.split(":"))
        out.append(dict(B=b, H=h, Hkv=hkv, Nq=nq, Nkv=nkv, d=d))
    return out


def kv_bytes(c):
    return 2 * c["B"] * c["Hkv"] * c["Nkv"] * c["d"] * 2


def run_flashjit(exe, c, extra):
    cmd = [exe, "bench", "--batch", str(c["B"]), "--heads", str(c["H"]),
           "--gqa", str(c["H"] // c["Hkv"]), "--seq-len", str(c["Nq"]),
           "--seq-len-kv", str(c["Nkv"]), "--head-dim", str(c["d"]), "--json"] + extra
    rec = dict(cmd=" ".join(shlex.quote(x) for x in cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except Exception as e:  # noqa: BLE001 - record and go on
        rec["error"] = str(e)[:300]
        return rec
    try:
        obj = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:  # noqa: BLE001
        rec.update(error=f"rc={p.returncode}, no JSON", stderr_tail=p.stderr[-800:])
        return rec
    rec.update(json=obj, time_ms=obj.get("time_ms"), ok=obj.get("ok"), rc=p.returncode)
    if p.returncode != 0:
        rec["error"] = f"rc={p.returncode}: {p.stderr[-300:]}"
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flashjit", default=os.path.join(ROOT, ".carry", "bin", "flashjit"))
    ap.add_argument("--flashjit-args", default="")
    ap.add_argument("--flashjit-timing", choices=("cold-l2", "warm"), default="cold-l2",
                    help="cold-l2 (default): flashjit bench --cold-l2, as do_bench "
                         "times the peers; warm: without it")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "decode.json"))
    args = ap.parse_args()
    extra = shlex.split(args.flashjit_args)
    if args.flashjit_timing == "cold-l2":
        extra = ["--cold-l2"] + extra

    torch = None
    try:
        import torch as t
        if t.cuda.is_available():
            torch = t
    except ImportError:
        pass
    bench_ms = None
    if torch is not None:
        import triton.testing

        def bench_ms(fn):
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    results = []
    for c in parse_cases(args.cases):
        row = dict(case=c, kv_bytes=kv_bytes(c), flashjit=[], peers={})
        peers = {}
        if torch is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            import torch.nn.functional as F
            q = torch.randn(c["B"], c["H"], c["Nq"], c["d"], device="cuda", dtype=torch.bfloat16)
            k = torch.randn(c["B"], c["Hkv"], c["Nkv"], c["d"], device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)

            def sdpa(backend):
                def f():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                return f
            peers = {"sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
                     "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
            x = torch.empty(kv_bytes(c) // 2, device="cuda", dtype=torch.bfloat16)
            y = torch.empty_like(x)
            try:
                row["copy_tbps"] = 2 * kv_bytes(c) / (bench_ms(lambda: y.copy_(x)) * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001
                row["copy_error"] = str(e)[:200]
            del x, y
        flash_ms = []
        for _ in range(args.rounds):
            row["flashjit"].append(run_flashjit(args.flashjit, c, extra))
            if "sdpa-flash" in peers:
                try:
                    flash_ms.append(bench_ms(peers["sdpa-flash"]))
                except Exception as e:  # noqa: BLE001
                    row["peers"]["sdpa-flash"] = dict(error=str(e)[:300])
        if flash_ms:
            row["peers"]["sdpa-flash"] = dict(ms=statistics.median(flash_ms), rounds=flash_ms)
        if "sdpa-cudnn" in peers:
            try:
                row["peers"]["sdpa-cudnn"] = dict(ms=bench_ms(peers["sdpa-cudnn"]))
            except Exception as e:  # noqa: BLE001
                row["peers"]["sdpa-cudnn"] = dict(error=str(e)[:300])
        times = [r["time_ms"] for r in row["flashjit"] if isinstance(r.get("time_ms"), (int, float))]
        if times:
            row["flashjit_ms"] = statistics.median(times)
        results.append(row)
        if torch is not None:
            del q, k, v
            torch.cuda.empty_cache()

    with open(args.out, "w") as f:
        json.dump(dict(flashjit_timing=args.flashjit_timing, results=results), f, indent=1)

    def tb(ms, c):
        return kv_bytes(c) / (ms * 1e-3) / 1e12

    print(f"flashjit timed {args.flashjit_timing}; peers and copy by do_bench (L2 flushed)")
    print("| case (B:H:Hkv:Nq:Nkv:d) | flashjit ms (TB/s) | ok | splits | sdpa-flash ms (TB/s) | cuDNN ms (TB/s) | copy TB/s | vs sdpa-flash | of copy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in results:
        c = row["case"]
        name = ":".join(str(c[k]) for k in ("B", "H", "Hkv", "Nq", "Nkv", "d"))
        fj = row.get("flashjit_ms")
        js = next((r["json"] for r in row["flashjit"] if "json" in r), {})
        ok = all(r.get("ok") is True for r in row["flashjit"])
        fl = row["peers"].get("sdpa-flash", {}).get("ms")
        cu = row["peers"].get("sdpa-cudnn", {}).get("ms")
        cp = row.get("copy_tbps")
        cell = lambda ms: f"{ms:.3f} ({tb(ms, c):.2f})" if ms else "-"
        ratio = f"{fl / fj:.2f}x" if fj and fl else "-"
        ofcopy = f"{tb(fj, c) / cp:.0%}" if fj and cp else "-"
        err = next((r.get("error") for r in row["flashjit"] if r.get("error")), None)
        print(f"| {name} | {cell(fj)} | {ok} | {js.get('kv_splits', '-')} | {cell(fl)} | {cell(cu)} | "
              f"{cp:.2f} | {ratio} | {ofcopy} |" if cp else
              f"| {name} | {cell(fj)} | {ok} | {js.get('kv_splits', '-')} | {cell(fl)} | {cell(cu)} | - | {ratio} | {ofcopy} |")
        if err:
            print(f"  flashjit error: {err[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
