#!/usr/bin/env python3
"""Side-by-side attention benchmark, forward and backward: flashjit against PyTorch's peers.

Runs on the GPU machine (tools/scripts/gpu-run.sh calls it), in ONE process,
on one card, so that the ratios come from one run:

  flashjit     the CLI as a subprocess:
                 flashjit bench --head-dim D --seq-len N --batch B --heads H
                                [--causal] --json
               CONTRACT: stdout is one JSON line with at least
                 time_ms  median forward time over repeats (CUDA events),
                 tflops   the CLI's own TFLOP/s figure,
                 config   the kernel configuration it chose (any JSON value),
                 ok       true when the output was checked and is correct;
               the CLI does its own warm-up and median. Logs go to stderr.
  sdpa-flash   F.scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION
  sdpa-cudnn   ... under SDPBackend.CUDNN_ATTENTION
  flex         torch.compile(flex_attention) (a block mask for causal)
  naive        the three-kernel attention (matmul, softmax, matmul), skipped
               when it would need more than --naive-max-gb of memory

Peers are timed with triton.testing.do_bench(warmup=25, rep=100,
return_mode="median"), as ../shared/anchors/anchor_bench.py does.
FLOPs = 4*B*H*N*N*d, halved for causal; TFLOP/s = FLOPs / time. All TFLOP/s
in the table use this count (flashjit's own "tflops" is kept in the JSON).

The bar: for each case, 3 interleaved rounds of (flashjit, sdpa-flash); the
table gives the median of each and ratio = flashjit / sdpa-flash TFLOP/s.

The backward (unless --no-backward), per case after its forward:
  flashjit     flashjit bench --backward ... --json (the same contract; the
               backward's three kernels alone, after one forward)
  sdpa-flash,  the backward of scaled_dot_product_attention under the forced
  sdpa-cudnn   backend: torch.autograd.grad(out, (q, k, v), grad,
               retain_graph=True), i.e. out.backward(grad) without the
               accumulation into .grad; the forward is not timed
FLOPs = 2.5 x the forward's (causal halved likewise); the same interleaved
rounds of (flashjit, sdpa-flash); the table's "bwd" rows.

Works without torch or without a GPU (peers are then reported missing) and
when flashjit fails (its error is recorded, the run goes on).

  side_by_side.py [--flashjit PATH] [--out FILE] [--cases SPEC] [--quick] [--no-backward]
  side_by_side.py --print-table FILE       reprint the table of a results file
  side_by_side.py --ncu-target naive|sdpa-flash [--cases d:N:c|n]   (under ncu)
  side_by_side.py --ncu-summary NAME=CSV... [--cases d:N:c|n]        (ncu step)

Case SPEC: comma-separated d:N:c|n[:B[:H]], e.g. "128:16384:n,128:16384:c:1:16".
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
import traceback

# The torch-free parts, beside this file (its directory is on sys.path when
# run as a script; variants.py, sparsity.py and block_masks.py put it there):
# the flashjit CLI runner, the table and the ncu summary. Re-exported for
# those scripts (sbs.short, ...).
from side_by_side_flashjit import (  # noqa: F401
    flashjit_cmd, run_flashjit, short, summarise_flashjit, tflops_of)
from side_by_side_report import (  # noqa: F401
    PEERS, fmt_t, ncu_summary, parse_ncu_csv, table)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The bar case first: d=128, N=16384, B=1, H=16, non-causal.
DEFAULT_CASES = "128:16384:n,64:16384:n,96:16384:n,256:16384:n,128:16384:c"
QUICK_CASES = "128:16384:n,128:4096:c"
BACKWARD_PEERS = ("sdpa-flash", "sdpa-cudnn")

torch = None
TORCH_ERR = None


def log(*a):
    print(*a, flush=True)


def parse_cases(spec):
    cases = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        p = item.split(":")
        if len(p) < 3 or p[2] not in ("c", "n", "causal", "noncausal", "1", "0"):
            raise SystemExit(f"bad case {item!r}: want d:N:c|n[:B[:H]]")
        cases.append(dict(d=int(p[0]), N=int(p[1]), causal=p[2] in ("c", "causal", "1"),
                          B=int(p[3]) if len(p) > 3 else 1,
                          H=int(p[4]) if len(p) > 4 else 16))
    return cases


def flops(B, H, N, d, causal, backward=False):
    f = 4.0 * B * H * N * N * d
    if causal:
        f /= 2
    return 2.5 * f if backward else f


# ------------------------------------------------------------------- torch --

def import_torch():
    global torch, TORCH_ERR
    try:
        import torch as t
        if not t.cuda.is_available():
            TORCH_ERR = f"torch {t.__version__} sees no CUDA device"
            return
        torch = t
    except Exception as e:  # noqa: BLE001
        TORCH_ERR = f"torch missing: {short(e)}"


def bench_ms(fn):
    """Median milliseconds, as anchor_bench.py measures (do_bench), else events."""
    try:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    except ImportError:
        pass
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def naive_attn(q, k, v, causal, scale):
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[-2]
        m = torch.ones(n, n, device=q.device, dtype=torch.bool).triu(1)
        s = s.masked_fill(m, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return p @ v


def naive_bytes(c):
    # scores bf16 + fp32 copy + fp32 softmax + bf16 probs live at the peak
    # (~10 bytes per score; anchors measured 40 GiB at B=1 H=16 N=16K).
    n2 = c["B"] * c["H"] * c["N"] * c["N"]
    return 10 * n2 + (c["N"] * c["N"] if c["causal"] else 0)


class Peers:
    """The torch-side implementations, built once."""

    def __init__(self, use_flex):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.F, self.B, self.k = F, SDPBackend, sdpa_kernel
        self.flex = None
        self.flex_err = None
        self.create_block_mask = None
        if use_flex:
            try:
                from torch.nn.attention.flex_attention import create_block_mask, flex_attention
                import torch._dynamo as dynamo
                dynamo.config.cache_size_limit = 256
                self.flex = torch.compile(flex_attention, dynamic=False)
                self.create_block_mask = create_block_mask
            except Exception as e:  # noqa: BLE001
                self.flex_err = f"flex unavailable: {short(e)}"

    def flashjit_fn(self, c):
        """flashjit in this process, through the Python binding (ctypes over
        libflashjit.so), on torch's current stream."""
        if not hasattr(self, "_flashjit"):
            os.environ.setdefault("FLASHJIT_LIBRARY",
                                  os.path.join(ROOT, ".carry", "lib", "libflashjit.so"))
            sys.path.insert(0, os.path.join(ROOT, "python"))
            import flashjit as fj_module
            self._flashjit = fj_module
        fj_module = self._flashjit
        return lambda q, k, v: fj_module.attention(q, k, v, causal=c["causal"])

    def sdpa(self, backend, causal):
        be = {"sdpa-flash": self.B.FLASH_ATTENTION, "sdpa-cudnn": self.B.CUDNN_ATTENTION}[backend]
        F, kern = self.F, self.k

        def f(q, k, v):
            with kern([be]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return f

    def flex_fn(self, c):
        if self.flex is None:
            raise RuntimeError(self.flex_err or "flex disabled")
        if not c["causal"]:
            return lambda q, k, v: self.flex(q, k, v)
        bm = self.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, c["N"], c["N"],
                                    device="cuda")
        return lambda q, k, v: self.flex(q, k, v, block_mask=bm)


