"""flashjit's per-shape plan cache on torch CUDA tensors: every forward runs
through a cached C plan (flashjit_plan_create / flashjit_plan_forward); one
plan per key serves new data, the eager call and the op share it, a
misaligned view gets its own, bad pointers are named errors, a plan made
during a CUDA graph capture is not kept, a plan runs in its own device's
context. Skips without torch or a GPU (test_plan_cpu.py covers the C plan
on the CPU)."""

import pytest

import flashjit
from flashjit import _lib

torch = pytest.importorskip("torch", reason="torch is not installed")

from test_torch_gpu import check, cuda, randn  # noqa: E402



def _plans():
    from flashjit import _torch_impl

    return _torch_impl._fwd_plans


@cuda
def test_plan_is_made_once_per_shape_and_serves_new_data():
    q, k, v = randn(1, 2, 96, 64), randn(1, 2, 96, 64), randn(1, 2, 96, 64)
    check(q, k, v, causal=True)
    n = len(_plans())
    for _ in range(3):  # new data, same key: no new plan, right numbers
        q, k, v = randn(1, 2, 96, 64), randn(1, 2, 96, 64), randn(1, 2, 96, 64)
        check(q, k, v, causal=True)
    assert len(_plans()) == n
    check(q, k, v)  # another mask: another plan
    assert len(_plans()) == n + 1


@cuda
def test_calls_without_lse_share_a_scratch_and_calls_with_it_get_their_own():
    q, k, v = randn(1, 2, 64, 32), randn(1, 2, 64, 32), randn(1, 2, 64, 32)
    check(q, k, v)  # makes the plan
    o_ref, lse_ref = flashjit.attention(q, k, v, return_lse=True)
    for _ in range(2):  # without lse: the plan's scratch, same O bits
        o = flashjit.attention(q, k, v)
        torch.testing.assert_close(o, o_ref, rtol=0, atol=0)
    (plan,) = [p for key, p in _plans().items()
               if key[0] == q.shape and key[6] == q.dtype and key[12] == 0
               and key[13] == 0.0]
    assert plan.lse_scratch is not None
    o1, lse1 = flashjit.attention(q, k, v, return_lse=True)
    o2, lse2 = flashjit.attention(q, k, v, return_lse=True)
    assert lse1.data_ptr() != lse2.data_ptr()
    assert plan.lse_scratch.data_ptr() not in (lse1.data_ptr(),
                                               lse2.data_ptr())
    torch.testing.assert_close(lse1, lse_ref, rtol=0, atol=0)
    torch.testing.assert_close(lse2, lse_ref, rtol=0, atol=0)


@cuda
@pytest.mark.parametrize("layout", ["contiguous", "dv_differs",
                                    "transposed_view", "head_slice"])
def test_a_planned_call_allocates_o_as_the_plan_lays_it_out(layout):
    """A call on a cached plan allocates o (torch.empty_like(q) where the
    plan's o is laid out as a contiguous q, else torch.empty of o's shape):
    o is contiguous and right, written over memory poisoned with NaN (the
    previous call's o, freed, is the block the allocator gives back)."""
    B, H, N, D = 2, 3, 80, 64
    dv = 32 if layout == "dv_differs" else D
    if layout == "transposed_view":  # (B, N, H, D) seen as (B, H, N, D)
        q = randn(B, N, H, D).transpose(1, 2)
    elif layout == "head_slice":  # contiguous, a size-1 dim of odd stride
        q = randn(B, 2 * H + 1, N, D)[:1, 1:2]
    else:
        q = randn(B, H, N, D)
    k, v = randn(*q.shape[:3], D), randn(*q.shape[:3], dv)
    check(q, k, v)  # makes the plan
    (plan,) = [p for key, p in _plans().items()
               if key[0] == q.shape and key[1] == q.stride()
               and key[4] == v.shape and key[12] == 0]
    assert plan.o_like_q == (layout in ("contiguous", "head_slice"))
    for _ in range(2):
        o = flashjit.attention(q, k, v)
        o.fill_(float("nan"))
        del o
        o, _ = check(q, k, v)  # asserts no NaN and the float64 bound
        assert o.is_contiguous() and o.shape == q.shape[:3] + (dv,)


@cuda
def test_eager_call_and_op_share_the_plan():
    import flashjit.ops  # noqa: F401

    q, k, v = randn(2, 4, 80, 64), randn(2, 2, 80, 64), randn(2, 2, 80, 64)
    o = flashjit.attention(q, k, v, causal=True)
    n = len(_plans())
    o2, _ = torch.ops.flashjit.attention_fwd(q, k, v, 1, 0.0, -1, -1, None,
                                             None, 0, False)
    assert len(_plans()) == n
    torch.testing.assert_close(o, o2, rtol=0, atol=0)


