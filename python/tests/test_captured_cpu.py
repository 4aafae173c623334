"""Captured tensors in Python score modifiers (flashjit.score_ops,
"Captured tensors"), on the CPU with numpy: a modifier or a mask_mod that
indexes arrays by the positions (score_ops.captured(array)[h, i, j]) is
traced into a region with memref<?xf32> arguments, run through
flashjit_forward_captured / flashjit_backward_captured, and checked
against the float64 reference evaluating the same function on numpy
arrays (python/tests/reference.py); the reference on other captured data
must fail the same output, so the check sees the data. Inputs are fresh
random numbers each run."""

import functools

import numpy as np
import pytest

import flashjit
import reference
import score_mods
from flashjit import score_ops as F
from reference import attention_ref, lse_err, rel_err

BOUND = 5e-3  # fp16 inputs, as test_score_ops_cpu.py


# dv != dqk here.
make = functools.partial(reference.random_qkv, Dv=24)


def check(q, k, v, causal, scale, score_mod=None, mask_mod=None,
          wrong=(), gradients=True):
    """attention (and attention_backward) with the modifier and mask
    against the float64 reference of the same functions; each (score_mod,
    mask_mod) pair in wrong (the same functions on other captured data)
    must miss the output by more than 10x the bound."""
    B, H, Nq = q.shape[:3]
    Nkv = k.shape[2]
    o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                score_mod=score_mod, mask_mod=mask_mod,
                                return_lse=True)

    def ref(fn, mask):
        vis = reference.visible_mask(Nq, Nkv, causal=causal)
        if mask is not None:
            vis = vis & score_mods.visible_by(mask, (B, H, Nq, Nkv))
        return vis, attention_ref(q, k, v, scale, vis, score_mod=fn)

    vis, (ro, rl) = ref(score_mod, mask_mod)
    assert rel_err(o, ro) <= BOUND, rel_err(o, ro)
    assert lse_err(lse, rl) <= BOUND, lse_err(lse, rl)
    for fn, mask in wrong:
        _, (wo, wl) = ref(fn, mask)
        assert max(rel_err(o, wo), lse_err(lse, wl)) > 10 * BOUND
    if gradients:
        d_o = np.random.default_rng().standard_normal(o.shape).astype(
            np.float16)
        grads = flashjit.attention_backward(
            q, k, v, o, d_o, lse, causal=causal, scale=scale,
            score_mod=score_mod, mask_mod=mask_mod)
        want = reference.attention_grads_ref(q, k, v, o, d_o, scale, vis,
                                             score_mod=score_mod)
        score_mods.check_grads(grads, want, BOUND)
    return o, lse


def sloped(slopes):
    """ALiBi with learned slopes, FlexAttention style: slopes[h] (j - i)."""
    table = F.captured(slopes)
    return lambda s, b, h, i, j: s + table[h] * (j - i)