def time_call(setup, fl):
    """setup() returns the call to time; its first call is timed alone
    (first_call_s), then bench_ms. Errors are recorded, never raised."""
    try:
        step = setup()
        t0 = time.time()
        step()
        torch.cuda.synchronize()
        first_s = time.time() - t0
        ms = bench_ms(step)
        return dict(ms=ms, tflops=tflops_of(ms, fl), first_call_s=round(first_s, 2))
    except Exception as e:  # noqa: BLE001
        return dict(error=short(e))
    finally:
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        torch.cuda.empty_cache()


def time_peer(fn, q, k, v, fl):
    """The forward fn(q, k, v)."""
    return time_call(lambda: (lambda: fn(q, k, v)), fl)


def time_peer_backward(fn, q, k, v, fl):
    """The backward of fn's output (run once, not timed) for a random grad."""
    def setup():
        qq, kk, vv = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fn(qq, kk, vv)
        grad = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (qq, kk, vv), grad, retain_graph=True)
    return time_call(setup, fl)


def fmt_peer(m):
    return (f"{m['ms']:.3f} ms, {m['tflops']:.0f} TFLOP/s" if "ms" in m
            else m.get("error") and f"ERROR {m['error']}" or f"skipped: {m.get('skipped')}")


def interleaved_rounds(c, args, fl, flash_peer, backward):
    """args.rounds rounds of (flashjit bench, flash_peer()); flashjit stops
    after its first failure. Returns (flashjit record, sdpa-flash rounds)."""
    fj = dict(rounds=[])
    flash_rounds = []
    tag = "bwd " if backward else ""
    for r in range(args.rounds):
        if not any("time_ms" not in x for x in fj["rounds"]):
            if torch is not None:
                torch.cuda.empty_cache()
            rec = run_flashjit(args.flashjit, c, args.extra, args.flashjit_timeout, backward)
            rec["round"] = r
            fj["rounds"].append(rec)
            log(f"  round {r} {tag}flashjit: " +
                (f"{rec['time_ms']:.3f} ms, {tflops_of(rec['time_ms'], fl):.0f} TFLOP/s, ok={rec.get('ok')}"
                 if "time_ms" in rec else f"ERROR {rec.get('error')}") + f" ({rec.get('wall_s')} s)")
        if flash_peer is not None:
            m = flash_peer()
            flash_rounds.append(m)
            log(f"  round {r} {tag}sdpa-flash: {fmt_peer(m)}")
    summarise_flashjit(fj, fl)
    return fj, flash_rounds


