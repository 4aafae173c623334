"""flashjit on torch CUDA tensors, against torch's math SDPA in float64:
the forward (o, lse) and autograd's backward (dq, dk, dv).

Skips without torch; the CUDA tests skip without a GPU. The input-checking
tests need torch only (CPU tensors run in the CPU execution mode).
Inputs are fresh random numbers each run; a failure prints its seed.
Captured tensors in score modifiers: test_torch_captured_gpu.py; the shared
helpers (references, checks, bounds, the seed fixture):
torch_gpu_helpers.py.
"""

import ctypes

import numpy as np
import pytest

import flashjit
from flashjit import _lib

torch = pytest.importorskip(
    "torch", reason="torch is not installed (test_cpu.py covers the CPU path)")

# seed: the fixture, by name for pytest. check, cuda and randn are imported
# from here by test_torch_plans_gpu.py.
from torch_gpu_helpers import (  # noqa: E402,F401,F811
    GRAD_BOUND, check, check_grads, cuda, grads_reference, leaves, randn, rel,
    seed, visible)


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
def test_block_sparse_backward_in_a_cuda_graph(seed):
    """A BlockMask's backward gives the C API the layout's KV-major
    transpose on the device (flashjit_backward_kv_major), so it reads
    nothing on the host and can be captured: replayed on new inputs, the
    same bits as eager calls on them, which match the float64 reference."""
    blk, N = 64, 320
    dense = torch.rand(2, -(-N // blk), -(-N // blk)) < 0.5
    dense[:, 1] = False  # a query block that sees nothing
    bm = flashjit.BlockMask.from_dense(dense[None], block_size=blk)
    q, k, v = leaves(randn(1, 2, N, 64), randn(1, 2, N, 64),
                     randn(1, 2, N, 64))
    d_o = randn(1, 2, N, 64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o = flashjit.attention(q, k, v, block_mask=bm, causal=True)
        torch.autograd.grad(o, (q, k, v), d_o)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = flashjit.attention(q, k, v, block_mask=bm, causal=True)
        got = torch.autograd.grad(o, (q, k, v), d_o)
    for t in (q, k, v, d_o):  # new inputs, in place
        with torch.no_grad():
            t.copy_(randn(*t.shape))
    g.replay()
    torch.cuda.synchronize()
    want = torch.autograd.grad(
        flashjit.attention(q, k, v, block_mask=bm, causal=True), (q, k, v),
        d_o)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    check_grads(q, k, v, seed, causal=True, block_mask=bm, dense=dense[None])


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
