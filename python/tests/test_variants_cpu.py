"""flashjit.variants on the CPU with numpy: each named variant (a
score_mod or mask_mod traced into the attn dialect's region, no kernel
code of its own) run by flashjit.attention / attention_backward on fp16
inputs, against a float64 reference that writes the variant's formula
again in numpy (never calling the variant); the reference with another
parameter (slopes, table, bias, segments, window) must miss the output by
10x the bound, so each check sees the parameter. The gradients of the
captured tensors (ALiBi slopes, a relative-position table, a bias) against
a float64 gradient written from G = d loss / d score' (the formula itself
checked by central differences of the float64 loss). Masks with and
without the block mask create_block_mask makes of them. Inputs are fresh
random numbers each run."""

import numpy as np
import pytest

import flashjit
import reference
from flashjit import score_ops as F
from flashjit import variants as V
from reference import attention_ref, lse_err, rel_err
from score_mods import check_grads

BOUND = 5e-3  # fp16 inputs, as test_captured_cpu.py
GRAD_BOUND = 5e-3


make = reference.random_qkv


def grid(shape):
    """(b, h, i, j) int arrays broadcasting to shape (B, H, Nq, Nkv)."""
    return reference.positions(shape)


def numpy_masks(Nq, Nkv):
    """(i, j): query rows (Nq, 1) and key columns (1, Nkv), from which the
    tests write each mask again in numpy."""
    i = np.arange(Nq)[:, None]
    j = np.arange(Nkv)[None, :]
    return i, j


def check(q, k, v, ref_mod, ref_vis=None, wrong=(), causal=False,
          scale=None, score_mod=None, mask_mod=None, block_mask=None,
          gradients=True):
    """attention (and attention_backward's dq, dk, dv) with the variant
    against the float64 reference: ref_mod, a numpy score modifier
    written independently (None: none), and ref_vis, a boolean
    [B|1, H|1, Nq, Nkv] mask (None: all) on top of causal; each (ref_mod,
    ref_vis) of wrong must miss by more than 10x the bound. Returns (o,
    lse, vis)."""
    Nq, Nkv = q.shape[2], k.shape[2]
    o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                score_mod=score_mod, mask_mod=mask_mod,
                                block_mask=block_mask, return_lse=True)
    base = reference.visible_mask(Nq, Nkv, causal=causal)

    def ref(fn, extra):
        vis = base if extra is None else base & extra
        return vis, attention_ref(q, k, v, scale, vis, score_mod=fn)

    vis, (ro, rl) = ref(ref_mod, ref_vis)
    assert rel_err(o, ro) <= BOUND, rel_err(o, ro)
    assert lse_err(lse, rl) <= BOUND, lse_err(lse, rl)
    for fn, extra in wrong:
        _, (wo, wl) = ref(fn, extra)
        assert max(rel_err(o, wo), lse_err(lse, wl)) > 10 * BOUND, \
            (rel_err(o, wo), lse_err(lse, wl))
    if gradients:
        d_o = np.random.default_rng().standard_normal(o.shape).astype(
            np.float16)
        grads = flashjit.attention_backward(
            q, k, v, o, d_o, lse, causal=causal, scale=scale,
            score_mod=score_mod, mask_mod=mask_mod, block_mask=block_mask)
        assert len(grads) == 3
        check_grads(grads, reference.attention_grads_ref(
            q, k, v, o, d_o, scale, vis, score_mod=ref_mod))
    return o, lse, vis


