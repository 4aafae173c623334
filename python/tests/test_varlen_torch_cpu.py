"""Variable-length packing through the torch ops on CPU tensors
(flashjit::attention_varlen_fwd / _bwd): forward and autograd against the
per-sequence float64 reference, strided views, captured tensors' gradients,
torch.library.opcheck, fake shapes, torch.compile(fullgraph=True) and the
named errors (see test_varlen_cpu.py for the numpy path). Skipped without
torch."""

import numpy as np
import pytest

import flashjit
import reference
from reference import cu_seqlens, lse_err, rel_err
from varlen_cases import (BOUND, CASES, GRAD_BOUND, as64, check_forward,
                          fresh_rng, kernel_view, needs_torch, packed, torch,
                          torch_packed)


@pytest.fixture
def rng():
    return fresh_rng()

@needs_torch
@pytest.mark.parametrize("case", ["causal-mixed", "full-gqa4", "window-mqa",
                                  "no-queries"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_forward_and_autograd(case, dtype, rng):
    dtype = getattr(torch, dtype)
    bound = BOUND[np.float16 if dtype == torch.float16 else np.float32]
    gbound = GRAD_BOUND[np.float16 if dtype == torch.float16 else np.float32]
    lq, lk, H, Hkv, d, dv, opts = CASES[case]
    q, k, v, cq, ck = torch_packed(rng, lq, lk, H, Hkv, d, dv, dtype, True)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, return_lse=True,
                                       **opts)
    assert o.dtype == dtype and o.shape == (q.shape[0], H, dv)
    assert o.requires_grad and not lse.requires_grad
    assert lse.dtype == torch.float32 and lse.shape == (len(lq), H, max(lq))
    check_forward(as64(o), lse.numpy(), as64(q), as64(k), as64(v),
                  cq.numpy(), ck.numpy(), bound, **opts)
    d_o = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), d_o)
    want = reference.varlen_grads_ref(*(as64(t) for t in (q, k, v, o, d_o)),
                                      cq.numpy(), ck.numpy(), **opts)
    floor = 1e-3 * max(np.linalg.norm(w) for w in want)
    for name, g, w, like in zip(("dq", "dk", "dv"), got, want, (q, k, v)):
        assert g.dtype == dtype and g.shape == like.shape, name
        err = np.linalg.norm(as64(g) - w) / max(np.linalg.norm(w), floor)
        assert err <= gbound, (name, err)
    # No gradient asked for: the eager path without the dispatcher gives
    # the op's bits.
    with torch.no_grad():
        o2, lse2 = flashjit.attention_varlen(q, k, v, cq, ck,
                                             return_lse=True, **opts)
    assert torch.equal(o2, o.detach()) and torch.equal(lse2, lse)


@needs_torch
def test_torch_strided_views_and_deterministic(rng):
    """q, k, v as views of one packed qkv projection (token stride != H *
    d); deterministic=True: the same gradients bit for bit twice."""
    lq = [37, 64, 3]
    cq = torch.from_numpy(cu_seqlens(lq))
    T, H, Hkv, d = int(cq[-1]), 4, 2, 32
    qkv = torch.randn(T, (H + 2 * Hkv) * d, dtype=torch.bfloat16)
    qkv.requires_grad_()
    q, k, v = qkv.split([H * d, Hkv * d, Hkv * d], dim=-1)
    q, k, v = (t.view(T, -1, d) for t in (q, k, v))
    assert q.stride(0) == (H + 2 * Hkv) * d
    o = flashjit.attention_varlen(q, k, v, cq, cq, causal=True,
                                  deterministic=True)
    d_o = torch.randn_like(o)
    (g1,) = torch.autograd.grad(o, qkv, d_o)
    o = flashjit.attention_varlen(q, k, v, cq, cq, causal=True,
                                  deterministic=True)
    (g2,) = torch.autograd.grad(o, qkv, d_o)
    assert torch.equal(g1, g2)
    want = reference.varlen_grads_ref(*(as64(t) for t in (q, k, v, o, d_o)),
                                      cq.numpy(), cq.numpy(), causal=True)
    gq, gk, gv = (as64(t).reshape(T, -1, d) for t in g1.split(
        [H * d, Hkv * d, Hkv * d], dim=-1))
    for g, w in zip((gq, gk, gv), want):
        assert rel_err(g, w) <= GRAD_BOUND[np.float32]