@pytest.mark.parametrize("causal,gqa", [(False, 1), (True, 2)])
def test_learned_slopes_per_head(causal, gqa):
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 4, 20, 33
    q, k, v = make(rng, B, H, H // gqa, Nq, Nkv)
    slopes = rng.uniform(0.05, 0.5, H)
    check(q, k, v, causal, 0.5, sloped(slopes),
          wrong=[(sloped(slopes + 0.25), None), (None, None)])


def document_bias(bias, seg, offset):
    """A bias (H, Nq, Nkv) inside each document, -inf across documents:
    seg holds the keys' document ids, query i is key i + offset's position
    (bottom-right alignment, as causal)."""
    b_, s_ = F.captured(bias), F.captured(seg)
    return lambda s, b, h, i, j: F.where(s_[i + offset] == s_[j],
                                         s + b_[h, i, j], -np.inf)


def documents(rng, n, pieces=3):
    """Document ids 0, 0, ..., 1, ... of n keys in `pieces` runs."""
    cuts = np.sort(rng.choice(np.arange(1, n), pieces - 1, replace=False))
    return np.repeat(np.arange(pieces), np.diff(np.r_[0, cuts, n]))


@pytest.mark.parametrize("causal", [False, True])
def test_bias_and_document_mask_with_gqa(causal):
    """where(seg[i] == seg[j], s + bias[h, i, j], -inf) with GQA and Nq !=
    Nkv: one region, two captured tensors (seg read twice is one)."""
    rng = np.random.default_rng()
    B, H, Hkv, Nq, Nkv = 2, 4, 2, 24, 40
    q, k, v = make(rng, B, H, Hkv, Nq, Nkv)
    bias = rng.standard_normal((H, Nq, Nkv)) * 2
    seg = documents(rng, Nkv)
    fn = document_bias(bias, seg, Nkv - Nq)
    text, caps = F.trace_with_captures(fn)
    assert len(caps) == 2 and caps[0] is seg and caps[1] is bias
    # The wrong documents must change the mask where the queries look (at
    # least Nq visible pairs), else the check that can fail could not: a
    # random draw may agree with seg on every visible pair.
    i = np.arange(Nq)[:, None] + (Nkv - Nq)
    j = np.arange(Nkv)[None, :]
    seen = (j <= i) if causal else np.ones((Nq, Nkv), bool)
    while True:
        other_seg = documents(rng, Nkv, pieces=5)
        moved = (seg[i] == seg[j]) != (other_seg[i] == other_seg[j])
        if np.count_nonzero(moved & seen) >= Nq:
            break
    check(q, k, v, causal, 0.4, fn,
          wrong=[(document_bias(bias * -1.0, seg, Nkv - Nq), None),
                 (document_bias(bias, other_seg, Nkv - Nq), None)])


def test_document_mask_as_mask_mod_with_a_bias_score_mod():
    """The same tensors split over score_mod (the bias) and mask_mod (the
    documents): the mask traced into a mask_mod region of its own whose
    captured tensor follows the score_mod's (with_mask still folds both
    into one score_mod region); and the block mask from that mask_mod
    (evaluated eagerly on numpy positions through the same captured
    wrapper) skips whole blocks."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv, bs = 1, 2, 96, 96, 32
    q, k, v = make(rng, B, H, H, Nq, Nkv)
    bias = rng.standard_normal((1, H, 1, Nkv))  # broadcast over b and i
    seg = np.repeat([0, 1], [40, 56])
    b_, s_ = F.captured(bias), F.captured(seg)

    def score_mod(s, b, h, i, j):
        return s + b_[b, h, i, j]

    def same_document(b, h, i, j):
        return s_[i] == s_[j]

    text, caps = F.trace_with_captures(F.with_mask(score_mod, same_document))
    assert len(caps) == 2 and "%c1: memref<?xf32>" in text
    text, caps = flashjit._score_mod_and_captures(score_mod, same_document)
    score_text, mask_text = flashjit._lib.split_modifiers(text)
    assert "attn.yield %v1 : f32" in score_text or ": f32\n  }" in score_text
    assert mask_text.rstrip().endswith("}") and ": i1\n" in mask_text
    assert caps[0] is bias and caps[1] is seg
    check(q, k, v, True, None, score_mod, same_document,
          wrong=[(None, same_document), (score_mod, None)])
    bm = flashjit.BlockMask.from_mask_mod(same_document, B, H, Nq, Nkv,
                                          block_size=bs)
    assert not bm.to_dense().all()  # blocks across documents are skipped
    o = flashjit.attention(q, k, v, causal=True, score_mod=score_mod,
                           mask_mod=same_document, block_mask=bm)
    vis = (reference.visible_mask(Nq, Nkv, causal=True)
           & score_mods.visible_by(same_document, (B, H, Nq, Nkv)))
    ro, _ = attention_ref(q, k, v, None, vis, score_mod=score_mod)
    assert rel_err(o, ro) <= BOUND


def test_one_element_tensor_as_a_number_and_sinks():
    """A one-element array used as a number (s * temperature) is captured
    (read at 0); with attention sinks on top (numpy path)."""
    rng = np.random.default_rng()
    q, k, v = make(rng, 1, 2, 2, 16, 16)
    temperature = F.captured(np.array([2.5]))
    fn = lambda s, b, h, i, j: s * temperature  # noqa: E731
    check(q, k, v, False, 0.5, fn, wrong=[(None, None)], gradients=False)
    sinks = np.array([1.0, -0.5])
    o = flashjit.attention(q, k, v, scale=0.5, score_mod=fn, sinks=sinks)
    ro, _ = reference.sink_attention_ref(q, k, v, 0.5 * 2.5, None, sinks)
    assert rel_err(o, ro) <= BOUND


def test_region_text_arguments_and_dedupe():
    """The region takes one memref<?xf32> per captured tensor after kv_idx,
    in first-use order, and reads it with memref.load at the flat index
    sum(idx_d * stride_d); the same array (wrapped twice) is one argument;
    a dimension of size 1 is read at 0; constant indices fold."""
    bias = np.zeros((3, 5, 7))
    seg = np.arange(7)
    a, a2, s_ = F.captured(bias), F.captured(bias), F.captured(seg)

    def fn(s, b, h, i, j):
        return F.where(s_[i] == s_[j], s + a[h, i, j] + a2[2, i, -1], s)

    text, caps = F.trace_with_captures(fn)
    assert len(caps) == 2 and caps[0] is seg and caps[1] is bias
    header = text.splitlines()[1]
    assert header.endswith("%j: index, %c0: memref<?xf32>, "
                           "%c1: memref<?xf32>):"), header
    assert "%c2" not in text
    assert text.count("memref.load %c0[") == 2
    assert text.count("memref.load %c1[") == 2
    assert "arith.constant 35 : index" in text  # h's stride, 5 * 7
    assert "arith.constant 76 : index" in text  # 2 * 35 + 6 (index -1)
    assert F.trace(fn) == text
    one = F.captured(np.ones((1, 7)))
    t1, c1 = F.trace_with_captures(lambda s, b, h, i, j: s + one[h, j])
    assert "memref.load %c0[%j]" in t1 and len(c1) == 1
    plain, none = F.trace_with_captures(lambda s, b, h, i, j: s * 2)
    assert none == [] and "memref" not in plain
    # The compiler takes the region: its attn stage shows the loads.
    attn = flashjit.compile(32, score_mod=fn).emit("attn")
    assert "memref.load" in attn


def test_eager_indexing_matches_numpy_with_broadcast():
    """Outside tracing captured(...) indexes as numpy does, a dimension of
    size 1 read at 0 whatever its index (as in the kernel)."""
    x = np.arange(12.0).reshape(1, 3, 4)
    c = F.captured(x)
    i = np.arange(3)[:, None]
    j = np.arange(4)[None, :]
    assert np.array_equal(c[5, i, j], x[0, i, j])
    assert np.array_equal(c[np.ones((3, 1), int), i, j], x[0, i, j])
    assert c[0, 2, 3] == 11.0 and c.shape == (1, 3, 4)
    assert np.array_equal(np.asarray(c), x)


def test_named_errors():
    q, k, v = (np.zeros((1, 1, 16, 16), np.float16) for _ in range(3))
    table = np.ones(16)
    # A numpy array indexed directly cannot be intercepted: the error says
    # what to do.
    with pytest.raises(F.TraceError, match="captured"):
        flashjit.attention(q, k, v, score_mod=lambda s, b, h, i, j:
                           s + table[j])
    with pytest.raises(F.TraceError, match="used as a number"):
        flashjit.attention(q, k, v, score_mod=lambda s, b, h, i, j:
                           s + table)
    # More than 8 tensors.
    many = [F.captured(np.ones(16) * n) for n in range(9)]
    with pytest.raises(F.TraceError, match="at most 8"):
        F.trace(lambda s, b, h, i, j: s + sum(t[j] for t in many))
    # Eight are fine.
    assert "%c7:" in F.trace(lambda s, b, h, i, j:
                             s + sum(t[j] for t in many[:8]))
    # Not float-convertible.
    for bad in (np.ones(4, complex), np.array(["a", "b"]),
                np.array([object()])):
        with pytest.raises(F.TraceError, match="real numbers"):
            F.captured(bad)
    # The captured value in Python control flow.
    c = F.captured(np.ones(16))
    with pytest.raises(F.TraceError, match="no truth value"):
        F.trace(lambda s, b, h, i, j: s if c[j] > 0 else -s)
    with pytest.raises(F.TraceError, match="no Python value"):
        F.trace(lambda s, b, h, i, j: s + float(c[j]))
    # Indices: one per dimension, positions or ints, in range.
    c2 = F.captured(np.ones((4, 16)))
    with pytest.raises(F.TraceError, match="one per dimension"):
        F.trace(lambda s, b, h, i, j: s + c2[j])
    with pytest.raises(F.TraceError, match="a float"):
        F.trace(lambda s, b, h, i, j: s + c2[h, s])
    with pytest.raises(F.TraceError, match="out of range"):
        F.trace(lambda s, b, h, i, j: s + c2[4, j])
    with pytest.raises(F.TraceError, match="an index is a position"):
        F.trace(lambda s, b, h, i, j: s + c2[h, j:])
    # Integer data that float32 does not hold exactly.
    ids = F.captured(np.array([0, 2**24 + 1] * 8, np.int64))
    with pytest.raises(ValueError, match="2\\^24"):
        flashjit.attention(q, k, v, score_mod=lambda s, b, h, i, j:
                           F.where(ids[i] == ids[j], s, -np.inf))
    # The region text alone (without its tensors) is the C API's error.
    text = F.trace(lambda s, b, h, i, j: s + c[j])
    with pytest.raises(flashjit.InvalidArgumentError):
        flashjit.attention(q, k, v, score_mod=text)


# -- gradients of captured tensors ---------------------------------------------
# attention_backward(..., capture_grads=True): d loss / d tensor for loss =
# sum(d_o * o). The float64 reference (reference.capture_grads_ref) sums
# G * d s' / d x, G = P (dP - D) and d s' / d x by central differences of the
# modifier itself (at x +- a step); with D from the kernel's o (rounded to
# fp16, as the kernel's backward has it) it is what the kernel is checked
# against, and with the exact D it must agree with central differences of
# the float64 reference's loss (capture_grad_by_differences: independent of
# any formula) to 1e-6. The rounded D matters here: a temperature's or a
# slope's gradient sums G * s or G * (j - i) over whole rows, where the
# terms cancel, so D's rounding error (harmless for dq, dk, dv) moves it by
# up to a few percent. The reference gradient on other captured data must
# miss the kernel's by 10x the bound.

CAPTURE_GRAD_BOUND = 5e-3


class Run:
    """One forward and capture_grads backward: .grads (the list
    attention_backward returns last), .o, .d_o, .vis, .loss(x') (the
    float64 reference's sum(d_o * o) with make_fn(x')), .ref(x', exact)
    (reference.capture_grads_ref at x', with the kernel's o or exact)."""

    def __init__(self, q, k, v, causal, scale, make_fn, x, mask_mod=None,
                 sinks=None):
        B, H, Nq = q.shape[:3]
        Nkv = k.shape[2]
        fn = make_fn(x)
        o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                    score_mod=fn, mask_mod=mask_mod,
                                    sinks=sinks, return_lse=True)
        d_o = np.random.default_rng().standard_normal(o.shape).astype(
            np.float16)
        out = flashjit.attention_backward(
            q, k, v, o, d_o, lse, causal=causal, scale=scale, score_mod=fn,
            mask_mod=mask_mod, sinks=sinks, capture_grads=True)
        assert len(out) == (4 if sinks is None else 5)
        assert isinstance(out[-1], list)
        vis = reference.visible_mask(Nq, Nkv, causal=causal)
        if mask_mod is not None:
            vis = vis & score_mods.visible_by(mask_mod, (B, H, Nq, Nkv))
        if sinks is None:  # dq, dk, dv as without capture_grads
            want = reference.attention_grads_ref(q, k, v, o, d_o, scale, vis,
                                                 score_mod=fn)
            score_mods.check_grads(out[:3], want, BOUND)
        self.grads, self.o, self.d_o, self.vis = out[-1], o, d_o, vis
        self.args = (q, k, v, scale, make_fn, sinks)

    def loss(self, x):
        q, k, v, scale, make_fn, sinks = self.args
        if sinks is None:
            o, _ = attention_ref(q, k, v, scale, self.vis,
                                 score_mod=make_fn(x))
        else:  # make_fn(x) must then be a scale change (a temperature)
            o, _ = reference.sink_attention_ref(
                q, k, v, scale * float(np.ravel(x)[0]), self.vis, sinks)
        return (o * self.d_o.astype(np.float64)).sum()

    def ref(self, x, exact=False, elements=None):
        q, k, v, scale, make_fn, sinks = self.args
        return reference.capture_grads_ref(
            q, k, v, self.d_o, scale, self.vis, make_fn, x,
            o=None if exact else self.o, elements=elements, sinks=sinks)

    def compared(self, got, x, other, elements=None):
        """(got, want, wrong) as float64 vectors: got (the kernel's
        gradient of x), the reference at x and at other data; the
        reference with the exact D is checked on the way against central
        differences of the loss (at elements, default all)."""
        by_diff = reference.capture_grad_by_differences(self.loss, x,
                                                        elements)
        exact = self.ref(x, exact=True, elements=elements)
        assert rel_err(exact.ravel(), by_diff) <= 1e-6, (exact, by_diff)
        return (np.asarray(got, np.float64).ravel(), self.ref(x).ravel(),
                self.ref(other).ravel())

    def check(self, got, x, other, elements=None):
        """got within the bound of the reference at x, and further than 10x
        the bound from the reference at other (compared)."""
        check_capture_grad(*self.compared(got, x, other, elements))


def check_capture_grad(got, want, wrong):
    err = rel_err(got, want)
    assert err <= CAPTURE_GRAD_BOUND, (err, got, want)
    assert rel_err(got, wrong) > 10 * CAPTURE_GRAD_BOUND, \
        (rel_err(got, wrong), got, wrong)


@pytest.mark.parametrize("causal,gqa", [(False, 1), (True, 2)])
def test_gradient_of_learned_slopes(causal, gqa):
    """d loss / d slopes of s + slopes[h] * (j - i) (float64 slopes: a
    float64 gradient); the gradient at the negated slopes fails it."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 4, 20, 33
    q, k, v = make(rng, B, H, H // gqa, Nq, Nkv)
    slopes = rng.uniform(0.05, 0.5, H)
    run = Run(q, k, v, causal, 0.5, sloped, slopes)
    (g,) = run.grads
    assert g.shape == (H,) and g.dtype == np.float64
    run.check(g, slopes, -slopes)


def biased(x):
    """s + x[h, i, j]: a full bias (H, Nq, Nkv)."""
    t = F.captured(x)
    return lambda s, b, h, i, j: s + t[h, i, j]


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_of_a_full_bias(causal):
    """d loss / d bias of s + bias[h, i, j] (H, Nq, Nkv) float32, with GQA
    and Nq != Nkv: all of it (zero where causal masks), the reference
    checked by central differences on 16 random elements; the gradient of
    the negated bias fails it."""
    rng = np.random.default_rng()
    B, H, Hkv, Nq, Nkv = 2, 4, 2, 18, 30
    q, k, v = make(rng, B, H, Hkv, Nq, Nkv)
    bias = (rng.standard_normal((H, Nq, Nkv)) * 1.5).astype(np.float32)
    run = Run(q, k, v, causal, 0.4, biased, bias)
    (g,) = run.grads
    assert g.shape == bias.shape and g.dtype == np.float32
    if causal:  # masked scores have no gradient
        assert not g[:, ~run.vis[0, 0]].any()
    # G summed over the batch is the bias's gradient (a second formula).
    G = reference.score_grads_ref(q, k, v, run.d_o, 0.4, run.vis,
                                  score_mod=biased(bias), o=run.o)
    assert rel_err(run.ref(bias), G.sum(0)) <= 1e-6
    run.check(g, bias, -bias, rng.choice(bias.size, 16, replace=False))


def tempered(x):
    """s * x[0]: a learned temperature (a one-element tensor)."""
    t = F.captured(x)
    return lambda s, b, h, i, j: s * t[0]


def tempered_runs(q, k, v, causal, make_fn, temp, other, runs=4,
                  sinks=None):
    """A one-element tensor's gradient is one number, which the reference
    at other data could match by chance: (got, want, wrong) over `runs`
    backwards with fresh upstream gradients, concatenated."""
    pieces = []
    for _ in range(runs):
        run = Run(q, k, v, causal, 0.5, make_fn, temp, sinks=sinks)
        (g,) = run.grads
        assert g.shape == temp.shape and g.dtype == temp.dtype
        pieces.append(run.compared(g, temp, other))
    return [np.concatenate(p) for p in zip(*pieces)]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gradient_of_a_learned_temperature(dtype):
    """d loss / d temp of s * temp[0] (the constant index is a captured
    read, not the value baked in), in its dtype; the gradient at half the
    temperature fails it. And s * temp, the one-element array used as a
    number, the same."""
    rng = np.random.default_rng()
    q, k, v = make(rng, 1, 2, 2, 24, 24)
    temp = np.array([rng.uniform(1.5, 3.0)], dtype)
    text, caps = F.trace_with_captures(tempered(temp))
    assert caps == [temp] and "memref.load %c0" in text
    check_capture_grad(*tempered_runs(q, k, v, True, tempered, temp,
                                      temp * 0.5))

    def as_number(x):
        t = F.captured(x)
        return lambda s, b, h, i, j: s * t

    check_capture_grad(*tempered_runs(q, k, v, False, as_number, temp,
                                      temp * 0.5))


def test_gradient_of_a_temperature_with_sinks():
    """With attention sinks: (dq, dk, dv, dsinks, [dtemp]); the kernel's
    backward on the sink attention's (o', lse') gives the sink attention's
    temperature gradient; dsinks is as without capture_grads."""
    rng = np.random.default_rng()
    q, k, v = make(rng, 1, 2, 2, 16, 16)
    temp = np.array([2.0], np.float32)
    sinks = np.array([0.5, -1.0])
    check_capture_grad(*tempered_runs(q, k, v, False, tempered, temp,
                                      temp * 0.5, sinks=sinks))
    o, lse = flashjit.attention(q, k, v, scale=0.5, score_mod=tempered(temp),
                                sinks=sinks, return_lse=True)
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    with_grads = flashjit.attention_backward(
        q, k, v, o, d_o, lse, scale=0.5, score_mod=tempered(temp),
        sinks=sinks, capture_grads=True)
    without = flashjit.attention_backward(
        q, k, v, o, d_o, lse, scale=0.5, score_mod=tempered(temp),
        sinks=sinks)
    assert len(with_grads) == 5 and len(without) == 4
    assert np.array_equal(with_grads[3], without[3])


def test_gradient_of_a_broadcast_bias_with_a_document_mask():
    """bias (1, H, 1, Nkv) (size-1 dimensions read at 0) with a document
    mask_mod on int segment ids: the bias's gradient is shaped as the bias
    (G summed over the batch and the queries); the segment ids get None
    (integers: no gradient). The list is in the kernel's order: the
    score_mod's captured tensors, then the mask_mod's."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv = 2, 2, 26, 26
    q, k, v = make(rng, B, H, H, Nq, Nkv)
    bias = rng.standard_normal((1, H, 1, Nkv))
    seg = documents(rng, Nkv)
    s_ = F.captured(seg)

    def same_document(b, h, i, j):
        return s_[i] == s_[j]

    def row_bias(x):
        t = F.captured(x)
        return lambda s, b, h, i, j: s + t[b, h, i, j]

    _, caps = flashjit._score_mod_and_captures(row_bias(bias), same_document)
    assert caps[0] is bias and caps[1] is seg
    run = Run(q, k, v, True, None, row_bias, bias, mask_mod=same_document)
    g, none = run.grads
    assert none is None and g.shape == bias.shape and g.dtype == np.float64
    G = reference.score_grads_ref(q, k, v, run.d_o, None, run.vis,
                                  score_mod=row_bias(bias), o=run.o)
    assert rel_err(run.ref(bias), G.sum(axis=(0, 2), keepdims=True)) <= 1e-6
    run.check(g, bias, bias[..., ::-1].copy())


def test_capture_grads_options_and_errors():
    """capture_grads=False (default) returns (dq, dk, dv) as before; True
    without captured tensors ends with []; deterministic=True with a float
    captured tensor's gradient gives the same bits on every call (fixed
    point), close to the atomic sum's; with integer captures only (no
    gradient) it runs; a torch tensor captured in the numpy path would get
    a torch gradient (not tested here: no torch needed)."""
    rng = np.random.default_rng()
    q, k, v = make(rng, 1, 2, 2, 16, 16)
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    assert len(flashjit.attention_backward(q, k, v, o, d_o, lse)) == 3
    out = flashjit.attention_backward(q, k, v, o, d_o, lse,
                                      capture_grads=True)
    assert len(out) == 4 and out[3] == []
    slopes = F.captured(np.array([0.1, 0.2]))
    fn = lambda s, b, h, i, j: s + slopes[h] * (j - i)  # noqa: E731
    o, lse = flashjit.attention(q, k, v, score_mod=fn, return_lse=True)
    plain = flashjit.attention_backward(q, k, v, o, d_o, lse, score_mod=fn)
    assert len(plain) == 3
    fixed = [flashjit.attention_backward(q, k, v, o, d_o, lse, score_mod=fn,
                                         deterministic=True,
                                         capture_grads=True)[3][0]
             for _ in range(2)]
    atomic = flashjit.attention_backward(q, k, v, o, d_o, lse, score_mod=fn,
                                         capture_grads=True)[3][0]
    assert np.array_equal(fixed[0], fixed[1])
    assert rel_err(fixed[0], atomic) < 1e-5
    # Deterministic without capture gradients: bit-identical dq, as before.
    a = flashjit.attention_backward(q, k, v, o, d_o, lse, score_mod=fn,
                                    deterministic=True)
    b = flashjit.attention_backward(q, k, v, o, d_o, lse, score_mod=fn,
                                    deterministic=True)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    seg = F.captured(np.array([0] * 7 + [1] * 9))
    doc = lambda b, h, i, j: seg[i] == seg[j]  # noqa: E731
    o, lse = flashjit.attention(q, k, v, mask_mod=doc, return_lse=True)
    out = flashjit.attention_backward(q, k, v, o, d_o, lse, mask_mod=doc,
                                      deterministic=True, capture_grads=True)
    assert out[3] == [None]
