"""Shared inputs and checks of the variable-length packing tests
(test_varlen_cpu.py: numpy; test_varlen_torch_cpu.py: torch CPU tensors;
test_varlen_gpu.py): packed inputs, the per-sequence float64 check and the
cases."""

import os

import numpy as np
import pytest

import flashjit
import reference
from reference import cu_seqlens, lse_err, rel_err

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(
    torch is None, reason="torch is not installed (the numpy tests cover "
    "the CPU path)")

BOUND = {np.float16: 5e-3, np.float32: 1e-2}  # fp16, bf16
GRAD_BOUND = {np.float16: 5e-3, np.float32: 2e-2}


def fresh_rng():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def kernel_view(x):
    """The values the kernel computes with (float16, or float32 -> bf16)."""
    x = np.asarray(x)
    if x.dtype == np.float16:
        return x.astype(np.float64)
    return flashjit._bf16_bits_to_f32(flashjit._f32_to_bf16_bits(x)).astype(
        np.float64)


def packed(rng, lens_q, lens_k, H, Hkv, d, dv, dtype=np.float16):
    """Fresh standard normal q (total_q, H, d), k, v (total_k, Hkv, d|dv)
    and their offsets."""
    cq, ck = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = rng.standard_normal((cq[-1], H, d)).astype(dtype)
    k = rng.standard_normal((ck[-1], Hkv, d)).astype(dtype)
    v = rng.standard_normal((ck[-1], Hkv, dv)).astype(dtype)
    return q, k, v, cq, ck


def check_forward(o, lse, q, k, v, cq, ck, bound, **opts):
    """o and lse against the per-sequence float64 reference; lse's padding
    -inf; returns the reference o."""
    ro, rl = reference.varlen_attention_ref(
        kernel_view(q), kernel_view(k), kernel_view(v), cq, ck,
        max_q=lse.shape[2], **opts)
    o, lse = np.asarray(o, dtype=np.float64), np.asarray(lse, np.float64)
    assert o.shape == ro.shape and lse.shape == rl.shape
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert rel_err(o, ro) <= bound, rel_err(o, ro)
    # lse_err also asks for -inf exactly where the reference has it: the
    # padding rows and the rows that see no key.
    assert lse_err(lse, rl) <= bound, lse_err(lse, rl)
    return ro


# (lens_q, lens_k, H, Hkv, d, dv, options)
CASES = {
    # causal, Nq != Nkv per sequence both ways, a sequence without keys,
    # lengths that do not divide the tiles, GQA 2, d != dv
    "causal-mixed": ([9, 30, 5, 1, 70], [20, 30, 0, 7, 65], 4, 2, 32, 48,
                     dict(causal=True)),
    # no mask, GQA 4, a sequence of one query, one of three keys
    "full-gqa4": ([1, 64, 129], [100, 3, 129], 8, 2, 32, 32, {}),
    # a window around the per-sequence diagonal, MQA, odd head dims
    "window-mqa": ([40, 17, 66], [50, 17, 33], 3, 1, 24, 40,
                   dict(window=(5, 2))),
    # sequences without queries (their keys are never used)
    "no-queries": ([0, 17, 0, 33], [5, 17, 9, 40], 2, 2, 16, 16,
                   dict(causal=True)),
    "scale": ([31, 2], [31, 77], 2, 1, 64, 32, dict(scale=0.3)),
}

def torch_packed(rng, lens_q, lens_k, H, Hkv, d, dv, dtype, grad=False):
    q, k, v, cq, ck = packed(rng, lens_q, lens_k, H, Hkv, d, dv, np.float32)
    q, k, v = (torch.from_numpy(x).to(dtype).requires_grad_(grad)
               for x in (q, k, v))
    return q, k, v, torch.from_numpy(cq), torch.from_numpy(ck)


def as64(t):
    return t.detach().double().numpy()