def pair_ratios(fj, flash_rounds):
    """sdpa-flash time / flashjit time per round: flashjit round r against
    the sdpa-flash round right after it."""
    fr = {x["round"]: x["time_ms"] for x in fj["rounds"] if "time_ms" in x}
    return [sm["ms"] / fr[i] if i in fr and "ms" in sm else None
            for i, sm in enumerate(flash_rounds)]


def flash_summary(flash_rounds, fl):
    ok = [m["ms"] for m in flash_rounds if "ms" in m]
    if ok:
        med = statistics.median(ok)
        return dict(ms=med, tflops=tflops_of(med, fl), rounds_ms=ok)
    return dict(error=flash_rounds[0]["error"] if flash_rounds else "not run")


def run_backward_case(c, args, peers, q, k, v):
    """The backward of one case: interleaved (flashjit, sdpa-flash) rounds,
    then sdpa-cudnn."""
    fl = flops(c["B"], c["H"], c["N"], c["d"], c["causal"], backward=True)
    bwd = dict(flops=fl, peers={})
    have_torch = peers is not None and q is not None
    flash_peer = ((lambda: time_peer_backward(peers.sdpa("sdpa-flash", c["causal"]), q, k, v, fl))
                  if have_torch else None)
    bwd["flashjit"], flash_rounds = interleaved_rounds(c, args, fl, flash_peer, backward=True)
    pr = bwd["peers"]
    if not have_torch:
        err = TORCH_ERR if peers is None else "no inputs"
        for p in BACKWARD_PEERS:
            pr[p] = dict(error=err)
    else:
        pr["sdpa-flash"] = flash_summary(flash_rounds, fl)
        pr["sdpa-cudnn"] = time_peer_backward(peers.sdpa("sdpa-cudnn", c["causal"]), q, k, v, fl)
        log(f"  bwd sdpa-cudnn: {fmt_peer(pr['sdpa-cudnn'])}")
    a, b = bwd["flashjit"].get("tflops"), pr.get("sdpa-flash", {}).get("tflops")
    bwd["ratio_flashjit_over_sdpa_flash"] = a / b if a and b else None
    bwd["ratio_per_round"] = pair_ratios(bwd["flashjit"], flash_rounds)
    return bwd


# -------------------------------------------------------------------- main --

