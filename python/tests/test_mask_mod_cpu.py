"""mask_mod as a region of its own (flashjit.mask_mods), on the CPU: the
traced text, numpy forward and backward against a float64 reference that
evaluates the mask with numpy (fails the kernel under another mask), the
captured tensors' order and gradients (the mask's take none), the attn
stage that compile() emits, and the named errors."""

import numpy as np
import pytest

import flashjit
from flashjit import mask_mods
from flashjit import score_ops as F

import reference
import score_mods
from reference import attention_ref, rel_err

BOUND = 1e-2


def make(rng, B, H, Nq, Nkv, d=32):
    return [rng.standard_normal((B, H, n, d)).astype(np.float16)
            for n in (Nq, Nkv, Nkv)]


def test_trace_gives_a_mask_region_with_its_captures():
    seg = np.repeat([0, 1, 2], [10, 20, 30])
    s_ = F.captured(seg)
    text, caps = mask_mods.trace_mask_with_captures(
        lambda b, h, i, j: (s_[i] == s_[j]) & ~(j > i))
    assert text.startswith("{\n  ^bb0(%b: index, %h: index, %i: index, "
                           "%j: index, %c0: memref<?xf32>):")
    assert "arith.xori" in text and text.rstrip().endswith("}")
    assert ": i1\n  }" in text
    assert len(caps) == 1 and caps[0] is seg
    # A constant mask is a region too.
    text, caps = mask_mods.trace_mask_with_captures(lambda b, h, i, j: True)
    assert "arith.constant true" in text and caps == []


@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_match_the_reference(causal):
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 2, 50, 70
    q, k, v = make(rng, B, H, Nq, Nkv)

    def stripes(b, h, i, j):
        return (i % 3 == j % 3) | (h == 1)

    def other(b, h, i, j):
        return ((i + 1) % 3 == j % 3) | (h == 1)

    o, lse = flashjit.attention(q, k, v, causal=causal, mask_mod=stripes,
                                return_lse=True)
    vis = (reference.visible_mask(Nq, Nkv, causal=causal)
           & score_mods.visible_by(stripes, (B, H, Nq, Nkv)))
    ro, rl = attention_ref(q, k, v, None, vis)
    assert rel_err(o, ro) <= BOUND
    wrong = (reference.visible_mask(Nq, Nkv, causal=causal)
             & score_mods.visible_by(other, (B, H, Nq, Nkv)))
    assert rel_err(o, attention_ref(q, k, v, None, wrong)[0]) > BOUND
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    got = flashjit.attention_backward(q, k, v, o, d_o, lse, causal=causal,
                                      mask_mod=stripes)
    want = reference.attention_grads_ref(q, k, v, o, d_o, None, vis)
    score_mods.check_grads(got, want, BOUND)


def test_bias_gradient_beside_a_float_document_mask():
    """Float segment ids in the mask: only the score_mod's bias gets a
    gradient (the mask's tensors take none: None), in the kernel's order
    (score_mod's captured tensors, then mask_mod's)."""
    rng = np.random.default_rng()
    B, H, N = 1, 2, 40
    q, k, v = make(rng, B, H, N, N)
    bias = rng.standard_normal((1, H, 1, N))
    seg = np.repeat([0.0, 1.0, 2.0], [12, 8, 20])
    b_, s_ = F.captured(bias), F.captured(seg)

    def score_mod(s, b, h, i, j):
        return s + b_[b, h, i, j]

    def mask_mod(b, h, i, j):
        return s_[i] == s_[j]

    o, lse = flashjit.attention(q, k, v, score_mod=score_mod,
                                mask_mod=mask_mod, return_lse=True)
    vis = score_mods.visible_by(mask_mod, (B, H, N, N))
    ro, _ = attention_ref(q, k, v, None, vis, score_mod=score_mod)
    assert rel_err(o, ro) <= BOUND
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    dq, dk, dv, grads = flashjit.attention_backward(
        q, k, v, o, d_o, lse, score_mod=score_mod, mask_mod=mask_mod,
        capture_grads=True)
    assert len(grads) == 2 and grads[1] is None
    G = reference.score_grads_ref(q, k, v, d_o, None, vis,
                                  score_mod=score_mod, o=o)
    want = G.sum(axis=(0, 2), keepdims=True)
    assert rel_err(grads[0], want) <= BOUND
    assert rel_err(grads[0], want[..., ::-1]) > BOUND


def test_compile_emits_both_regions():
    k = flashjit.compile(64, score_mod="softcap:30",
                         mask_mod=lambda b, h, i, j: j <= i)
    attn = k.emit("attn")
    assert "score_mod {" in attn and "mask_mod {" in attn
    assert "attn.yield %0 : i1" in attn


