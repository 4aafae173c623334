"""T34-5: host and device time of flashjit.attention with a window (1024
keys, N 8192, H 16, d 128) against plain, with and without requires_grad,
as variants.py calls it; and a profile of the window's host path."""
import cProfile, io, os, pstats, sys, time
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import flashjit
from triton.testing import do_bench

q, k, v = [torch.randn(1, 16, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
qg, kg, vg = [t.clone().requires_grad_() for t in (q, k, v)]
cases = {
    "plain": (lambda a, b, c: flashjit.attention(a, b, c)),
    "window": (lambda a, b, c: flashjit.attention(a, b, c, window=(1024, 0))),
    "causal": (lambda a, b, c: flashjit.attention(a, b, c, causal=True)),
}
for name, f in cases.items():
    for grad in (False, True):
        a, b, c = (qg, kg, vg) if grad else (q, k, v)
        f(a, b, c); torch.cuda.synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            f(a, b, c)
        host = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        dev = do_bench(lambda: f(a, b, c), warmup=25, rep=100)
        print(f"{name:7s} grad={grad!s:5s} host {host:8.1f} us/call  do_bench {dev*1e3:8.1f} us", flush=True)
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    cases["window"](qg, kg, vg)
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
print("\n".join(s.getvalue().splitlines()[:40]))
