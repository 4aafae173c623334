#!/usr/bin/env python3
"""Per-call host overhead of flashjit.attention from Python (GPU).

2000 calls of a tiny attention (1 x 1 x 128 x 64 bf16, whose kernel takes
a few microseconds) after a warm-up, timed two ways (per_call_us): "host",
the calls' own time in batches of 200 with an untimed synchronization after
each (no call waits for the device: the per-call overhead the targets are
about), and "loop", one loop plus its synchronization (bounded below by the
device's time per kernel). Compared with
torch.nn.functional.scaled_dot_product_attention on the same tensors, in
the same run. The rows take turns: --rounds (5) interleaved rounds, each
timing every row once from a different first row; each figure is the
median over the rounds, shown with its range. --parts also times the
pieces of the eager call alone (interleaved likewise).

Rows:
  flashjit.attention        the public call, no autograd (the eager path:
                            a cached plan, one flashjit_plan_forward call)
  flashjit::attention_fwd   the torch.library op, through the dispatcher
  flashjit.attention+grad   inputs that require grad (autograd records;
                            forward only)
  ... plan call by ctypes / by _fastcall
                            flashjit.attention with its one foreign call
                            made through ctypes or through the
                            flashjit._fastcall extension (the default where
                            it is built; FLASHJIT_FASTCALL=0 takes ctypes)
  C API plan via ctypes     flashjit_plan_forward with every argument
                            prebuilt: the plan call's own cost plus one
                            ctypes call
  C API plan via _fastcall  the same through flashjit._fastcall (the floor
                            of this binding)
  C API forward via ctypes  flashjit_forward, prebuilt arguments (the
                            unplanned C call: spec, checks, cache lookups
                            on every call)
  sdpa                      torch's SDPA (its default backend choice)
  C++ ...                   flashjit-plan-bench: flashjit_plan_forward and
                            flashjit_forward from C++, and cuLaunchKernel of
                            an empty kernel with the same arguments (the
                            driver's floor under any launch), also with
                            the arguments packed into one buffer and on a
                            non-blocking stream (and the plan call there)

With --plan-bench PATH (default: build/bin/flashjit-plan-bench if it
exists) the C++ micro-benchmark of the plan call (no Python, no ctypes;
tests/bench/PlanOverhead.cpp) runs too and its rows are added.

    python3 tests/bench/overhead.py [--calls 2000] [--rounds 5] [--parts]
                                     [--json out.json]

Exit 1 if flashjit.attention's host time per call is above --target-us
(10) or the C++ plan call's above --c-target-us (3).
"""

import argparse
import ctypes
import json
import os
import pathlib
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import flashjit
from flashjit import _lib, _torch_impl

ROOT = pathlib.Path(__file__).resolve().parents[2]