@needs_torch
def test_torch_captured_bias_gradient(rng):
    """A torch bias[h, i, j] that requires grad, read by a score_mod in
    every sequence: autograd reaches it (the per-sequence sum)."""
    lq, lk = [12, 30, 7], [20, 30, 16]
    H = 2
    q, k, v, cq, ck = torch_packed(rng, lq, lk, H, 1, 16, 16, torch.float16,
                                   True)
    bias = torch.randn(H, max(lq), max(lk), requires_grad=True)
    o = flashjit.attention_varlen(
        q, k, v, cq, ck, causal=True,
        score_mod=lambda s, b, h, i, j: s + bias[h, i, j])
    d_o = torch.randn_like(o)
    gq, gb = torch.autograd.grad(o, (q, bias), d_o)
    bias_n = bias.detach().double().numpy()

    def fn_ref(s, b, h, i, j):
        return s + bias_n[h, i, j]

    G = reference.varlen_score_grads_ref(
        *(as64(t) for t in (q, k, v, o, d_o)), cq.numpy(), ck.numpy(),
        causal=True, score_mod=fn_ref)
    want = np.zeros(bias.shape)
    for g in G:
        want[:, :g.shape[1], :g.shape[2]] += g
    assert gb.dtype == torch.float32
    assert rel_err(gb.numpy(), want) <= 5e-3
    assert rel_err(gb.numpy(), -want) > 1
    wq = reference.varlen_grads_ref(*(as64(t) for t in (q, k, v, o, d_o)),
                                    cq.numpy(), ck.numpy(), causal=True,
                                    score_mod=fn_ref)[0]
    assert rel_err(as64(gq), wq) <= GRAD_BOUND[np.float16]


@needs_torch
def test_eager_autograd_equals_the_op(rng):
    """With autograd, eager attention_varlen takes _eager's Function (its
    node _VarlenBackward), not the op's dispatch: o, lse and the gradients
    of q, k, v and of a captured bias (deterministic) are the op's bits."""
    lq, lk = [12, 30, 7], [20, 30, 16]
    H = 2
    q, k, v, cq, ck = torch_packed(rng, lq, lk, H, 1, 16, 16, torch.float16,
                                   True)
    bias = torch.randn(H, max(lq), max(lk), requires_grad=True)

    def fn(s, b, h, i, j):
        return s + bias[h, i, j]

    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                       score_mod=fn, deterministic=True,
                                       return_lse=True)
    assert type(o.grad_fn).__name__ == "_VarlenBackward"
    text, caps = flashjit.score_ops.trace_with_captures(fn)
    o2, lse2 = torch.ops.flashjit.attention_varlen_fwd(
        q, k, v, cq, ck, max(lq), max(lk), 1, 0.0, -1, -1, None, None, 0,
        True, text, [bias])
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    d_o = torch.randn_like(o)
    leaves = (q, k, v, bias)
    for a, b in zip(torch.autograd.grad(o, leaves, d_o),
                    torch.autograd.grad(o2, leaves, d_o)):
        assert torch.equal(a, b)


@needs_torch
def test_opcheck(rng):
    from torch.library import opcheck

    q, k, v, cq, ck = torch_packed(rng, [9, 30, 5], [20, 30, 0], 4, 2, 32,
                                   48, torch.bfloat16, True)
    fwd = (q, k, v, cq, ck, 30, 30, 1, 0.0, -1, -1, None, None, 0, False, "",
           [])
    opcheck(torch.ops.flashjit.attention_varlen_fwd.default, fwd)
    bias = torch.randn(4, 30, 30)
    text, _ = flashjit.score_ops.trace_with_captures(
        lambda s, b, h, i, j: s + bias[h, i, j])
    opcheck(torch.ops.flashjit.attention_varlen_fwd.default,
            fwd[:15] + (text, [bias]))
    # With a block mask over the sequences (blocks of 16).
    bm = flashjit.BlockMask.from_dense(
        np.random.default_rng().random((3, 1, 2, 2)) < 0.7, 16)
    counts, indices = bm._device_tensors(q.device)
    opcheck(torch.ops.flashjit.attention_varlen_fwd.default,
            fwd[:11] + (counts, indices, 16) + fwd[14:])
    with torch.no_grad():
        o, lse = torch.ops.flashjit.attention_varlen_fwd(*fwd)
    d_o = torch.randn_like(o)
    bwd = (d_o, q.detach(), k.detach(), v.detach(), o, lse, cq, ck, 30, 30, 1,
           0.0, -1, -1, None, None, 0, True, "", [], [])
    opcheck(torch.ops.flashjit.attention_varlen_bwd.default, bwd)
    opcheck(torch.ops.flashjit.attention_varlen_bwd.default,
            bwd[:17] + (False, text, [bias], [True]))


