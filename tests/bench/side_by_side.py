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
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The bar case first: d=128, N=16384, B=1, H=16, non-causal.
DEFAULT_CASES = "128:16384:n,64:16384:n,96:16384:n,256:16384:n,128:16384:c"
QUICK_CASES = "128:16384:n,128:4096:c"
PEERS = ("sdpa-flash", "sdpa-cudnn", "flex", "naive", "flashjit-py")
BACKWARD_PEERS = ("sdpa-flash", "sdpa-cudnn")

torch = None
TORCH_ERR = None


def log(*a):
    print(*a, flush=True)


def short(e, n=240):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:n]


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


def tflops_of(ms, fl):
    return fl / ms / 1e9 if ms and ms > 0 else None


# ---------------------------------------------------------------- flashjit --

def flashjit_cmd(exe, c, extra, backward=False):
    cmd = [exe, "bench", "--head-dim", str(c["d"]), "--seq-len", str(c["N"]),
           "--batch", str(c["B"]), "--heads", str(c["H"])]
    if c["causal"]:
        cmd.append("--causal")
    if backward:
        cmd.append("--backward")
    return cmd + ["--json"] + extra


def run_flashjit(exe, c, extra, timeout, backward=False):
    """One flashjit bench run. Returns a dict; 'time_ms' is set on success."""
    cmd = flashjit_cmd(exe, c, extra, backward)
    rec = dict(cmd=" ".join(shlex.quote(x) for x in cmd))
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        rec.update(error=f"not found: {short(e)}", wall_s=round(time.time() - t0, 2))
        return rec
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        rec.update(error=f"timed out after {timeout}s", stderr_tail=err[-1500:],
                   wall_s=round(time.time() - t0, 2))
        return rec
    except Exception as e:  # noqa: BLE001 - record anything and go on
        rec.update(error=f"could not run: {short(e)}", wall_s=round(time.time() - t0, 2))
        return rec
    rec.update(rc=p.returncode, wall_s=round(time.time() - t0, 2))
    errl = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()]
    last_err = f" (stderr: {errl[-1][:200]})" if errl else ""
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    obj = None
    for ln in reversed(lines):
        try:
            cand = json.loads(ln)
        except ValueError:
            continue
        if isinstance(cand, dict):
            obj = cand
            break
    if obj is not None and len(lines) != 1:
        rec["contract_warning"] = f"stdout had {len(lines)} non-empty lines, want exactly 1 JSON line"
    if obj is None:
        rec.update(error=f"rc={p.returncode}, no JSON object on stdout{last_err}",
                   stdout_tail=p.stdout[-800:], stderr_tail=p.stderr[-1500:])
        return rec
    rec["json"] = obj
    missing = [k for k in ("time_ms", "tflops", "config", "ok") if k not in obj]
    if missing:
        rec["contract_warning"] = (rec.get("contract_warning", "") + f"; missing fields {missing}").lstrip("; ")
    tm = obj.get("time_ms")
    if p.returncode != 0 or not isinstance(tm, (int, float)) or not tm > 0:
        rec.update(error=f"rc={p.returncode}, time_ms={tm!r}" +
                   (f", error={obj.get('error')!r}" if obj.get("error") else last_err),
                   stderr_tail=p.stderr[-1500:])
        return rec
    rec["time_ms"] = float(tm)
    rec["ok"] = obj.get("ok")
    if obj.get("ok") is not True:
        rec["stderr_tail"] = p.stderr[-1500:]
    return rec


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