def run_case(c, args, peers, t_start):
    fl = flops(c["B"], c["H"], c["N"], c["d"], c["causal"])
    res = dict(d=c["d"], N=c["N"], B=c["B"], H=c["H"], causal=c["causal"], flops=fl,
               flashjit=dict(rounds=[]), peers={})
    pr = res["peers"]
    q = k = v = None
    if peers is not None:
        try:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = [torch.randn(c["B"], c["H"], c["N"], c["d"], device="cuda", dtype=torch.bfloat16,
                                   generator=gen) for _ in range(3)]
        except Exception as e:  # noqa: BLE001
            res["torch_error"] = f"allocating q, k, v: {short(e)}"
            q = None
    flash_peer = ((lambda: time_peer(peers.sdpa("sdpa-flash", c["causal"]), q, k, v, fl))
                  if q is not None else None)
    res["flashjit"], flash_rounds = interleaved_rounds(c, args, fl, flash_peer, backward=False)
    fj = res["flashjit"]

    if peers is None:
        for p in PEERS:
            pr[p] = dict(error=TORCH_ERR)
    elif q is None:
        for p in PEERS:
            pr[p] = dict(error=res.get("torch_error", "no inputs"))
    else:
        pr["sdpa-flash"] = flash_summary(flash_rounds, fl)
        over = time.time() - t_start > args.budget_s
        pr["sdpa-cudnn"] = time_peer(peers.sdpa("sdpa-cudnn", c["causal"]), q, k, v, fl)
        if over:
            pr["flex"] = dict(skipped=f"time budget {args.budget_s:.0f}s spent")
        elif not args.flex:
            pr["flex"] = dict(skipped="--no-flex")
        else:
            try:
                fn = peers.flex_fn(c)
                pr["flex"] = time_peer(fn, q, k, v, fl)
            except Exception as e:  # noqa: BLE001
                pr["flex"] = dict(error=short(e))
            torch.cuda.empty_cache()
        need = naive_bytes(c)
        if over:
            pr["naive"] = dict(skipped=f"time budget {args.budget_s:.0f}s spent")
        elif need > args.naive_max_gb * 1e9:
            pr["naive"] = dict(skipped=f"needs ~{need / 1e9:.0f} GB > {args.naive_max_gb:g} GB")
        else:
            scale = 1 / math.sqrt(c["d"])
            pr["naive"] = time_peer(lambda q, k, v: naive_attn(q, k, v, c["causal"], scale), q, k, v, fl)
        try:
            pr["flashjit-py"] = time_peer(peers.flashjit_fn(c), q, k, v, fl)
        except Exception as e:  # noqa: BLE001
            pr["flashjit-py"] = dict(error=short(e))
        for p in ("sdpa-cudnn", "flex", "naive", "flashjit-py"):
            log(f"  {p}: {fmt_peer(pr[p])}")
    a, b = fj.get("tflops"), pr.get("sdpa-flash", {}).get("tflops")
    res["ratio_flashjit_over_sdpa_flash"] = a / b if a and b else None
    res["ratio_per_round"] = pair_ratios(fj, flash_rounds)
    if args.backward:
        res["backward"] = run_backward_case(c, args, peers, q, k, v)
    if q is not None:
        del q, k, v
        torch.cuda.empty_cache()
    return res


# ------------------------------------------------------------- ncu helpers --
# gpu-run.sh's optional ncu step (FLASHJIT_NCU=1): the DRAM bytes of one
# forward of flashjit vs the naive three-kernel attention (and sdpa-flash).
# The CSV parsing and the summary: side_by_side_report.py.