@needs_torch
def test_fake_shapes():
    q = torch.empty(100, 8, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(300, 2, 64, dtype=torch.bfloat16, device="meta")
    v = torch.empty(300, 2, 48, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    o, lse = torch.ops.flashjit.attention_varlen_fwd(
        q, k, v, cu, cu, 77, 200, 1, 0.0, -1, -1, None, None, 0, False, "",
        [])
    assert o.shape == (100, 8, 48) and o.device.type == "meta"
    assert lse.shape == (3, 8, 77) and lse.dtype == torch.float32
    with pytest.raises(TypeError, match="cu_seqlens_k must be int32"):
        torch.ops.flashjit.attention_varlen_fwd(
            q, k, v, cu, cu.long(), 77, 200, 1, 0.0, -1, -1, None, None, 0,
            False, "", [])


@needs_torch
def test_compile_fullgraph_matches_eager(rng):
    """torch.compile(fullgraph=True) of a function calling
    attention_varlen with max_seqlen_* given: no graph break, forward and
    gradients equal to eager's; without them under compile: a named
    error."""
    torch._dynamo.reset()
    q, k, v, cq, ck = torch_packed(rng, [9, 40, 5], [20, 40, 7], 4, 2, 32,
                                   32, torch.bfloat16)

    def f(q, k, v, cq, ck):
        o = flashjit.attention_varlen(q * 1.5, k, v, cq, ck, 40, 40,
                                      causal=True)
        return o.float().square().sum()

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    want = f(*leaves, cq, ck)
    want_g = torch.autograd.grad(want, leaves)
    leaves2 = [t.detach().requires_grad_() for t in (q, k, v)]
    got = torch.compile(f, fullgraph=True)(*leaves2, cq, ck)
    got_g = torch.autograd.grad(got, leaves2)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2,
                                   atol=2e-2 * b.float().abs().max().item())
    explained = torch._dynamo.explain(f)(*leaves, cq, ck)
    assert explained.graph_break_count == 0, explained.break_reasons

    def g(q, k, v, cq, ck):
        return flashjit.attention_varlen(q, k, v, cq, ck, causal=True)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="pass max_seqlen_q and max_seqlen_k"):
        torch.compile(g, fullgraph=True)(q, k, v, cq, ck)


@needs_torch
def test_double_backward_is_refused(rng):
    q, k, v, cq, ck = torch_packed(rng, [9, 12], [9, 12], 1, 1, 16, 16,
                                   torch.bfloat16, True)
    o = flashjit.attention_varlen(q, k, v, cq, ck)
    (dq,) = torch.autograd.grad(o.float().square().sum(), q,
                                create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()


@needs_torch
def test_named_errors_torch():
    q = torch.zeros(40, 2, 16, dtype=torch.bfloat16)
    k = v = torch.zeros(30, 2, 16, dtype=torch.bfloat16)
    cq = torch.tensor([0, 10, 40], dtype=torch.int32)
    ck = torch.tensor([0, 25, 30], dtype=torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32 "
                                        "offsets, got torch.int64"):
        flashjit.attention_varlen(q, k, v, cq.long(), ck)
    with pytest.raises(TypeError, match="cu_seqlens_k must be an int32 "
                                        "torch tensor on q's device"):
        flashjit.attention_varlen(q, k, v, cq, [0, 25, 30])
    with pytest.raises(TypeError, match="torch tensor but q, k, v are "
                                        "numpy"):
        flashjit.attention_varlen(q.float().numpy().astype(np.float16),
                                  k.float().numpy().astype(np.float16),
                                  v.float().numpy().astype(np.float16), cq,
                                  ck)
    with pytest.raises(ValueError, match="cu_seqlens_q is on meta, q on cpu"):
        flashjit.attention_varlen(q, k, v, cq.to("meta"), ck)
    with pytest.raises(ValueError, match="must be non-decreasing"):
        flashjit.attention_varlen(q, k, v, torch.tensor(
            [0, 41, 40], dtype=torch.int32), ck)
    with pytest.raises(ValueError, match="past the packed tensor's 30"):
        flashjit.attention_varlen(q, k, v, cq, torch.tensor(
            [0, 25, 31], dtype=torch.int32), 40, 40)  # CPU: checked anyway
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        flashjit.attention_varlen(q.float(), k.float(), v.float(), cq, ck)
    with pytest.raises(ValueError, match="3-D"):
        flashjit.attention_varlen(q[None], k, v, cq, ck)
    with pytest.raises(ValueError, match="one length"):
        flashjit.attention_varlen(q, k, v, cq, ck[:2])
    with pytest.raises(TypeError, match="the others torch tensors"):
        flashjit.attention_varlen(q, np.zeros((30, 2, 16), np.float16), v,
                                  cq, ck)
    with pytest.raises(TypeError, match="takes numpy arrays"):
        flashjit.attention_backward_varlen(q, k, v, q, q, None, cq, ck)