def test_bad_masks_are_named_errors():
    rng = np.random.default_rng()
    q, k, v = make(rng, 1, 1, 8, 8)
    with pytest.raises(F.TraceError, match="returns a predicate"):
        flashjit.attention(q, k, v, mask_mod=lambda b, h, i, j: i + j)
    with pytest.raises(F.TraceError, match="a mask takes"):
        flashjit.attention(q, k, v, mask_mod=lambda b, h, i: i > 0)
    with pytest.raises(flashjit.InvalidArgumentError, match="mask_mod"):
        flashjit.attention(q, k, v, mask_mod="{ ^bb0(%b: index): }")


def test_full_blocks_skip_the_mask_bit_for_bit():
    """from_mask_mod marks the blocks a document mask keeps whole as full
    (~k entries); the kernel skips the mask there: the same bits as with
    every listed block partial, forward and backward. A block marked full
    where the mask is not all true gives a wrong result (the skip is real)."""
    rng = np.random.default_rng()
    B, H, N, bs = 1, 2, 256, 32
    q, k, v = make(rng, B, H, N, N)
    seg = np.repeat([0, 1, 2], [90, 70, 96])  # edges inside blocks
    s_ = F.captured(seg)

    def doc(b, h, i, j):
        return s_[i] == s_[j]

    bm = flashjit.BlockMask.from_mask_mod(doc, None, None, N, N,
                                          block_size=bs)
    full = bm.to_dense(full_only=True)
    assert full.any() and (bm.indices < 0).any()
    assert (full <= bm.to_dense()).all() and (full != bm.to_dense()).any()
    partial = flashjit.BlockMask.from_dense(bm.to_dense(), bs)
    assert not (partial.indices < 0).any()
    o1, l1 = flashjit.attention(q, k, v, mask_mod=doc, block_mask=bm,
                                return_lse=True)
    o2, l2 = flashjit.attention(q, k, v, mask_mod=doc, block_mask=partial,
                                return_lse=True)
    assert np.array_equal(o1, o2) and np.array_equal(l1, l2)
    vis = score_mods.visible_by(doc, (B, H, N, N))
    assert rel_err(o1, attention_ref(q, k, v, None, vis)[0]) <= BOUND
    d_o = rng.standard_normal(o1.shape).astype(np.float16)
    for det in (False, True):
        g1 = flashjit.attention_backward(q, k, v, o1, d_o, l1, mask_mod=doc,
                                         block_mask=bm, deterministic=det)
        g2 = flashjit.attention_backward(q, k, v, o2, d_o, l2, mask_mod=doc,
                                         block_mask=partial,
                                         deterministic=det)
        want = reference.attention_grads_ref(q, k, v, o1, d_o, None, vis)
        score_mods.check_grads(g1, want, BOUND)
        if det:
            assert all(np.array_equal(a, b) for a, b in zip(g1, g2))
    # Every listed block marked full: the documents' edges go unmasked.
    lie = flashjit.BlockMask.from_dense(bm.to_dense(), bs,
                                        full=bm.to_dense())
    o3 = flashjit.attention(q, k, v, mask_mod=doc, block_mask=lie)
    assert rel_err(o3, attention_ref(q, k, v, None, vis)[0]) > BOUND


def test_torch_autograd_reaches_the_score_mods_tensor_not_the_masks():
    """torch CPU tensors: a float segment-id tensor that requires grad,
    read by the mask_mod, gets no gradient (None); the score_mod's bias
    gets its gradient, which matches float64 autograd of the same math."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(int(np.random.default_rng().integers(1 << 30)))
    B, H, N, d = 1, 2, 48, 32
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(torch.float16)
               .requires_grad_() for _ in range(3))
    bias = torch.randn(H, N, N, generator=g, requires_grad=True)
    seg = torch.tensor(np.repeat([0.0, 1.0, 2.0], [13, 20, 15]),
                       dtype=torch.float32, requires_grad=True)

    def score_mod(s, b, h, i, j):
        return s + bias[h, i, j]

    def mask_mod(b, h, i, j):
        return seg[i] == seg[j]

    o = flashjit.attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
    d_o = torch.randn(o.shape, generator=g).to(o.dtype)
    (o.float() * d_o.float()).sum().backward()
    assert seg.grad is None and bias.grad is not None
    q64, k64, v64, b64 = (x.detach().double().requires_grad_()
                          for x in (q, k, v, bias))
    keep = (seg[:, None] == seg[None, :]).detach()
    s = q64 @ k64.transpose(-1, -2) / d ** 0.5 + b64
    o64 = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v64
    (o64 * d_o.double()).sum().backward()
    assert rel_err(o.detach().double().numpy(), o64.detach().numpy()) <= BOUND
    for got, want in ((q.grad, q64.grad), (bias.grad, b64.grad)):
        assert rel_err(got.double().numpy(), want.numpy()) <= BOUND