def ncu_target(name, c):
    """Run one forward of a torch implementation between cudaProfilerStart and
    cudaProfilerStop, for ncu --profile-from-start off."""
    import_torch()
    if torch is None:
        raise SystemExit(TORCH_ERR)
    import importlib
    importlib.import_module("torch.cuda.profiler")  # cudaProfilerStart/Stop
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = [torch.randn(c["B"], c["H"], c["N"], c["d"], device="cuda", dtype=torch.bfloat16,
                           generator=gen) for _ in range(3)]
    if name == "naive":
        scale = 1 / math.sqrt(c["d"])
        fn = lambda: naive_attn(q, k, v, c["causal"], scale)  # noqa: E731
    else:
        f = Peers(False).sdpa(name, c["causal"])
        fn = lambda: f(q, k, v)  # noqa: E731
    fn()  # warm-up: handles, autotuning, lazy module loads stay out of the profile
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main():
    global TORCH_ERR
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flashjit", default=os.path.join(ROOT, ".carry", "bin", "flashjit"))
    ap.add_argument("--flashjit-args", default=os.environ.get("FLASHJIT_BENCH_ARGS", ""),
                    help="extra arguments for 'flashjit bench' (default $FLASHJIT_BENCH_ARGS)")
    ap.add_argument("--flashjit-timeout", type=float, default=180)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench.json"))
    ap.add_argument("--cases", default=None)
    ap.add_argument("--quick", action="store_true", default=os.environ.get("FLASHJIT_QUICK") == "1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flex", dest="flex", action="store_false")
    ap.add_argument("--no-backward", dest="backward", action="store_false",
                    default=os.environ.get("FLASHJIT_BENCH_BACKWARD", "1") != "0",
                    help="forward only (default: each case's backward too; FLASHJIT_BENCH_BACKWARD=0)")
    ap.add_argument("--naive-max-gb", type=float, default=40)
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("FLASHJIT_BENCH_BUDGET_S", 360)),
                    help="past this many seconds, skip flex and naive (the bar pair still runs)")
    ap.add_argument("--print-table", metavar="FILE", help="print the table of a results file and exit")
    ap.add_argument("--ncu-target", choices=("naive", "sdpa-flash", "sdpa-cudnn"),
                    help="run one forward of this peer inside cudaProfilerStart/Stop (first case) and exit")
    ap.add_argument("--ncu-summary", nargs="+", metavar="NAME=CSV",
                    help="summarise ncu CSV exports (first case's shape) and exit")
    args = ap.parse_args()

    if args.print_table:
        with open(args.print_table) as fh:
            print(table(json.load(fh)))
        return 0
    if args.ncu_target or args.ncu_summary:
        c = parse_cases(args.cases or "128:4096:n")[0]
        if args.ncu_target:
            ncu_target(args.ncu_target, c)
        else:
            print(ncu_summary([tuple(x.split("=", 1)) for x in args.ncu_summary], c))
        return 0

    args.extra = shlex.split(args.flashjit_args)
    cases = parse_cases(args.cases or (QUICK_CASES if args.quick else DEFAULT_CASES))
    if args.quick:
        args.flex = False
    t_start = time.time()
    import_torch()
    meta = dict(started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rounds=args.rounds,
                flashjit=args.flashjit, flashjit_args=args.extra, quick=args.quick,
                backward=args.backward,
                method="peers: triton.testing.do_bench(warmup=25, rep=100, median); "
                       "flashjit: its own median (CUDA events); bf16; FLOPs 4BHN^2d, causal /2; "
                       "backward: 2.5x, peers timed as autograd.grad(out, (q, k, v), grad)",
                python=sys.version.split()[0])
    peers = None
    if torch is None:
        meta["torch_error"] = TORCH_ERR
        log(f"WARNING: {TORCH_ERR}; measuring flashjit only")
    else:
        meta.update(torch=torch.__version__, device=torch.cuda.get_device_name())
        try:
            import triton
            meta["triton"] = triton.__version__
        except ImportError:
            meta["triton"] = None
        try:
            peers = Peers(args.flex)
            if peers.flex_err:
                log(f"WARNING: {peers.flex_err}")
        except Exception as e:  # noqa: BLE001
            TORCH_ERR = meta["torch_error"] = f"torch peers unavailable: {short(e)}"
            log(f"WARNING: {meta['torch_error']}")
        torch.manual_seed(0)
    log(f"flashjit: {args.flashjit}  torch: {meta.get('torch')}  device: {meta.get('device')}")
    if not os.path.exists(args.flashjit):
        log(f"WARNING: {args.flashjit} does not exist (each flashjit run will record the error)")
    data = dict(meta=meta, cases=[])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for c in cases:
        log(f"== d={c['d']} N={c['N']} B={c['B']} H={c['H']} causal={c['causal']}"
            f"  (t={time.time() - t_start:.0f}s)")
        try:
            data["cases"].append(run_case(c, args, peers, t_start))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            data["cases"].append(dict(d=c["d"], N=c["N"], B=c["B"], H=c["H"], causal=c["causal"],
                                      flashjit=dict(error=f"harness: {short(e)}"), peers={}))
        meta["elapsed_s"] = round(time.time() - t_start, 1)
        with open(args.out, "w") as fh:  # after each case: a kill keeps what was measured
            json.dump(data, fh, indent=1)
    log("")
    log(table(data))
    log(f"(results: {args.out}; {meta['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
