"""Shared by test_torch_gpu.py and test_torch_captured_gpu.py (flashjit on
torch CUDA tensors; test_varlen_gpu.py takes the bounds and the fixture):
the `cuda` skip mark, the error bounds, the `seed` fixture, the float64 references (torch's math SDPA), the forward and
gradient checks and the input makers.

A test module imports it after its own pytest.importorskip("torch") (this
module skips the same way without torch), and imports the `seed` fixture by
name so that pytest finds it.
"""

import os

import pytest

import flashjit
from reference import visible_mask

torch = pytest.importorskip(
    "torch", reason="torch is not installed (test_cpu.py covers the CPU path)")
F = torch.nn.functional

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA GPU (torch.cuda.is_available() is "
                          "False)")

BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
# Gradients: the float64 reference's D = rowsum(dO * O) uses the exact O,
# flashjit's the forward's O rounded to the dtype (as a user has it), which
# moves dS = P * (dP - D) by up to ~1e-2 in bf16 (reference.py).
GRAD_BOUND = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


@pytest.fixture
def seed():
    """A fresh seed for torch's generators, reported by failing checks
    (and printed: pytest shows it with a failure)."""
    s = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    print(f"seed {s}")
    return s


def visible(nq, nkv, causal=False, window=None, dense=None, block=None,
            device="cuda"):
    """[B|1, H|1, Nq, Nkv] boolean mask (bottom-right aligned), on device."""
    if dense is not None:
        dense = torch.as_tensor(dense).bool().cpu().numpy()
    return torch.as_tensor(visible_mask(nq, nkv, causal, window, dense, block),
                           device=device)


def sdpa64(q, k, v, vis, scale=None):
    """o of float64 q, k, v by torch's math SDPA, differentiable: K and V
    repeated over each GQA group (repeat_interleave, whose backward sums
    dK and dV over the group), the mask vis explicit; rows without a
    visible key: o = 0."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    vis = vis.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    empty = ~vis.any(-1, keepdim=True)
    safe = vis | empty  # SDPA gives NaN for a row that sees nothing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=safe,
                                           scale=scale)
    return torch.where(empty, torch.zeros_like(o), o)


def forward_reference(q, k, v, vis, scale=None):
    """(o, lse) in float64 with torch's math SDPA; rows without a visible
    key: o = 0, lse = -inf."""
    q, k, v = q.double(), k.double(), v.double()
    o = sdpa64(q, k, v, vis, scale)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    sc = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * sc
    lse = torch.logsumexp(s.masked_fill(~vis, float("-inf")), dim=-1)
    return o, lse


def grads_reference(q, k, v, d_o, vis, scale=None):
    """(dq, dk, dv) in float64: autograd through sdpa64 on float64 copies."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    sdpa64(q, k, v, vis, scale).backward(d_o.double())
    return q.grad, k.grad, v.grad


def rel(x, ref, floor=1e-300):
    """||x - ref|| / max(||ref||, floor)."""
    x = x.double()
    return ((x - ref).norm() / ref.norm().clamp_min(floor)).item()


def check(q, k, v, causal=False, scale=None, window=None, block_mask=None,
          dense=None):
    o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                window=window, block_mask=block_mask,
                                return_lse=True)
    assert o.dtype == q.dtype and o.device == q.device
    assert o.shape == q.shape[:3] + (v.shape[3],)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    block = block_mask.block_size if block_mask is not None else None
    vis = visible(q.shape[2], k.shape[2], causal, window, dense, block)
    ro, rl = forward_reference(q, k, v, vis, scale)
    assert not torch.isnan(o).any()
    assert rel(o, ro) <= BOUND[q.dtype], rel(o, ro)
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rl))
    if fin.any():
        assert rel(lse[fin], rl[fin]) <= BOUND[q.dtype]
    return o, lse


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def leaves(*tensors):
    """The tensors as leaves that require grad."""
    return tuple(t.detach().requires_grad_() for t in tensors)


def check_grads(q, k, v, seed, causal=False, scale=None, window=None,
                block_mask=None, dense=None, d_o=None, deterministic=False):
    """dq, dk, dv of flashjit.attention through autograd (q, k, v require
    grad) for the upstream gradient d_o (default: random), checked against
    float64 SDPA with the same mask; returns them."""
    o = flashjit.attention(q, k, v, causal=causal, scale=scale, window=window,
                           block_mask=block_mask, deterministic=deterministic)
    assert o.requires_grad
    if d_o is None:
        d_o = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), d_o)
    block = block_mask.block_size if block_mask is not None else None
    vis = visible(q.shape[2], k.shape[2], causal, window, dense, block)
    want = grads_reference(q, k, v, d_o, vis, scale)
    # A gradient that is exactly 0 in exact arithmetic (a window of one key:
    # P = 1, so dS = P (dP - delta) = 0) is rounding noise in any kernel: its
    # error is measured against 1e-3 of the largest gradient's norm.
    floor = 1e-3 * max(ref.norm().item() for ref in want)
    for name, g, ref, like in zip(("dq", "dk", "dv"), got, want, (q, k, v)):
        assert g.dtype == like.dtype and g.shape == like.shape, name
        assert g.device == like.device, name
        assert torch.isfinite(g).all(), f"{name}: not finite (seed {seed})"
        err = rel(g, ref, floor)
        assert err <= GRAD_BOUND[q.dtype], (
            f"{name}: relative error {err:.3g} (seed {seed})")
    return got