def summarise_flashjit(fj, fl):
    """Median time and TFLOP/s of the rounds that ran, ok, config, the first
    error and contract warning, into fj."""
    ran = [x for x in fj["rounds"] if "time_ms" in x]
    if ran:
        fj["median_ms"] = statistics.median(x["time_ms"] for x in ran)
        fj["tflops"] = tflops_of(fj["median_ms"], fl)
        fj["ok"] = all(x.get("ok") is True for x in ran)
        rep = [x["json"].get("tflops") for x in ran]
        rep = [x for x in rep if isinstance(x, (int, float))]
        if rep:
            fj["tflops_reported_median"] = statistics.median(rep)
            if abs(fj["tflops_reported_median"] / fj["tflops"] - 1) > 0.02:
                fj["note"] = "flashjit's own tflops differs >2% from this script's FLOP count (causal convention?)"
        fj["config"] = ran[0]["json"].get("config")
    errs = [x["error"] for x in fj["rounds"] if "error" in x]
    if errs:
        fj["error"] = errs[0]
    warns = [x["contract_warning"] for x in fj["rounds"] if "contract_warning" in x]
    if warns:
        fj["contract_warning"] = warns[0]


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


def fmt_t(m, terr=None):
    if not m:
        return "-"
    if m.get("tflops") is not None:
        return f"{m['tflops']:.0f}"
    if "skipped" in m:
        return "skip"
    if "error" in m:
        return "n/a" if terr and m["error"] == terr else "err"
    return "-"


def table(data):
    """The final table: a "fwd" row per case and, when measured, a "bwd" row
    (flashjit, sdpa-flash, sdpa-cudnn backward; the other peers "-")."""
    rows = []
    meta = data.get("meta", {})
    terr = meta.get("torch_error")
    hdr = ("d", "N", "causal", "pass", "flashjit", "sdpa-flash", "sdpa-cudnn", "flex", "naive",
           "fj-in-proc", "ratio")
    notes = []
    for r in data.get("cases", []):
        tag = f"d={r['d']} N={r['N']} {'causal' if r['causal'] else 'non-causal'}"
        passes = [("fwd", r)]
        if "backward" in r:
            passes.append(("bwd", r["backward"]))
        for name, part in passes:
            fj = part.get("flashjit", {})
            if fj.get("tflops") is not None:
                f = f"{fj['tflops']:.0f}" + ("" if fj.get("ok") else "!")
            else:
                f = "err"
            pr = part.get("peers", {})
            ratio = part.get("ratio_flashjit_over_sdpa_flash")
            rows.append((str(r["d"]), str(r["N"]), "y" if r["causal"] else "n", name, f,
                         *(fmt_t(pr.get(p), terr) for p in PEERS), f"{ratio:.2f}" if ratio else "-"))
            who = "flashjit" if name == "fwd" else "flashjit backward"
            if fj.get("error"):
                notes.append((who, tag, fj["error"]))
            elif fj.get("tflops") is not None and not fj.get("ok"):
                notes.append((who, tag, "ok is not true (! in table)"))
            if fj.get("note"):
                notes.append((who, tag, fj["note"]))
            if fj.get("contract_warning"):
                notes.append((who, tag, f"contract: {fj['contract_warning']}"))
            for p, m in pr.items():
                if m.get("error") and m["error"] != terr:
                    notes.append((p if name == "fwd" else f"{p} backward", tag, m["error"]))
    w = [max(len(h), *(len(x[i]) for x in rows)) if rows else len(h) for i, h in enumerate(hdr)]
    out = []
    out.append(f"side-by-side forward and backward, bf16, TFLOP/s = 4BHN^2d/t (causal /2; bwd: 2.5x "
               f"the forward's FLOPs); flashjit & sdpa-flash: median of {meta.get('rounds', '?')} "
               f"interleaved rounds; {meta.get('device') or 'no GPU'}")
    out.append("  ".join(h.rjust(w[i]) for i, h in enumerate(hdr)))
    for x in rows:
        out.append("  ".join(v.rjust(w[i]) for i, v in enumerate(x)))
    if terr:
        notes.insert(0, ("peers not measured", "", terr))
    # one line per distinct message: "flashjit (3 cases): rc=2, ..."
    grouped = {}
    for who, tag, msg in notes:
        grouped.setdefault((who, msg), []).append(tag)
    for (who, msg), tags in list(grouped.items())[:12]:
        where = tags[0] if len(tags) == 1 else f"{len(tags)} cases"
        out.append(f"  note: {who} {where}: {msg}" if where else f"  note: {who}: {msg}")
    return "\n".join(out)