@cuda
def test_a_misaligned_view_gets_its_own_plan():
    """Pointers 2 bytes off 16 allow 2-byte copies only: their own plan
    (the alignment class is part of the key), with the right numbers."""
    shape = (1, 2, 64, 64)
    n = 64 * 64 * 2
    buf = randn(3 * n + 8)
    q, k, v = (buf[1 + i * n:1 + (i + 1) * n].view(shape) for i in range(3))
    assert q.data_ptr() % 16 == 2
    aligned = tuple(t.clone() for t in (q, k, v))
    o_aligned = flashjit.attention(*aligned)
    count = len(_plans())
    o, _ = check(q, k, v)
    assert len(_plans()) == count + 1
    torch.testing.assert_close(o, o_aligned, rtol=0, atol=0)


@cuda
def test_plan_forward_names_bad_pointers():
    q, k, v = randn(1, 1, 32, 64), randn(1, 1, 32, 64), randn(1, 1, 32, 64)
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    p = next(p for p in _plans().values() if p.o_shape == (1, 1, 32, 64))
    fn = _lib.lib().flashjit_plan_forward
    stream = torch.cuda.current_stream().cuda_stream
    status = fn(p.ptr, None, k.data_ptr(), v.data_ptr(), o.data_ptr(),
                lse.data_ptr(), None, None, stream)
    with pytest.raises(flashjit.InvalidArgumentError, match="q is NULL"):
        _lib.check(status)
    status = fn(p.ptr, q.data_ptr() + 2, k.data_ptr(), v.data_ptr(),
                o.data_ptr(), lse.data_ptr(), None, None, stream)
    with pytest.raises(flashjit.InvalidArgumentError, match="aligned"):
        _lib.check(status)


@cuda
def test_a_plan_made_during_capture_is_not_kept(monkeypatch):
    """A first call of a shape inside a CUDA graph capture makes a plan
    (heuristic tiling: no tuning while capturing) that the cache does not
    keep; the graph replays it correctly."""
    monkeypatch.setenv("FLASHJIT_AUTOTUNE", "0")  # one kernel for both sizes
    q, k, v = randn(1, 2, 200, 64), randn(1, 2, 200, 64), randn(1, 2, 200, 64)
    flashjit.attention(q[:, :, :100], k[:, :, :100], v[:, :, :100])  # kernel
    torch.cuda.synchronize()
    n = len(_plans())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = flashjit.attention(q, k, v)
    assert len(_plans()) == n
    g.replay()
    torch.cuda.synchronize()
    ref = flashjit.attention(q, k, v)  # outside: the plan that is kept
    assert len(_plans()) == n + 1
    torch.testing.assert_close(o, ref, rtol=0, atol=0)


@cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_plan_runs_in_its_device_context_whatever_is_current():
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda:1",
                           dtype=torch.bfloat16) for _ in range(3))
    with torch.cuda.device(1):
        ref = flashjit.attention(q, k, v)
    with torch.cuda.device(0):  # another current device: the plan's context
        o = flashjit.attention(q, k, v)
    torch.testing.assert_close(o, ref, rtol=0, atol=0)


@cuda
def test_a_captured_call_is_planned_once_and_reads_each_calls_tensors():
    """A mask_mod that reads segment ids (a document mask) runs through one
    plan (flashjit_plan_create_captured) for its key and the ids' size;
    each call's ids are the ones the kernel reads: new ids, and ids changed
    in place."""
    from torch_gpu_helpers import BOUND, forward_reference, rel

    n = 200
    q, k, v = randn(1, 2, n, 64), randn(1, 2, n, 64), randn(1, 2, n, 64)
    pos = torch.arange(n, device="cuda")
    seg = (pos >= 40).to(torch.int32)

    def document(b, h, i, j):
        return seg[i] == seg[j]

    def reference(ids):
        vis = (ids[:, None] == ids[None, :])[None, None]
        return forward_reference(q, k, v, vis)[0]

    before = len(_plans())
    for step, cut in enumerate((40, 130, 77)):
        ids = (pos >= cut).to(torch.int32)
        if step == 2:
            seg.copy_(ids)  # the same tensor, new data
        else:
            seg = ids
        o = flashjit.attention(q, k, v, mask_mod=document)
        assert len(_plans()) == before + 1
        assert rel(o, reference(ids)) <= BOUND[q.dtype]
        other = (pos >= (cut + 50) % n).to(torch.int32)
        assert rel(o, reference(other)) > 10 * BOUND[q.dtype]
