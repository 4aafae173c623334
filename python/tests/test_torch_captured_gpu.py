"""flashjit on torch CUDA tensors: captured tensors in score modifiers
(flashjit.score_ops, "Captured tensors"), the forward and autograd's
gradients to q, k, v and to the captured tensors, against float64 torch
autograd of the same function (split from test_torch_gpu.py, whose helpers
are in torch_gpu_helpers.py).

Skips without torch; the CUDA tests skip without a GPU.
Inputs are fresh random numbers each run; a failure prints its seed.
"""

import pytest

import flashjit

torch = pytest.importorskip(
    "torch", reason="torch is not installed (test_cpu.py covers the CPU path)")

# seed: the fixture, by name for pytest.
from torch_gpu_helpers import (  # noqa: E402,F401,F811
    BOUND, GRAD_BOUND, cuda, leaves, randn, rel, seed, visible)


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
    causal, GQA, Nq != Nkv; one plan is made for it (flashjit_plan_create_
    captured, since T32) and serves every later call of the same shapes,
    with grad or without."""
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
    assert len(_torch_impl._fwd_plans) == plans + 1
    # Eager, no grad: the kernel directly, the same numbers.
    with torch.no_grad():
        o1 = flashjit.attention(q, k, v, causal=True, score_mod=lambda
                                s, b, h, i, j: s + bias[b, h, i, j])
    o2 = flashjit.attention(*leaves(q, k, v), causal=True,  # the op
                            score_mod=lambda s, b, h, i, j:
                            s + bias[b, h, i, j])
    assert torch.equal(o1, o2.detach())
    assert len(_torch_impl._fwd_plans) == plans + 1


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