def per_call_us(fn, calls, repeats=5, batch=200):
    """(host, loop) microseconds per call, the medians over repeats of:
    host, the calls' own time in batches of `batch` calls (fewer than the
    driver's launch queue holds, so that no call waits for the device), each
    batch followed by an untimed synchronization; loop, one loop of `calls`
    calls plus the synchronization after it (the device's time per kernel
    bounds it below)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    host, loop = [], []
    for _ in range(repeats):
        seconds = 0.0
        for start in range(0, calls, batch):
            n = min(batch, calls - start)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            seconds += time.perf_counter() - t0
            torch.cuda.synchronize()
        host.append(seconds / calls * 1e6)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        loop.append((time.perf_counter() - t0) / calls * 1e6)
    host.sort()
    loop.sort()
    return host[len(host) // 2], loop[len(loop) // 2]


def interleaved(rows, calls, rounds):
    """{name: (host, loop, host_rounds)} of (name, fn) rows timed in
    `rounds` interleaved rounds: each round times every row once
    (per_call_us with one repeat), starting one row further on, so that no
    row always runs first, after another or under a passing slowdown of the
    host; host and loop are the medians over the rounds. (Timed one row
    after the other, the first row measured 21.0 us in T25-A against 12.6
    us for the same call at the end of the run.)"""
    times = {name: ([], []) for name, _ in rows}
    for r in range(rounds):
        for name, fn in rows[r % len(rows):] + rows[:r % len(rows)]:
            host, loop = per_call_us(fn, calls, repeats=1)
            times[name][0].append(host)
            times[name][1].append(loop)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {name: (median(h), median(l), h) for name, (h, l) in times.items()}


def parts(q, k, v, plan_call, calls, rounds):
    """Host microseconds of the pieces of flashjit.attention's eager call,
    each alone (--parts)."""
    p = only_plan(q, k, v)
    T, dev, f32 = torch.Tensor, p.device, torch.float32
    grad, compiling = torch.is_grad_enabled, torch.compiler.is_compiling
    plans = _torch_impl._fwd_plans
    key = plan_key(q, k, v)
    raw = torch._C._cuda_getCurrentRawStream
    pieces = [
        ("checks (types, grad, compiling)", lambda: (
            type(q) is T, type(k) is T, type(v) is T, q.is_cuda, grad(),
            q.requires_grad, k.requires_grad, v.requires_grad, compiling())),
        ("key tuple", lambda: (
            q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
            q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
            v.get_device(), 0, 0.0, -1, -1, (q.data_ptr() | k.data_ptr()
                                             | v.data_ptr()) & 15)),
        ("dict lookup", lambda: plans.get(key)),
        ("torch.empty o", lambda: torch.empty(p.o_shape, dtype=p.dtype,
                                              device=dev)),
        ("torch.empty lse", lambda: torch.empty(p.lse_shape, dtype=f32,
                                                device=dev)),
        # What the planned call allocates o with where the plan lays o out
        # as a contiguous q (_ForwardPlan.o_like_q).
        ("torch.empty_like(q)", lambda: torch.empty_like(q)),
        ("raw stream", lambda: raw(p.index)),
        ("plan_forward as attention calls it", plan_call),
        ("flashjit.attention (all)", lambda: flashjit.attention(q, k, v)),
    ]
    return {name: t[0] for name, t in
            interleaved(pieces, calls, rounds).items()}


def plan_key(q, k, v):
    """The key _torch_impl caches the dense, unmasked, default-scale plan of
    q, k, v under (as forward_cuda and fast_forward build it)."""
    align = (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
            q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
            v.get_device(), 0, 0.0, -1, -1, align, "")


def only_plan(q, k, v):
    """The _ForwardPlan flashjit.attention(q, k, v) uses (made by a call)."""
    flashjit.attention(q, k, v)
    p = _torch_impl._fwd_plans.get(plan_key(q, k, v))
    assert p is not None, "no cached plan under forward_cuda's key"
    return p


def c_plan_call(q, k, v, fn):
    """A zero-argument function calling flashjit_plan_forward through fn
    (ctypes' function or flashjit._fastcall's) with prebuilt arguments (the
    plan flashjit.attention caches, used directly)."""
    p = only_plan(q, k, v)
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    stream = torch.cuda.current_stream().cuda_stream
    args = (p.ptr, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
            lse.data_ptr(), None, None, stream)
    assert fn(*args) == 0, _lib.lib().flashjit_last_error(None)

    def call():
        fn(*args)

    return call, (o, lse)


def c_forward_call(q, k, v):
    """A zero-argument function calling flashjit_forward (no plan) with
    prebuilt ctypes arguments."""
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    B, H, N, D = q.shape
    spec = _lib.make_spec(D, D, _lib.DTYPE_BF16, _lib.MASK_NONE, 1, 0)
    ts = [_lib.make_tensor(t.data_ptr(), t.shape, t.stride())
          for t in (q, k, v, o)]
    fn = _lib.lib().flashjit_forward
    h = _torch_impl.cuda_handle(q.device.index or 0)
    stream = torch.cuda.current_stream().cuda_stream
    by = ctypes.byref
    args = (h, by(spec), *(by(t) for t in ts), lse.data_ptr(), 0.0, -1, -1,
            None, stream)
    assert fn(*args) == 0, _lib.lib().flashjit_last_error(None)

    def call():
        fn(*args)

    return call, (o, lse, spec, ts)


def plan_bench(path, calls):
    """The C++ micro-benchmark's JSON, or {"skipped": why}."""
    if not path:
        return {"skipped": "no flashjit-plan-bench (build it: ninja -C build "
                           "flashjit-plan-bench)"}
    env = dict(os.environ)
    env.setdefault("FLASHJIT_LIBRARY", _lib.library_path())
    out = pathlib.Path(f"/tmp/flashjit-plan-bench-{os.getpid()}.json")
    r = subprocess.run([str(path), "--calls", str(calls * 10), "--json",
                        str(out)], capture_output=True, text=True, env=env,
                       timeout=300)
    sys.stderr.write(r.stdout + r.stderr)
    if r.returncode == 77:
        return {"skipped": (r.stdout + r.stderr).strip()}
    if not out.is_file():
        return {"failed": f"exit {r.returncode}: {r.stderr.strip()}"}
    result = json.loads(out.read_text())
    out.unlink()
    result["exit"] = r.returncode
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--target-us", type=float, default=10.0)
    ap.add_argument("--c-target-us", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds over the rows (median)")
    ap.add_argument("--parts", action="store_true",
                    help="also time the pieces of the eager call alone")
    default_bench = ROOT / "build" / "bin" / "flashjit-plan-bench"
    ap.add_argument("--plan-bench", default=str(default_bench)
                    if default_bench.is_file() else "",
                    help="the C++ micro-benchmark ('' to leave it out)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("overhead.py: needs a CUDA GPU (torch.cuda.is_available() "
                 "is False)")
    shape = (1, 1, 128, 64)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda")
               for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    import flashjit.ops  # noqa: F401

    by_ctypes = _lib.lib().flashjit_plan_forward
    by_fastcall = _lib.plan_forward_function()
    plan_call, keep = c_plan_call(q, k, v, by_ctypes)
    fast_plan_call, keep3 = c_plan_call(q, k, v, by_fastcall)
    forward_call, keep2 = c_forward_call(q, k, v)
    op = torch.ops.flashjit.attention_fwd

    def attention_by(fn):
        """flashjit.attention with its plan call made through fn (set and
        restored per call: both rows pay the same two attribute stores; the
        row above is left as the library chose)."""
        def call():
            _torch_impl._plan_forward = fn
            flashjit.attention(q, k, v)
            _torch_impl._plan_forward = by_fastcall
        return call

    rows = [
        ("flashjit.attention", lambda: flashjit.attention(q, k, v)),
        ("  ... plan call by ctypes", attention_by(by_ctypes)),
        ("  ... plan call by _fastcall", attention_by(by_fastcall)),
        ("flashjit::attention_fwd",
         lambda: op(q, k, v, 0, 0.0, -1, -1, None, None, 0, False)),
        ("flashjit.attention+grad", lambda: flashjit.attention(qg, kg, vg)),
        ("C API plan via ctypes", plan_call),
        ("C API plan via _fastcall", fast_plan_call),
        ("C API forward via ctypes", forward_call),
        ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v)),
    ]
    # Device time of one call, for context (CUDA events over 200 calls).
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    for _ in range(20):
        plan_call()
    start.record()
    for _ in range(200):
        plan_call()
    end.record()
    torch.cuda.synchronize()
    kernel_us = start.elapsed_time(end) / 200 * 1e3

    timed = interleaved(rows, args.calls, args.rounds)
    results = {name: t[0] for name, t in timed.items()}
    loops = {name: t[1] for name, t in timed.items()}
    spread = {name: (min(t[2]), max(t[2])) for name, t in timed.items()}
    native = plan_bench(args.plan_bench, args.calls)
    for name in ("plan_forward", "forward"):
        if f"{name}_us" in native:
            row = f"C++ {name.replace('_', ' ')} (no Python)"
            results[row] = native[f"{name}_us"]
            loops[row] = native[f"{name}_loop_us"]
    for key, row in (  # an empty kernel's cuLaunchKernel, three ways
            ("launch_floor_us", "C++ cuLaunchKernel alone"),
            ("launch_floor_packed_us", "C++ ... arguments packed"),
            ("launch_floor_stream_us", "C++ ... on a stream"),
            ("plan_forward_stream_us", "C++ plan forward on a stream")):
        if key in native:
            results[row] = native[key]
            loops[row] = float("nan")
    print(f"per-call time, {args.calls} calls of attention{shape} bf16 "
          f"({torch.cuda.get_device_name()}; back-to-back device time "
          f"~{kernel_us:.1f} us per call)")
    print(f"{'path':<32}{'host us':>10}{'loop us':>10}{'host range':>16}"
          "   (host: the calls alone, in batches; loop: calls + sync; "
          f"medians of {args.rounds} interleaved rounds)")
    for name, us in results.items():
        lo, hi = spread.get(name, (None, None))
        span = f"{lo:>8.2f}-{hi:<7.2f}" if lo is not None else ""
        print(f"{name:<32}{us:>10.2f}{loops[name]:>10.2f}{span}")
    if "plan_forward_us" not in native:
        print(f"C++ plan benchmark: {native}")
    pieces = (parts(q, k, v, fast_plan_call, args.calls, args.rounds)
              if args.parts else {})
    if pieces:
        print("pieces of flashjit.attention, host us each alone:")
        for name, us in pieces.items():
            print(f"  {name:<34}{us:>8.2f}")
    ok_py = results["flashjit.attention"] <= args.target_us
    c_us = native.get("plan_forward_us")
    ok_c = c_us is not None and c_us <= args.c_target_us
    print(f"flashjit.attention: {results['flashjit.attention']:.2f} us/call "
          f"host (target <= {args.target_us} us): "
          f"{'ok' if ok_py else 'ABOVE TARGET'}; sdpa "
          f"{results['sdpa']:.2f} us")
    print("C++ flashjit_plan_forward: " +
          (f"{c_us:.2f} us/call host (target <= {args.c_target_us} us): "
           f"{'ok' if ok_c else 'ABOVE TARGET'}" if c_us is not None
           else "not measured"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": list(shape), "dtype": "bf16",
                       "calls": args.calls, "device":
                       torch.cuda.get_device_name(), "kernel_us": kernel_us,
                       "us_per_call": results, "loop_us_per_call": loops,
                       "rounds": args.rounds, "host_us_per_round":
                       {name: t[2] for name, t in timed.items()},
                       "parts_us": pieces, "target_us": args.target_us,
                       "c_target_us": args.c_target_us, "plan_bench": native,
                       "ok": ok_py and (ok_c or c_us is None), "torch": torch.__version__},
                      f, indent=1)
    del keep, keep2
    return 0 if ok_py and (ok_c or c_us is None) else 1


if __name__ == "__main__":
    sys.exit(main())