# ------------------------------------------------------------- ncu helpers --
# gpu-run.sh's optional ncu step (FLASHJIT_NCU=1): the DRAM bytes of one
# forward of flashjit vs the naive three-kernel attention (and sdpa-flash).

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


def _num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(path):
    """Per-kernel metrics from `ncu -i REP --csv --page raw|details` output:
    [{'kernel': name, metric: value, ...}]. Handles the wide (one column per
    metric) and the long (Metric Name / Metric Value) layouts."""
    import csv
    with open(path, errors="replace") as fh:
        lines = [ln for ln in fh if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    hdr = rows[0]
    kernels = {}
    if "Metric Name" in hdr:
        iid, ik, im, iv = (hdr.index("ID"), hdr.index("Kernel Name"), hdr.index("Metric Name"),
                           hdr.index("Metric Value"))
        iu = hdr.index("Metric Unit") if "Metric Unit" in hdr else None
        for r in rows[1:]:
            if len(r) <= max(iid, ik, im, iv):
                continue
            rec = kernels.setdefault(r[iid], {"kernel": r[ik]})
            val = _num(r[iv])
            unit = r[iu].lower() if iu is not None else ""
            mult = {"kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "usecond": 1e3, "msecond": 1e6}.get(unit, 1)
            rec[r[im]] = val * mult if val is not None else None
    else:
        ik = next((hdr.index(h) for h in ("Kernel Name", "Function Name") if h in hdr), None)
        for r in rows[1:]:
            if not r or not r[0].strip() or not r[0].strip().isdigit():
                continue  # the units row
            rec = {"kernel": r[ik] if ik is not None else "?"}
            for h, x in zip(hdr, r):
                if "__" in h:
                    rec[h] = _num(x)
            kernels[r[0]] = rec
    return list(kernels.values())


def ncu_summary(files, c):
    """Text summary: DRAM bytes per implementation against the fewest bytes a
    forward must move (Q, K, V read once, O written once)."""
    B, H, N, d = c["B"], c["H"], c["N"], c["d"]
    min_bytes = 4 * B * H * N * d * 2
    out = [f"ncu DRAM traffic of one forward, bf16 B={B} H={H} N={N} d={d} "
           f"{'causal' if c['causal'] else 'non-causal'}; fewest bytes (Q,K,V read + O written once) "
           f"= {min_bytes / 1e6:.1f} MB; scores alone (B*H*N^2 bf16) = {B * H * N * N * 2 / 1e6:.0f} MB"]
    out.append(f"{'impl':<12} {'kernels':>7} {'read MB':>10} {'write MB':>10} {'total MB':>10} {'x fewest':>9} "
               f"{'gpu ms':>8}")
    for name, path in files:
        try:
            ks = parse_ncu_csv(path)
        except Exception as e:  # noqa: BLE001
            out.append(f"{name:<12} could not parse {path}: {short(e)}")
            continue
        if not ks:
            out.append(f"{name:<12} no kernels profiled (see the ncu log)")
            continue
        rd = sum(k.get("dram__bytes_read.sum") or 0 for k in ks)
        wr = sum(k.get("dram__bytes_write.sum") or 0 for k in ks)
        ns = sum(k.get("gpu__time_duration.sum") or 0 for k in ks)
        out.append(f"{name:<12} {len(ks):>7} {rd / 1e6:>10.1f} {wr / 1e6:>10.1f} {(rd + wr) / 1e6:>10.1f} "
                   f"{(rd + wr) / min_bytes:>9.2f} {ns / 1e6:>8.3f}")
        for k in ks:
            out.append(f"    {(k.get('dram__bytes_read.sum') or 0) / 1e6:>9.1f} R {(k.get('dram__bytes_write.sum') or 0) / 1e6:>9.1f} W"
                       f"  {k['kernel'][:90]}")
    return "\n".join(out)


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
