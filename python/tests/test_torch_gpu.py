"""flashjit on torch CUDA tensors, against torch's math SDPA in float64:
the forward (o, lse) and autograd's backward (dq, dk, dv).

Skips without torch; the CUDA tests skip without a GPU. The input-checking
tests need torch only (CPU tensors run in the CPU execution mode).
Inputs are fresh random numbers each run; a failure prints its seed.
"""

import ctypes
import os

import numpy as np
import pytest

import flashjit
from flashjit import _lib
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
    """A fresh seed for torch's generators, reported by failing checks."""
    s = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
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


# -- numbers ------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [
    # B, H, Hkv, Nq, Nkv, d, dv
    (1, 1, 1, 1, 1, 64, 64),
    (2, 4, 4, 256, 256, 64, 64),
    (2, 8, 2, 1000, 1000, 128, 128),  # GQA 4
    (1, 4, 1, 77, 130, 96, 96),       # MQA, Nq < Nkv
    (2, 2, 2, 130, 77, 40, 24),       # Nq > Nkv, dqk != dv
    (1, 2, 2, 300, 300, 256, 256),
])
@pytest.mark.parametrize("causal", [False, True])
def test_forward(dtype, shape, causal):
    torch.manual_seed(hash((shape, causal)) & 0xffff)
    B, H, Hkv, Nq, Nkv, d, dv = shape
    q = randn(B, H, Nq, d, dtype=dtype)
    k = randn(B, Hkv, Nkv, d, dtype=dtype)
    v = randn(B, Hkv, Nkv, dv, dtype=dtype)
    check(q, k, v, causal=causal)