def check_capture_grad(q, k, v, scale, causal, score_mod, ref_mod, reduce,
                       x, other, elements, mask_mod=None, ref_vis=None,
                       position=0):
    """attention_backward(..., capture_grads=True)'s gradient of the
    captured tensor x (entry `position` of the list) against the float64
    gradient reduce(G, x) (G = d loss / d score', score_grads_ref, with D
    from the kernel's rounded o as the kernel's backward has it), and the
    reference at the other data must miss it by 10x the bound. The
    formula reduce(G) with the exact o is checked first against central
    differences of the float64 loss (ref_mod(x')) at the flat elements
    given. Returns the list of gradients."""
    Nq, Nkv = q.shape[2], k.shape[2]
    vis = reference.visible_mask(Nq, Nkv, causal=causal)
    if ref_vis is not None:
        vis = vis & ref_vis
    o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                score_mod=score_mod, mask_mod=mask_mod,
                                return_lse=True)
    d_o = np.random.default_rng().standard_normal(o.shape).astype(np.float16)
    out = flashjit.attention_backward(q, k, v, o, d_o, lse, causal=causal,
                                      scale=scale, score_mod=score_mod,
                                      mask_mod=mask_mod, capture_grads=True)
    assert len(out) == 4 and isinstance(out[3], list)
    check_grads(out[:3], reference.attention_grads_ref(
        q, k, v, o, d_o, scale, vis, score_mod=ref_mod(x)))
    got = out[3][position]
    assert got.shape == np.shape(x) and got.dtype == np.asarray(x).dtype

    def G(data, o_given):
        return reference.score_grads_ref(q, k, v, d_o, scale, vis,
                                         score_mod=ref_mod(data), o=o_given)

    def loss(data):
        ro, _ = attention_ref(q, k, v, scale, vis, score_mod=ref_mod(data))
        return (ro * d_o.astype(np.float64)).sum()

    exact = reduce(G(x, None), x).ravel()[elements]
    by_diff = reference.capture_grad_by_differences(loss, x, elements)
    assert rel_err(exact, by_diff) <= 1e-6, (exact, by_diff)
    want = reduce(G(x, o), x)
    wrong = reduce(G(other, o), other)
    got = np.asarray(got, np.float64)
    assert rel_err(got, want) <= GRAD_BOUND, rel_err(got, want)
    assert rel_err(got, wrong) > 10 * GRAD_BOUND, rel_err(got, wrong)
    return out[3]


# -- softcap --------------------------------------------------------------


def capped(c):
    return lambda s, b, h, i, j: c * np.tanh(s / c)


