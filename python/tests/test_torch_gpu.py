"""flashjit on torch CUDA tensors, against torch's math SDPA in float64.

Skips without torch; the CUDA tests skip without a GPU. The input-checking
tests need torch only (CPU tensors are rejected before any CUDA call).
"""

import numpy as np
import pytest

import flashjit
import reference

torch = pytest.importorskip("torch")
F = torch.nn.functional

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}


def visible(nq, nkv, causal=False, window=None, dense=None, block=None,
            device="cuda"):
    """[B|1, H|1, Nq, Nkv] boolean mask (bottom-right aligned), on device."""
    if dense is not None:
        dense = torch.as_tensor(dense).bool().cpu().numpy()
    return torch.as_tensor(reference.visible_mask(nq, nkv, causal, window,
                                                  dense, block), device=device)


def reference(q, k, v, vis, scale=None):
    """(o, lse) in float64 with torch's math SDPA; rows without a visible
    key: o = 0, lse = -inf."""
    q, k, v = q.double(), k.double(), v.double()
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
    o = torch.where(empty, torch.zeros_like(o), o)
    sc = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * sc
    lse = torch.logsumexp(s.masked_fill(~vis, float("-inf")), dim=-1)
    return o, lse


def rel(x, ref):
    x = x.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


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
    ro, rl = reference(q, k, v, vis, scale)
    assert not torch.isnan(o).any()
    assert rel(o, ro) <= BOUND[q.dtype], rel(o, ro)
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rl))
    if fin.any():
        assert rel(lse[fin], rl[fin]) <= BOUND[q.dtype]
    return o, lse


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


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


@cuda
def test_autograd_forward_and_backward_not_implemented():
    q = randn(1, 2, 64, 64).requires_grad_()
    k, v = randn(1, 2, 64, 64), randn(1, 2, 64, 64)
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    assert o.requires_grad and not lse.requires_grad
    with pytest.raises(NotImplementedError, match="backward"):
        o.sum().backward()
    with torch.no_grad():
        assert not flashjit.attention(q, k, v).requires_grad


@cuda
def test_compile_ptx_for_this_gpu():
    major, minor = torch.cuda.get_device_capability()
    ptx = flashjit.compile(128, causal=True).ptx
    assert f".target sm_{major}{minor}" in ptx
    cfg = flashjit.compile(128).config(2, 8, 4096, device="cuda")
    assert cfg["block_m"] >= 16


# -- errors -------------------------------------------------------------------


def test_cpu_tensors_are_rejected():
    q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        flashjit.attention(q, q, q)


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
