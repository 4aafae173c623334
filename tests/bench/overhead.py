#!/usr/bin/env python3
"""Per-call host overhead of flashjit.attention from Python (GPU).

A host-bound loop: 2000 calls of a tiny attention (1 x 1 x 128 x 64 bf16,
whose kernel takes a few microseconds), timed on the host after a warm-up,
then synchronized; per call = wall time / calls. Compared with
torch.nn.functional.scaled_dot_product_attention on the same tensors.

Rows:
  flashjit.attention        the public call, no autograd (the eager path)
  flashjit::attention_fwd   the torch.library op, through the dispatcher
  flashjit.attention+grad   inputs that require grad (autograd records;
                            forward only)
  C API via ctypes          flashjit_forward with every argument prebuilt:
                            the C API's own per-call cost plus one ctypes
                            call (the floor of any Python binding)
  sdpa                      torch's SDPA (its default backend choice)

    python3 tests/bench/overhead.py [--calls 2000] [--json out.json]

Exit 1 if flashjit.attention's per-call time is above --target-us (10).
"""

import argparse
import ctypes
import json
import sys
import time

import torch
import torch.nn.functional as F

import flashjit
from flashjit import _lib, _torch_impl


def per_call_us(fn, calls, repeats=5):
    """Median over repeats of (host time of `calls` calls + sync) / calls."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    times.sort()
    return times[len(times) // 2]


def c_api_call(q, k, v):
    """A zero-argument function calling flashjit_forward with prebuilt
    ctypes arguments (the plan flashjit.attention caches, used directly)."""
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    key = next(iter(_torch_impl._fwd_plans))
    p = _torch_impl._fwd_plans[key]
    tq, tk, tv, to = p.structs
    tq.data, tk.data, tv.data, to.data = (q.data_ptr(), k.data_ptr(),
                                          v.data_ptr(), o.data_ptr())
    fn = _lib.lib().flashjit_forward
    h = _torch_impl.cuda_handle(p.index)
    stream = torch.cuda.current_stream().cuda_stream
    args = (h, p.spec_ref, *p.refs, lse.data_ptr(), 0.0, -1, -1, None, stream)

    def call():
        fn(*args)

    return call, (o, lse)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--target-us", type=float, default=10.0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("overhead.py: needs a CUDA GPU (torch.cuda.is_available() "
                 "is False)")
    shape = (1, 1, 128, 64)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda")
               for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    import flashjit.ops  # noqa: F401

    c_call, keep = c_api_call(q, k, v)
    op = torch.ops.flashjit.attention_fwd
    rows = [
        ("flashjit.attention", lambda: flashjit.attention(q, k, v)),
        ("flashjit::attention_fwd",
         lambda: op(q, k, v, 0, 0.0, -1, -1, None, None, 0, False)),
        ("flashjit.attention+grad", lambda: flashjit.attention(qg, kg, vg)),
        ("C API via ctypes", c_call),
        ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v)),
    ]
    # Device time of one call, for context (CUDA events over 200 calls).
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    for _ in range(20):
        c_call()
    start.record()
    for _ in range(200):
        c_call()
    end.record()
    torch.cuda.synchronize()
    kernel_us = start.elapsed_time(end) / 200 * 1e3

    results = {}
    for name, fn in rows:
        results[name] = per_call_us(fn, args.calls)
    print(f"per-call time, {args.calls} calls of attention{shape} bf16 "
          f"({torch.cuda.get_device_name()}; kernel alone ~{kernel_us:.1f} us "
          "back to back)")
    print(f"{'path':<26}{'us/call':>10}")
    for name, us in results.items():
        print(f"{name:<26}{us:>10.2f}")
    ok = results["flashjit.attention"] <= args.target_us
    print(f"flashjit.attention: {results['flashjit.attention']:.2f} us/call "
          f"(target <= {args.target_us} us): {'ok' if ok else 'ABOVE TARGET'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": list(shape), "dtype": "bf16",
                       "calls": args.calls, "device":
                       torch.cuda.get_device_name(), "kernel_us": kernel_us,
                       "us_per_call": results, "target_us": args.target_us,
                       "ok": ok, "torch": torch.__version__}, f, indent=1)
    del keep
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