@pytest.mark.parametrize("causal,gqa", [(False, 1), (True, 2)])
def test_softcap(causal, gqa):
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 4, 30, 45
    q, k, v = make(rng, B, H, H // gqa, Nq, Nkv)
    # scale 1: scores of spread ~ sqrt(32), well past the cap
    check(q, k, v, capped(2.5), causal=causal, scale=1.0,
          score_mod=V.softcap(2.5),
          wrong=[(capped(5.0), None), (None, None)])


def test_softcap_is_the_named_kernel():
    """The traced softcap(C) canonicalises to "softcap:C": the same tile
    stage (whose #attn.kernel names the variant), and bit-identical
    outputs."""
    for c in (30, 2.5, 1 / 3):
        traced = flashjit.compile(64, score_mod=V.softcap(c)).emit("tile")
        named = flashjit.compile(64, score_mod=f"softcap:{c!r}").emit("tile")
        assert traced == named
        assert 'score_mod = "softcap:' in traced and "custom" not in traced
    rng = np.random.default_rng()
    q, k, v = make(rng, 1, 2, 2, 20, 20)
    a = flashjit.attention(q, k, v, score_mod=V.softcap(2.5), scale=1.0)
    b = flashjit.attention(q, k, v, score_mod="softcap:2.5", scale=1.0)
    assert np.array_equal(a, b)


# -- ALiBi ----------------------------------------------------------------


def sloped(slopes):
    x = np.asarray(slopes, np.float64)
    return lambda s, b, h, i, j: s + x[h] * (j - i)


def test_alibi_slopes_values():
    got = V.alibi_slopes(8)
    assert got.dtype == np.float64 and got.shape == (8,)
    assert np.array_equal(got, [2.0 ** -(n + 1) for n in range(8)])
    assert np.allclose(V.alibi_slopes(3),
                       [2 ** (-8 / 3), 2 ** (-16 / 3), 2 ** -8])


def test_alibi_slopes_like_a_torch_tensor():
    torch = pytest.importorskip("torch")
    got = V.alibi_slopes(4, like=torch.zeros(1))
    assert got.dtype == torch.float32 and got.device.type == "cpu"
    assert np.allclose(got.numpy(), [2.0 ** -2, 2.0 ** -4, 2.0 ** -6,
                                     2.0 ** -8])


@pytest.mark.parametrize("causal,gqa", [(False, 1), (True, 2)])
def test_alibi_learned_slopes(causal, gqa):
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 4, 24, 37
    q, k, v = make(rng, B, H, H // gqa, Nq, Nkv)
    slopes = rng.uniform(0.05, 0.5, H)
    check(q, k, v, sloped(slopes), causal=causal, scale=0.5,
          score_mod=V.alibi(slopes),
          wrong=[(sloped(slopes + 0.25), None), (None, None)])


def test_alibi_standard_slopes_match_the_named_variant():
    """alibi(alibi_slopes(H)) reads the slopes the named "alibi:H" bakes
    in: the same outputs (to float32 rounding of the slopes)."""
    rng = np.random.default_rng()
    H = 4
    q, k, v = make(rng, 1, H, H, 30, 30)
    a, la = flashjit.attention(q, k, v, score_mod=V.alibi(V.alibi_slopes(H)),
                               return_lse=True)
    b, lb = flashjit.attention(q, k, v, score_mod=f"alibi:{H}",
                               return_lse=True)
    assert rel_err(a, b.astype(np.float64)) <= 1e-3
    assert lse_err(la, lb.astype(np.float64)) <= 1e-5


@pytest.mark.parametrize("causal,gqa", [(False, 1), (True, 2)])
def test_alibi_slopes_gradient(causal, gqa):
    """d loss / d slopes = sum over b, i, j of G[b, h, i, j] (j - i)."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 4, 20, 33
    q, k, v = make(rng, B, H, H // gqa, Nq, Nkv)
    slopes = rng.uniform(0.05, 0.5, H)
    _, _, i, j = grid((1, 1, Nq, Nkv))

    def reduce(G, x):
        return (G * (j - i)).sum(axis=(0, 2, 3))

    (g,) = check_capture_grad(q, k, v, 0.5, causal, V.alibi(slopes), sloped,
                              reduce, slopes, -slopes, np.arange(H))
    assert g.dtype == np.float64


# -- relative position bias ---------------------------------------------------


def relative(table, n, clip=None):
    """s + table[h, d + n - 1] (d = j - i, clipped to [-clip, clip] and then
    offset by clip instead); a 1-D table shared by the heads."""
    t = np.asarray(table, np.float64)

    def fn(s, b, h, i, j):
        d = j - i
        if clip is not None:
            d = np.clip(d, -clip, clip)
            off = clip
        else:
            off = n - 1
        return s + (t[d + off] if t.ndim == 1 else t[h, d + off])
    return fn


def scatter_table(G, x, n, clip=None):
    """The table's gradient: G summed over (b, i, j) into the entry each
    position reads (per head, or over the heads for a shared table)."""
    B, H, Nq, Nkv = G.shape
    i, j = numpy_masks(Nq, Nkv)
    d = (j - i) if clip is None else np.clip(j - i, -clip, clip)
    idx = np.broadcast_to(d + (n - 1 if clip is None else clip), (Nq, Nkv))
    out = np.zeros(np.shape(x))
    Gs = G.sum(axis=0)  # (H, Nq, Nkv)
    if out.ndim == 1:
        np.add.at(out, idx.ravel(), Gs.sum(axis=0).ravel())
    else:
        for h in range(H):
            np.add.at(out[h], idx.ravel(), Gs[h].ravel())
    return out


@pytest.mark.parametrize("shared,causal", [(False, False), (True, True)])
def test_relative_position_bias(shared, causal):
    rng = np.random.default_rng()
    B, H, Hkv, Nq, Nkv = 2, 4, 2, 26, 40
    n = 41  # covers Nq, Nkv <= 41: table length 81
    q, k, v = make(rng, B, H, Hkv, Nq, Nkv)
    shape = (2 * n - 1,) if shared else (H, 2 * n - 1)
    table = rng.standard_normal(shape) * 1.5
    other = table[..., ::-1].copy()
    check(q, k, v, relative(table, n), causal=causal, scale=0.5,
          score_mod=V.relative_position_bias(table),
          wrong=[(relative(other, n), None), (None, None)])


def test_relative_position_bias_clipped():
    """max_distance=D: j - i clipped to [-D, D], table (H, 2 D + 1)."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv, D = 1, 3, 36, 36, 5
    q, k, v = make(rng, B, H, H, Nq, Nkv)
    table = rng.standard_normal((H, 2 * D + 1)) * 2
    check(q, k, v, relative(table, None, clip=D), scale=0.5,
          score_mod=V.relative_position_bias(table, max_distance=D),
          wrong=[(relative(table[::-1].copy(), None, clip=D), None),
                 (relative(np.zeros((H, 2 * D + 1)), None, clip=D), None)])


@pytest.mark.parametrize("clip", [None, 4])
def test_relative_position_bias_gradient(clip):
    rng = np.random.default_rng()
    B, H, Hkv, Nq, Nkv = 2, 2, 1, 20, 28
    n = 28
    q, k, v = make(rng, B, H, Hkv, Nq, Nkv)
    length = 2 * n - 1 if clip is None else 2 * clip + 1
    table = (rng.standard_normal((H, length)) * 1.5).astype(np.float32)
    elements = rng.choice(table.size, 10, replace=False)
    (g,) = check_capture_grad(
        q, k, v, 0.5, clip is None, V.relative_position_bias(
            table, max_distance=clip),
        lambda x: relative(x, n, clip),
        lambda G, x: scatter_table(G, x, n, clip), table, -table, elements)
    assert g.dtype == np.float32


# -- bias ------------------------------------------------------------------


def added(x):
    """s + x broadcast over (B, H, Nq, Nkv) (numpy broadcasting)."""
    t = np.asarray(x, np.float64)
    return lambda s, b, h, i, j: s + t


@pytest.mark.parametrize("shape", ["full", "heads", "keys", "2d"])
def test_bias(shape):
    rng = np.random.default_rng()
    B, H, Hkv, Nq, Nkv = 2, 4, 2, 22, 31
    q, k, v = make(rng, B, H, Hkv, Nq, Nkv)
    dims = {"full": (B, H, Nq, Nkv), "heads": (H, Nq, Nkv),
            "keys": (1, H, 1, Nkv), "2d": (Nq, Nkv)}[shape]
    x = rng.standard_normal(dims) * 2
    check(q, k, v, added(x), scale=0.5, score_mod=V.bias(x),
          causal=shape == "heads",
          wrong=[(added(-x), None), (None, None)])


@pytest.mark.parametrize("dims", [(2, 2, 18, 25), (1, 2, 1, 25)])
def test_bias_gradient(dims):
    """G summed over the dimensions the bias broadcasts over."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 2, 18, 25
    q, k, v = make(rng, B, H, H, Nq, Nkv)
    x = (rng.standard_normal(dims) * 1.5).astype(np.float32)
    axes = tuple(a for a in range(4) if dims[a] == 1)

    def reduce(G, _):
        return G.sum(axis=axes, keepdims=True)

    elements = rng.choice(x.size, 10, replace=False)
    check_capture_grad(q, k, v, None, True, V.bias(x), added, reduce, x, -x,
                       elements)


# -- masks -----------------------------------------------------------------


def segments(rng, n, pieces=3):
    cuts = np.sort(rng.choice(np.arange(1, n), pieces - 1, replace=False))
    return np.repeat(np.arange(pieces), np.diff(np.r_[0, cuts, n]))


@pytest.mark.parametrize("Nq,Nkv,blocks", [(30, 50, False), (50, 30, False),
                                           (96, 96, True)])
def test_causal_is_top_left(Nq, Nkv, blocks):
    """causal(): i >= j (top-left); flashjit's causal=True (bottom-right)
    is the wrong reference where Nq != Nkv, and the unmasked one always."""
    rng = np.random.default_rng()
    B, H = 1, 2
    q, k, v = make(rng, B, H, H, Nq, Nkv)
    i, j = numpy_masks(Nq, Nkv)
    want = (i >= j)[None, None]
    bm = None
    if blocks:
        bm = flashjit.create_block_mask(V.causal(), B, H, Nq, Nkv,
                                        BLOCK_SIZE=32)
        assert not bm.to_dense().all()
    wrong = [(None, None)]
    if Nq != Nkv:
        wrong.append((None, reference.visible_mask(Nq, Nkv, causal=True)))
    check(q, k, v, None, want, wrong=wrong, mask_mod=V.causal(),
          block_mask=bm)
    if Nq == Nkv:  # the same as the built-in option
        o = flashjit.attention(q, k, v, mask_mod=V.causal(), block_mask=bm)
        p = flashjit.attention(q, k, v, causal=True)
        assert rel_err(o, p.astype(np.float64)) <= 1e-3


@pytest.mark.parametrize("left,right,Nq,Nkv,blocks", [
    (7, 0, 40, 40, False),
    (5, 3, 30, 45, False),
    (None, 4, 40, 30, False),
    (6, None, 40, 40, False),
    (20, 0, 96, 96, True),
    (10, 10, 96, 112, True),
])
def test_sliding_window(left, right, Nq, Nkv, blocks):
    rng = np.random.default_rng()
    B, H = 2, 2
    q, k, v = make(rng, B, H, H, Nq, Nkv)
    i, j = numpy_masks(Nq, Nkv)

    def window(lo, hi):
        keep = np.ones((Nq, Nkv), bool)
        if lo is not None:
            keep &= j >= i - lo
        if hi is not None:
            keep &= j <= i + hi
        return keep[None, None]

    m = V.sliding_window(left, right)
    bm = None
    if blocks:
        bm = flashjit.create_block_mask(m, B, H, Nq, Nkv, BLOCK_SIZE=32)
        assert not bm.to_dense().all()
    shifted = (None if left is None else left + 2,
               None if right is None else right + 2)
    check(q, k, v, None, window(left, right), mask_mod=m, block_mask=bm,
          wrong=[(None, window(*shifted))])


@pytest.mark.parametrize("blocks", [False, True])
def test_document(blocks):
    """seg[i] == seg[j] on int segment ids (no gradient: None), with a
    causal mask by and_masks; with the block mask that skips the blocks
    across documents."""
    rng = np.random.default_rng()
    B, H, N = 1, 2, 96
    q, k, v = make(rng, B, H, H, N, N)
    seg = segments(rng, N, 4)
    i, j = numpy_masks(N, N)
    same = (seg[i] == seg[j])[None, None]
    m = V.and_masks(V.causal(), V.document(seg))
    bm = None
    if blocks:
        bm = flashjit.create_block_mask(m, B, H, N, N, BLOCK_SIZE=32)
        assert not bm.to_dense().all()
    other = segments(rng, N, 6)
    check(q, k, v, None, same & (i >= j), mask_mod=m, block_mask=bm,
          wrong=[(None, (other[i] == other[j]) & (i >= j)),
                 (None, (i >= j)[None, None])])
    _, caps = F.trace_with_captures(F.with_mask(None, m))
    assert len(caps) == 1 and caps[0] is seg


def test_document_with_query_and_key_ids():
    """document(q_ids, kv_ids) for Nq != Nkv: decoding the last Nq
    positions of a packed sequence (two captured tensors)."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 2, 12, 60
    q, k, v = make(rng, B, H, H, Nq, Nkv)
    ids = segments(rng, Nkv, 3)
    ids[-Nq // 2:] = 7  # the last queries start a document of their own
    qid = ids[-Nq:].copy()
    m = V.document(qid, ids)
    i, j = numpy_masks(Nq, Nkv)
    want = (qid[i] == ids[j])[None, None]
    check(q, k, v, None, want, causal=True, mask_mod=m,
          wrong=[(None, (ids[:Nq][i] == ids[j])[None, None])])
    _, caps = F.trace_with_captures(F.with_mask(None, m))
    assert len(caps) == 2 and caps[0] is qid and caps[1] is ids


def test_and_or_masks():
    """or_masks(prefix, sliding window) (a prefix-LM-like pattern) and
    and_masks of it with a document mask; empty combinators keep all /
    nothing."""
    rng = np.random.default_rng()
    B, H, N = 1, 2, 64
    q, k, v = make(rng, B, H, H, N, N)
    i, j = numpy_masks(N, N)
    prefix = lambda b, h, i, j: j < 6  # noqa: E731
    either = V.or_masks(prefix, V.sliding_window(4))
    want = ((j < 6) | ((j >= i - 4) & (j <= i)))[None, None]
    check(q, k, v, None, want, mask_mod=either,
          wrong=[(None, ((j >= i - 4) & (j <= i))[None, None])])
    seg = segments(rng, N, 3)
    both = V.and_masks(either, V.document(seg))
    bm = flashjit.create_block_mask(both, B, H, N, N, BLOCK_SIZE=16)
    check(q, k, v, None, want & (seg[i] == seg[j]), mask_mod=both,
          block_mask=bm, wrong=[(None, want)])
    shape = (B, H, N, N)
    assert np.broadcast_to(V.and_masks()(*grid(shape)), shape).all()
    assert not np.broadcast_to(V.or_masks()(*grid(shape)), shape).any()
    assert np.array_equal(
        np.broadcast_to(V.and_masks(V.causal())(*grid(shape)), shape),
        np.broadcast_to(i >= j, shape))


def test_a_score_variant_under_masks_and_its_gradient():
    """alibi under and_masks(causal(), document(seg)): a score_mod and a
    mask_mod region, two captured tensors in the kernel's order (the
    score_mod's first: the slopes' gradient; then the mask's ids, None)."""
    rng = np.random.default_rng()
    B, H, N = 2, 2, 40
    q, k, v = make(rng, B, H, H, N, N)
    seg = segments(rng, N, 3)
    slopes = rng.uniform(0.05, 0.5, H)
    i, j = numpy_masks(N, N)
    vis = ((seg[i] == seg[j]) & (i >= j))[None, None]
    m = V.and_masks(V.causal(), V.document(seg))
    check(q, k, v, sloped(slopes), vis, score_mod=V.alibi(slopes),
          mask_mod=m, wrong=[(sloped(2 * slopes), vis), (None, vis)])
    _, _, ii, jj = grid((1, 1, N, N))

    def reduce(G, x):
        return (G * (jj - ii)).sum(axis=(0, 2, 3))

    grads = check_capture_grad(q, k, v, None, False, V.alibi(slopes),
                               sloped, reduce, slopes, -slopes, np.arange(H),
                               mask_mod=m, ref_vis=vis, position=0)
    assert grads[1] is None and len(grads) == 2


def test_masks_evaluate_on_numpy_positions():
    """What create_block_mask runs: each mask on numpy positions is the
    numpy mask."""
    shape = (1, 1, 20, 30)
    b, h, i, j = grid(shape)
    seg = np.repeat([0, 1, 2], 10)
    kv = np.repeat([0, 1, 2], [5, 10, 15])

    def ev(m):
        return np.broadcast_to(m(b, h, i, j), shape)[0, 0]

    i2, j2 = i[0, 0], j[0, 0]
    assert np.array_equal(ev(V.causal()), np.broadcast_to(i2 >= j2, (20, 30)))
    assert np.array_equal(ev(V.sliding_window(3, 2)),
                          (j2 >= i2 - 3) & (j2 <= i2 + 2))
    assert np.array_equal(ev(V.document(seg, kv)), seg[i2] == kv[j2])


# -- errors ----------------------------------------------------------------


def test_bad_arguments():
    for cap in (0, -1.0, float("inf"), float("nan"), 1e39, 1e-60):
        with pytest.raises(ValueError, match="cap must be > 0"):
            V.softcap(cap)
    for cap in ("30", True, None, np.ones(2)):
        with pytest.raises(TypeError, match="cap must be a real number"):
            V.softcap(cap)
    with pytest.raises(ValueError, match="left must be in"):
        V.sliding_window(-1)
    with pytest.raises(ValueError, match="right must be in"):
        V.sliding_window(3, -2)
    with pytest.raises(TypeError, match="left must be an int"):
        V.sliding_window(2.5)
    with pytest.raises(TypeError, match="right must be an int"):
        V.sliding_window(2, True)
    with pytest.raises(ValueError, match="both None"):
        V.sliding_window(None, None)
    with pytest.raises(ValueError, match="slopes must have 1 dimensions"):
        V.alibi(np.ones((2, 2)))
    with pytest.raises(TypeError, match="slopes must be a numpy array"):
        V.alibi(0.5)
    with pytest.raises(ValueError, match="heads must be >= 1"):
        V.alibi_slopes(0)
    with pytest.raises(TypeError, match="like must be None"):
        V.alibi_slopes(4, like=np.zeros(1))
    with pytest.raises(ValueError, match="table must have 1 or 2"):
        V.relative_position_bias(np.ones((2, 2, 3)))
    with pytest.raises(ValueError, match="must be odd"):
        V.relative_position_bias(np.ones((2, 8)))
    with pytest.raises(ValueError, match="must be 9"):
        V.relative_position_bias(np.ones((2, 7)), max_distance=4)
    with pytest.raises(ValueError, match="max_distance must be in"):
        V.relative_position_bias(np.ones((2, 7)), max_distance=-3)
    with pytest.raises(ValueError, match="tensor must have 2 or 3 or 4"):
        V.bias(np.ones(5))
    with pytest.raises(ValueError, match="tensor must have 2 or 3 or 4"):
        V.bias(np.ones((1, 1, 1, 2, 2)))
    with pytest.raises(TypeError, match="must hold integers"):
        V.document(np.zeros(8))
    with pytest.raises(TypeError, match="kv_segment_ids must hold integers"):
        V.document(np.zeros(8, int), np.zeros(8))
    with pytest.raises(ValueError, match="segment_ids must have 1"):
        V.document(np.zeros((2, 8), int))
    with pytest.raises(TypeError, match="real numbers"):
        V.bias(np.ones((4, 4), complex))  # score_ops' TraceError
    with pytest.raises(TypeError, match="argument 1 must be a mask_mod"):
        V.and_masks(V.causal(), 3)
    with pytest.raises(TypeError, match="argument 0 must be a mask_mod"):
        V.or_masks(None)


def test_exported():
    assert flashjit.variants is V and "variants" in flashjit.__all__
    for name in V.__all__:
        assert callable(getattr(V, name)) and getattr(V, name).__doc__