@cuda
def test_strides_from_packed_qkv():
    B, N, H, d = 2, 333, 4, 64
    qkv = randn(B, N, 3, H, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert q.stride() == (N * 3 * H * d, d, 3 * H * d, 1)
    o, _ = check(q, k, v, causal=True)
    o2 = flashjit.attention(q.contiguous(), k.contiguous(), v.contiguous(),
                            causal=True)
    torch.testing.assert_close(o, o2, rtol=0, atol=0)


@cuda
@pytest.mark.parametrize("window", [(64, 0), (9, 3), (None, 17), (0, 0)])
def test_window(window):
    q, k, v = randn(1, 4, 300, 64), randn(1, 4, 400, 64), randn(1, 4, 400, 64)
    check(q, k, v, window=window)


@cuda
def test_scale():
    q, k, v = randn(1, 2, 100, 64), randn(1, 2, 100, 64), randn(1, 2, 100, 64)
    check(q, k, v, scale=0.05)


@cuda
def test_block_mask():
    torch.manual_seed(1)
    B, H, N, blk = 2, 4, 1000, 128
    nb = -(-N // blk)
    dense = torch.rand(B, H, nb, nb) < 0.4
    dense[:, :, 2] = False  # a query block that sees nothing
    bm = flashjit.BlockMask.from_dense(dense, block_size=blk)
    q, k, v = randn(B, H, N, 64), randn(B, H, N, 64), randn(B, H, N, 64)
    o, lse = check(q, k, v, block_mask=bm, dense=dense)
    assert torch.all(o[:, :, 2 * blk:3 * blk] == 0)
    check(q, k, v, causal=True, block_mask=bm, dense=dense)


@cuda
def test_flex_block_mask():
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    blk = 128

    def block_diagonal(b, h, qi, kj):  # constant on each 128 x 128 block
        return (qi // 256) == (kj // 256)

    N = 1024
    fm = fa.create_block_mask(block_diagonal, None, None, N, N, device="cuda",
                              BLOCK_SIZE=blk)
    q, k, v = randn(1, 2, N, 64), randn(1, 2, N, 64), randn(1, 2, N, 64)
    dense = torch.zeros(N // blk, N // blk, dtype=torch.bool)
    for i in range(N // blk):
        for j in range(N // blk):
            dense[i, j] = (i * blk // 256) == (j * blk // 256)
    bm = flashjit.BlockMask.from_flex(fm)
    assert torch.equal(torch.from_numpy(bm.to_dense()[0, 0]), dense)
    o, _ = check(q, k, v, block_mask=bm, dense=dense)
    ref = fa.flex_attention(q.float(), k.float(), v.float(), block_mask=fm)
    assert rel(o, ref.double()) <= 1e-2


@cuda
def test_side_stream_and_no_sync():
    q, k, v = randn(2, 4, 512, 128), randn(2, 4, 512, 128), randn(2, 4, 512, 128)
    ref = flashjit.attention(q, k, v, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o = flashjit.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(o, ref, rtol=0, atol=0)


@cuda
def test_cuda_graph_capture():
    q, k, v = randn(1, 4, 256, 64), randn(1, 4, 256, 64), randn(1, 4, 256, 64)
    ref = flashjit.attention(q, k, v)  # compiles and loads the kernel
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = flashjit.attention(q, k, v)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(o, ref, rtol=0, atol=0)


# -- gradients ----------------------------------------------------------------

GRAD_SHAPES = [
    # B, H, Hkv, Nq, Nkv, d, dv
    (1, 2, 2, 128, 128, 64, 64),
    (2, 8, 2, 300, 300, 128, 128),  # GQA 4
    (1, 4, 1, 77, 130, 96, 96),     # MQA, Nq < Nkv
    (2, 2, 2, 130, 77, 40, 24),     # Nq > Nkv (causal: rows that see no key)
    (1, 2, 1, 65, 97, 7, 33),       # odd head dims, dqk != dv, GQA 2
    (1, 2, 2, 200, 200, 256, 256),  # dK and dV in column chunks
    (1, 1, 1, 100, 150, 320, 200),  # head dims past 256, dqk != dv
]


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", GRAD_SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward(dtype, shape, causal, deterministic, seed):
    B, H, Hkv, Nq, Nkv, d, dv = shape
    q, k, v = leaves(randn(B, H, Nq, d, dtype=dtype),
                     randn(B, Hkv, Nkv, d, dtype=dtype),
                     randn(B, Hkv, Nkv, dv, dtype=dtype))
    check_grads(q, k, v, seed, causal=causal, deterministic=deterministic)


@cuda
@pytest.mark.parametrize("window", [(64, 0), (9, 3), (None, 17), (0, 0)])
def test_backward_window(window, seed):
    q, k, v = leaves(randn(1, 4, 300, 64), randn(1, 2, 400, 64),
                     randn(1, 2, 400, 48))
    check_grads(q, k, v, seed, window=window)


@cuda
def test_backward_scale(seed):
    q, k, v = leaves(randn(1, 2, 100, 64, dtype=torch.float16),
                     randn(1, 2, 100, 64, dtype=torch.float16),
                     randn(1, 2, 100, 64, dtype=torch.float16))
    check_grads(q, k, v, seed, scale=0.05)


@cuda
@pytest.mark.parametrize("causal", [False, True])
def test_backward_block_mask(causal, seed):
    B, H, N, blk = 2, 4, 1000, 128
    nb = -(-N // blk)
    dense = torch.rand(B, H, nb, nb) < 0.4
    dense[:, :, 2] = False     # a query block that sees nothing
    dense[:, :, :, 5] = False  # a key block that no query sees
    bm = flashjit.BlockMask.from_dense(dense, block_size=blk)
    q, k, v = leaves(randn(B, H, N, 64), randn(B, H, N, 64),
                     randn(B, H, N, 64))
    dq, dk, dv = check_grads(q, k, v, seed, causal=causal, block_mask=bm,
                             dense=dense)
    assert torch.all(dq[:, :, 2 * blk:3 * blk] == 0)
    assert torch.all(dk[:, :, 5 * blk:6 * blk] == 0)
    assert torch.all(dv[:, :, 5 * blk:6 * blk] == 0)


@cuda
def test_backward_broadcast_block_mask_with_gqa(seed):
    blk, Nq, Nkv = 64, 300, 500
    dense = torch.rand(-(-Nq // blk), -(-Nkv // blk)) < 0.5  # every head
    bm = flashjit.BlockMask.from_dense(dense, block_size=blk)
    q, k, v = leaves(randn(2, 4, Nq, 80, dtype=torch.float16),
                     randn(2, 2, Nkv, 80, dtype=torch.float16),
                     randn(2, 2, Nkv, 80, dtype=torch.float16))
    check_grads(q, k, v, seed, block_mask=bm, dense=dense)


@cuda
def test_backward_strided_inputs_and_upstream_gradient(seed):
    B, N, H, d = 2, 333, 4, 64
    # q, k, v and dO as (B, N, H, d) tensors seen as (B, H, N, d).
    q, k, v = leaves(*(randn(B, N, H, d).transpose(1, 2) for _ in range(3)))
    assert q.stride() == (N * H * d, d, H * d, 1)
    d_o = randn(B, N, H, d).transpose(1, 2)
    check_grads(q, k, v, seed, causal=True, d_o=d_o)  # atomic dQ (default)
    grads = check_grads(q, k, v, seed, causal=True, d_o=d_o,
                        deterministic=True)
    # Contiguous copies give the same bits: the same kernel, and dQ by the
    # separate pass (atomic dQ adds in no fixed order, so its bits may vary
    # from run to run).
    qc, kc, vc = leaves(q.contiguous(), k.contiguous(), v.contiguous())
    o = flashjit.attention(qc, kc, vc, causal=True, deterministic=True)
    for a, b in zip(grads, torch.autograd.grad(o, (qc, kc, vc),
                                               d_o.contiguous())):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@cuda
def test_backward_through_views_of_packed_qkv(seed):
    B, N, H, d = 1, 200, 2, 64
    qkv = randn(B, N, 3, H, d).requires_grad_()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    dq, dk, dv = check_grads(q, k, v, seed)
    o = flashjit.attention(q, k, v)
    (dqkv,) = torch.autograd.grad(o, qkv, torch.ones_like(o))
    assert dqkv.shape == qkv.shape and torch.isfinite(dqkv).all()


@cuda
def test_backward_is_deterministic(seed):
    q, k, v = leaves(randn(2, 8, 512, 128), randn(2, 2, 512, 128),
                     randn(2, 2, 512, 128))
    o = flashjit.attention(q, k, v, causal=True, deterministic=True)
    d_o = torch.randn_like(o)
    first = torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)
    second = torch.autograd.grad(o, (q, k, v), d_o)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@cuda
def test_backward_on_a_side_stream(seed):
    q, k, v = leaves(randn(2, 4, 512, 128), randn(2, 4, 512, 128),
                     randn(2, 4, 512, 128))
    o = flashjit.attention(q, k, v, causal=True)
    d_o = torch.randn_like(o)
    want = torch.autograd.grad(o, (q, k, v), d_o)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o2 = flashjit.attention(q, k, v, causal=True)
        got = torch.autograd.grad(o2, (q, k, v), d_o)
    torch.cuda.current_stream().wait_stream(s)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@cuda
def test_backward_in_a_cuda_graph(seed):
    q, k, v = leaves(randn(1, 4, 256, 64), randn(1, 4, 256, 64),
                     randn(1, 4, 256, 64))
    d_o = randn(1, 4, 256, 64)
    # Warm-up on a side stream, as torch asks before capturing autograd:
    # compiles and loads both kernels.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o = flashjit.attention(q, k, v)
        want = torch.autograd.grad(o, (q, k, v), d_o)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = flashjit.attention(q, k, v)
        got = torch.autograd.grad(o, (q, k, v), d_o)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@cuda
def test_loss_backward_fills_the_leaves_that_need_it(seed):
    q = randn(1, 2, 64, 64).requires_grad_()
    k, v = randn(1, 2, 64, 64), randn(1, 2, 64, 64)
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    assert o.requires_grad and not lse.requires_grad
    o.sum().backward()  # autograd's dO is expanded: strides 0
    assert k.grad is None and v.grad is None
    want = grads_reference(q, k, v, torch.ones_like(o), visible(64, 64))[0]
    assert rel(q.grad, want) <= GRAD_BOUND[q.dtype], seed
    with torch.no_grad():
        assert not flashjit.attention(q, k, v).requires_grad


@cuda
def test_double_backward_is_refused():
    q = randn(1, 1, 32, 32).requires_grad_()
    o = flashjit.attention(q, q.detach(), q.detach())
    # dO = 2 o depends on q, so a second derivative would need ours.
    (dq,) = torch.autograd.grad((o.float() ** 2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()


@cuda
@pytest.mark.parametrize("row,message", [((7, 1), "out of range"),
                                         ((1, 1), "listed twice")])
def test_backward_checks_the_device_layout(row, message):
    dense = torch.ones(2, 2, dtype=torch.bool)
    q, k, v = randn(1, 1, 128, 64), randn(1, 1, 128, 64), randn(1, 1, 128, 64)
    good = flashjit.BlockMask.from_dense(dense, block_size=64)
    o, lse = flashjit.attention(q, k, v, block_mask=good, return_lse=True)
    bad = flashjit.BlockMask.from_dense(dense, block_size=64)
    bad.indices[0, 0, 0, :] = row  # before its first copy to the device
    with pytest.raises(flashjit.InvalidArgumentError, match=message):
        flashjit._backward_cuda(torch, q, k, v, o, lse, torch.ones_like(o),
                                _lib.MASK_NONE, 0.0, -1, -1, bad, False)


def c_backward(q, k, v, o, lse, d_o, workspace, workspace_bytes, stream):
    """flashjit_backward (causal, deterministic) called directly on
    contiguous tensors with the workspace given (None and 0: the library's);
    returns dq, dk, dv."""
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    dtype = _lib.DTYPE_BF16 if q.dtype == torch.bfloat16 else _lib.DTYPE_FP16
    spec = _lib.make_spec(q.shape[3], v.shape[3], dtype, _lib.MASK_CAUSAL,
                          q.shape[1] // k.shape[1], 0, deterministic=True)
    ts = [_lib.make_tensor(t.data_ptr(), t.shape, t.stride())
          for t in (q, k, v, o, d_o, dq, dk, dv)]
    by = ctypes.byref
    _lib.check(_lib.lib().flashjit_backward(
        flashjit._cuda_handle(q.device), by(spec), *(by(t) for t in ts[:5]),
        ctypes.c_void_p(lse.data_ptr()), *(by(t) for t in ts[5:]), 0.0, -1, -1,
        None, workspace, workspace_bytes,
        ctypes.c_void_p(stream.cuda_stream)))
    return dq, dk, dv


@cuda
def test_library_workspace(seed):
    """Without a workspace, flashjit_backward uses the handle's buffer in
    stream order across streams, growing it (past 1 MiB) for a larger
    problem: the same bits as with torch's workspace."""
    def problem(B, H, Hkv, N):
        q, k, v = randn(B, H, N, 64), randn(B, Hkv, N, 64), randn(B, Hkv, N, 64)
        o, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
        d_o = torch.randn_like(o)
        want = flashjit._backward_cuda(torch, q, k, v, o, lse, d_o,
                                       _lib.MASK_CAUSAL, 0.0, -1, -1, None,
                                       True)
        return (q, k, v, o, lse, d_o), want

    small, big = problem(2, 4, 2, 100), problem(4, 16, 4, 5000)
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    results = []
    for (args, want), stream in ((small, main), (big, side), (small, side),
                                 (big, main)):
        with torch.cuda.stream(stream):
            results.append((c_backward(*args, None, 0, stream), want))
    torch.cuda.synchronize()
    for got, want in results:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

    workspace = torch.empty(16, dtype=torch.uint8, device="cuda")
    with pytest.raises(flashjit.InvalidArgumentError, match="workspace_bytes"):
        c_backward(*small[0], ctypes.c_void_p(workspace.data_ptr()), 16, main)


@cuda
def test_compile_ptx_for_this_gpu():
    major, minor = torch.cuda.get_device_capability()
    ptx = flashjit.compile(128, causal=True).ptx
    assert f".target sm_{major}{minor}" in ptx
    cfg = flashjit.compile(128).config(2, 8, 4096, device="cuda")
    assert cfg["block_m"] >= 16


# -- errors -------------------------------------------------------------------


def test_cpu_tensors_run_in_the_cpu_mode():
    """torch CPU tensors take the CPU execution mode (as numpy arrays do):
    the same bits as the numpy path; meta tensors get the op's fake."""
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16)
    o = flashjit.attention(q, q, q, causal=True)
    want = flashjit.attention(q.numpy(), q.numpy(), q.numpy(), causal=True)
    assert o.dtype == torch.float16 and np.array_equal(o.numpy(), want)
    with pytest.raises(ValueError, match="different devices"):
        flashjit.attention(q.to("meta"), q, q)
    assert flashjit.attention(*(q.to("meta"),) * 3).device.type == "meta"


def test_torch_and_numpy_do_not_mix():
    q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError):
        flashjit.attention(q, np.zeros((1, 2, 8, 16), np.float16), q)


@cuda
def test_wrong_dtype():
    q = randn(1, 2, 8, 16, dtype=torch.float32)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        flashjit.attention(q, q, q)
    q16 = randn(1, 2, 8, 16, dtype=torch.float16)
    with pytest.raises(TypeError, match="differ"):
        flashjit.attention(q16, q16.bfloat16(), q16)


@cuda
def test_bad_shapes_and_strides():
    q = randn(1, 4, 32, 64)
    with pytest.raises(ValueError, match="4-D"):
        flashjit.attention(q[0], q, q)
    with pytest.raises(ValueError, match="multiple"):
        flashjit.attention(q, q[:, :3], q[:, :3])
    with pytest.raises(ValueError, match="innermost"):
        t = randn(1, 4, 32, 128)[..., ::2]
        flashjit.attention(t, t, t)
    with pytest.raises(ValueError, match="head_dim_qk"):
        t = randn(1, 1, 8, 600)
        flashjit.attention(t, t, t)


@cuda
def test_readme_torch_example_runs():
    from test_cpu import readme_blocks

    blocks = [b for b in readme_blocks() if "import torch" in b]
    assert blocks
    for b in blocks:
        exec(compile(b, "README.md", "exec"), {})



# -- captured tensors in score modifiers ---------------------------------------
# (flashjit.score_ops, "Captured tensors": torch tensors indexed by the
# positions in a score_mod / mask_mod; test_captured_cpu.py has the numpy
# side and the named errors.)


def modified_scores64(q, k, v, score_mod, causal=False, scale=None):
    """(s', v): the modified, masked scores [B, H, Nq, Nkv] (-inf where
    masked) of score_mod evaluated by torch on the float64 scores and
    integer position tensors (the captured tensors indexed by torch's own
    advanced indexing), and v repeated over each GQA group; differentiable
    in q, k, v and in float64 captured tensors that require grad."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    B, H, Nq, Nkv = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    sc = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * sc
    ar = [torch.arange(n, device=q.device) for n in (B, H, Nq, Nkv)]
    b = ar[0][:, None, None, None]
    h = ar[1][None, :, None, None]
    i = ar[2][None, None, :, None]
    j = ar[3][None, None, None, :]
    s = torch.as_tensor(score_mod(s, b, h, i, j), dtype=torch.float64)
    s = s.expand(B, H, Nq, Nkv)
    vis = visible(Nq, Nkv, causal, device=q.device)
    return s.masked_fill(~vis, float("-inf")), v


def modified64(q, k, v, score_mod, causal=False, scale=None):
    """o in float64 of attention with score_mod (modified_scores64):
    differentiable in q, k, v (and float64 captured tensors). Rows that
    see no key: o = 0."""
    s, v = modified_scores64(q, k, v, score_mod, causal, scale)
    empty = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1)
    return torch.where(empty, torch.zeros((), dtype=s.dtype,
                                          device=s.device), p @ v)


def check_captured(q, k, v, score_mod, wrong, causal=False, scale=None,
                   seed=None):
    """flashjit.attention(score_mod=...) on CUDA against modified64; each
    modifier in wrong (the same on other data) must miss by 10x the
    bound; gradients of q, k, v through autograd against float64
    autograd. torch.Tensor.__getitem__ is the same before and after."""
    getitem = torch.Tensor.__getitem__
    q, k, v = leaves(q, k, v)
    o = flashjit.attention(q, k, v, causal=causal, scale=scale,
                           score_mod=score_mod)
    assert torch.Tensor.__getitem__ is getitem
    q64, k64, v64 = leaves(q.double(), k.double(), v.double())
    ro = modified64(q64, k64, v64, score_mod, causal, scale)
    bound = BOUND[q.dtype]
    assert rel(o, ro.detach()) <= bound, (rel(o, ro.detach()), seed)
    for other in wrong:
        wo = modified64(q.detach().double(), k.detach().double(),
                        v.detach().double(), other, causal, scale)
        assert rel(o, wo) > 10 * bound
    d_o = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), d_o)
    ro.backward(d_o.double())
    for name, g, t in zip(("dq", "dk", "dv"), got, (q64, k64, v64)):
        err = rel(g, t.grad)
        assert err <= GRAD_BOUND[q.dtype], (name, err, seed)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_captured_bias_tensor(dtype, seed):
    """lambda s, b, h, i, j: s + bias[b, h, i, j] with a torch CUDA bias,
    causal, GQA, Nq != Nkv; no plan is made for it (the C API's plans take
    no captured tensors)."""
    from flashjit import _torch_impl

    B, H, Hkv, Nq, Nkv = 2, 4, 2, 70, 130
    q, k, v = (randn(B, H, Nq, 64, dtype=dtype),
               randn(B, Hkv, Nkv, 64, dtype=dtype),
               randn(B, Hkv, Nkv, 64, dtype=dtype))
    bias = torch.randn(B, H, Nq, Nkv, device="cuda") * 2
    other = torch.randn(B, H, Nq, Nkv, device="cuda") * 2
    plans = len(_torch_impl._fwd_plans)
    check_captured(q, k, v, lambda s, b, h, i, j: s + bias[b, h, i, j],
                   [lambda s, b, h, i, j: s + other[b, h, i, j],
                    lambda s, b, h, i, j: s],
                   causal=True, seed=seed)
    assert len(_torch_impl._fwd_plans) == plans
    # Eager, no grad: the kernel directly, the same numbers.
    with torch.no_grad():
        o1 = flashjit.attention(q, k, v, causal=True, score_mod=lambda
                                s, b, h, i, j: s + bias[b, h, i, j])
    o2 = flashjit.attention(*leaves(q, k, v), causal=True,  # the op
                            score_mod=lambda s, b, h, i, j:
                            s + bias[b, h, i, j])
    assert torch.equal(o1, o2.detach())


@cuda
def test_captured_slopes_flex_style(seed):
    """FlexAttention's ALiBi with a slope tensor: s + slopes[h] * (j - i)
    (GQA 4, Nq != Nkv); and a document mask from segment ids (an int
    tensor, read as float32) as a mask_mod."""
    B, H, Hkv, Nq, Nkv = 1, 8, 2, 96, 160
    q, k, v = (randn(B, H, Nq, 64), randn(B, Hkv, Nkv, 64),
               randn(B, Hkv, Nkv, 64))
    slopes = torch.exp2(-torch.arange(1, H + 1, device="cuda") * 8.0 / H)
    flipped = slopes.flip(0)
    check_captured(q, k, v, lambda s, b, h, i, j: s + slopes[h] * (j - i),
                   [lambda s, b, h, i, j: s + flipped[h] * (j - i)],
                   seed=seed)
    seg = torch.repeat_interleave(
        torch.arange(3, device="cuda"),
        torch.tensor([50, 60, 50], device="cuda"))

    def doc(b, h, i, j):
        return seg[i + (Nkv - Nq)] == seg[j]

    o = flashjit.attention(q, k, v, causal=True, mask_mod=doc)
    ro = modified64(q.double(), k.double(), v.double(),
                    lambda s, b, h, i, j: torch.where(
                        doc(b, h, i, j), s, float("-inf")), causal=True)
    assert rel(o, ro) <= BOUND[q.dtype]
    plain = modified64(q.double(), k.double(), v.double(),
                       lambda s, b, h, i, j: s, causal=True)
    assert rel(o, plain) > 10 * BOUND[q.dtype]


def capture_grads64(q, k, v, o, d_o, make_mod, captures, causal=False,
                    scale=None):
    """(consistent, exact, check): float64 gradients of loss = sum(d_o *
    o) with respect to the captured tensors of the modifier
    make_mod(*tensors), each a list in the order of captures.

    exact: float64 torch autograd through modified64 (D = rowsum(d_o * o)
    of the exact o). consistent: sum(G * d s' / d c) by float64 autograd of
    the same modifier's scores, G = P (dP - D) with D from the o given
    (the kernel's, rounded to its dtype, as the kernel's backward has it:
    a slope's or a temperature's gradient sums G * (j - i) or G * s over
    whole rows, where the terms cancel, so D's rounding, harmless for dq,
    moves it by percents in bf16). check: the same with the exact o,
    which must equal exact (the formula's own check)."""
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    caps = [c.detach().double().requires_grad_() for c in captures]
    d64 = d_o.detach().double()
    ro = modified64(q64, k64, v64, make_mod(*caps), causal, scale)
    exact = torch.autograd.grad(ro, caps, d64)

    def by_formula(o_user):
        s, vr = modified_scores64(q64, k64, v64, make_mod(*caps), causal,
                                  scale)
        finite = torch.isfinite(s)
        empty = ~finite.any(-1, keepdim=True)
        p = torch.softmax(s.detach().masked_fill(empty, 0.0), dim=-1)
        p = p.masked_fill(empty, 0.0)
        dp = d64 @ vr.transpose(-1, -2)
        G = p * (dp - (d64 * o_user).sum(-1, keepdim=True))
        surrogate = (G * torch.where(finite, s, torch.zeros_like(s))).sum()
        return torch.autograd.grad(surrogate, caps)

    return (by_formula(o.detach().double()), exact,
            by_formula(ro.detach()))


def check_capture_grads(q, k, v, make_mod, captures, others, causal=False,
                        scale=None, seed=None):
    """Autograd through flashjit.attention(score_mod=make_mod(*captures))
    on CUDA to q, k, v and to the captured tensors (which require grad):
    each captured tensor's gradient has its shape and dtype and is within
    the bound of the float64 reference (capture_grads64, D from the
    kernel's o), and further than 10x the bound from the reference at
    other data (others: one list of tensors per alternative); dq, dk, dv
    against float64 autograd."""
    q, k, v = leaves(q, k, v)
    o = flashjit.attention(q, k, v, causal=causal, scale=scale,
                           score_mod=make_mod(*captures))
    d_o = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v, *captures), d_o)
    bound = BOUND[q.dtype]
    consistent, exact, check = capture_grads64(q, k, v, o, d_o, make_mod,
                                               captures, causal, scale)
    for n, (g, c, want, e, ch) in enumerate(zip(got[3:], captures,
                                                consistent, exact, check)):
        assert g.shape == c.shape and g.dtype == c.dtype, (n, g.shape,
                                                           g.dtype)
        assert rel(ch, e) <= 1e-9, (n, rel(ch, e))  # the formula itself
        err = rel(g, want)
        assert err <= bound, (n, err, seed)
    for other in others:
        wrong, _, _ = capture_grads64(q, k, v, o, d_o, make_mod, other,
                                      causal, scale)
        assert any(rel(g, w) > 10 * bound for g, w in zip(got[3:], wrong))
    q64, k64, v64 = leaves(q.double(), k.double(), v.double())
    ro = modified64(q64, k64, v64, make_mod(*(c.detach() for c in captures)),
                    causal, scale)
    ro.backward(d_o.double())
    for name, g, t in zip(("dq", "dk", "dv"), got[:3], (q64, k64, v64)):
        err = rel(g, t.grad)
        assert err <= GRAD_BOUND[q.dtype], (name, err, seed)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_captured_bias_gradient(dtype, seed):
    """A learned bias: s + bias[h, i, j] with bias = torch.randn(H, Nq,
    Nkv, requires_grad=True) (float32), causal, GQA, Nq != Nkv: autograd
    gives its gradient (zero where causal masks); the negated bias's
    reference gradient fails it."""
    B, H, Hkv, Nq, Nkv = 2, 4, 2, 70, 130
    q, k, v = (randn(B, H, Nq, 64, dtype=dtype),
               randn(B, Hkv, Nkv, 64, dtype=dtype),
               randn(B, Hkv, Nkv, 64, dtype=dtype))
    bias = (torch.randn(H, Nq, Nkv, device="cuda") * 2).requires_grad_()

    def make(t):
        return lambda s, b, h, i, j: s + t[h, i, j]

    check_capture_grads(q, k, v, make, [bias], [[-bias.detach()]],
                        causal=True, seed=seed)
    o = flashjit.attention(*leaves(q, k, v), causal=True,
                           score_mod=make(bias))
    (g,) = torch.autograd.grad(o, bias, torch.randn_like(o))
    vis = visible(Nq, Nkv, causal=True)[0, 0]
    assert not g[:, ~vis].any()


@cuda
def test_captured_slopes_and_temperature_gradients(seed):
    """FlexAttention's learned ALiBi: s * temp[0] + slopes[h] * (j - i)
    with slopes (H,) in bf16 and a float32 temperature (a one-element
    tensor indexed by a constant: a view, captured) that require grad,
    GQA 4, Nq != Nkv: their gradients in their own dtypes; the reference
    at negated slopes and another temperature fails them."""
    B, H, Hkv, Nq, Nkv = 1, 8, 2, 96, 160
    q, k, v = (randn(B, H, Nq, 64), randn(B, Hkv, Nkv, 64),
               randn(B, Hkv, Nkv, 64))
    slopes = torch.exp2(-torch.arange(1, H + 1, device="cuda") * 8.0 / H)
    slopes = slopes.to(torch.bfloat16).requires_grad_()
    temp = torch.tensor([1.5], device="cuda", requires_grad=True)

    def make(sl, t):
        return lambda s, b, h, i, j: s * t[0] + sl[h] * (j - i)

    check_capture_grads(q, k, v, make, [slopes, temp],
                        [[-slopes.detach(), temp.detach()],
                         [slopes.detach(), temp.detach() * 0.5]], seed=seed)


@cuda
def test_captured_gradients_with_a_document_mask_and_broadcast(seed):
    """A bias (1, H, 1, Nkv) (size-1 dimensions broadcast) in score_mod and
    a document mask on int segment ids in mask_mod: the bias's gradient
    (summed over batch and queries by the kernel, shaped as the bias)
    against float64 autograd; the ids need none (integers)."""
    B, H, Nq, Nkv = 2, 4, 64, 64
    q, k, v = leaves(randn(B, H, Nq, 64), randn(B, H, Nkv, 64),
                     randn(B, H, Nkv, 64))
    bias = torch.randn(1, H, 1, Nkv, device="cuda", requires_grad=True)
    seg = torch.repeat_interleave(torch.arange(3, device="cuda"),
                                  torch.tensor([20, 30, 14], device="cuda"))

    # The reference reads the size-1 dimensions at 0 (torch's indexing does
    # not broadcast them; the kernel does).
    def make(t):
        return lambda s, b, h, i, j: torch.where(
            seg[i] == seg[j], s + t[0, h, 0, j], float("-inf"))

    o = flashjit.attention(q, k, v, causal=True,
                           score_mod=lambda s, b, h, i, j: s + bias[b, h, i, j],
                           mask_mod=lambda b, h, i, j: seg[i] == seg[j])
    d_o = torch.randn_like(o)
    (g,) = torch.autograd.grad(o, bias, d_o)
    assert g.shape == bias.shape
    want, _, _ = capture_grads64(q, k, v, o, d_o, make, [bias], causal=True)
    assert rel(g, want[0]) <= BOUND[q.dtype], (rel(g, want[0]), seed)
    plain, _, _ = capture_grads64(
        q, k, v, o, d_o, lambda t: (lambda s, b, h, i, j: s + t[0, h, 0, j]),
        [bias], causal=True)
    assert rel(g, plain[0]) > 10 * BOUND[q.dtype]


@cuda
def test_captured_gradient_deterministic(seed):
    """deterministic=True with a captured tensor that requires grad: the
    bias's gradient is summed in fixed point, the same bits on every call
    (the atomic sum's bits may differ), and close to the atomic one; q, k, v
    deterministic as before."""
    q, k, v = leaves(randn(1, 2, 64, 32), randn(1, 2, 64, 32),
                     randn(1, 2, 64, 32))
    bias = torch.zeros(2, 64, 64, device="cuda", requires_grad=True)
    slopes = torch.full((2,), 0.05, device="cuda", requires_grad=True)
    runs = []
    for deterministic in (True, True, False):
        o = flashjit.attention(
            q, k, v, deterministic=deterministic,
            score_mod=lambda s, b, h, i, j: (s + bias[h, i, j]
                                             + slopes[h] * (j - i)))
        runs.append(torch.autograd.grad(o.float().sum(),
                                        (q, k, v, bias, slopes)))
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    for fixed, atomic in zip(runs[0][3:], runs[2][3:]):
        assert torch.isfinite(fixed).all()
        assert rel(fixed, atomic) < 1e-5
