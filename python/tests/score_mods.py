"""Score modifiers written as Python functions that are no named variant,
shared by the CPU and the torch tests: each runs traced in the kernel
(flashjit.score_ops) and on numpy float64 arrays in the reference."""

import numpy as np

import flashjit
import reference
from flashjit import score_ops as F


def relative_bias(s, b, h, i, j):
    """A per-head linear bias of the distance, halved scores above the
    diagonal: where, comparisons, index arithmetic mixed with floats."""
    return F.where(j <= i, s - 0.05 * (h + 1) * (i - j), s * 0.5)


def tanh_and_waves(s, b, h, i, j):
    """numpy's ufuncs on the tracer: tanh, exp2 and sin of positions, the
    batch index, // and %."""
    return (6 * np.tanh(s / 6) + np.exp2(-(b + 1.0)) * np.sin(j * 0.3)
            - 0.1 * ((i // 7) % 3))


def first_rows_masked(s, b, h, i, j):
    """Every key of rows 0..4 masked by the modifier: those rows are empty."""
    return F.where(i < 5, -np.inf, F.maximum(s, -2.0))


def visible_by(mask_mod, shape):
    """[B, H, Nq, Nkv] booleans: mask_mod(b, h, i, j) evaluated by numpy
    (independent of the tracer's with_mask)."""
    return np.broadcast_to(
        np.asarray(mask_mod(*reference.positions(shape)), bool), shape)


def check_forward_and_gradients(score_mod, causal, gqa, bound=5e-3,
                                mask_mod=None):
    """flashjit.attention and attention_backward with score_mod (a name or
    a function) and mask_mod (None or a function) on random fp16 numpy
    inputs, against the float64 reference with the modifier and the mask
    applied by itself; the plain reference (neither) must fail them (the
    check sees the modifier and the mask)."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv, D, Dv = 2, 4, 45, 70, 32, 24
    dtype = np.float16
    q = rng.standard_normal((B, H, Nq, D)).astype(dtype)
    k = rng.standard_normal((B, H // gqa, Nkv, D)).astype(dtype)
    v = rng.standard_normal((B, H // gqa, Nkv, Dv)).astype(dtype)
    scale = 0.5
    o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                score_mod=score_mod, mask_mod=mask_mod,
                                return_lse=True)
    plain_vis = vis = reference.visible_mask(Nq, Nkv, causal=causal)
    if mask_mod is not None:
        vis = vis & visible_by(mask_mod, (B, H, Nq, Nkv))
    ro, rl = reference.attention_ref(q, k, v, scale, vis, score_mod=score_mod)
    assert reference.rel_err(o, ro) <= bound, reference.rel_err(o, ro)
    assert reference.lse_err(lse, rl) <= bound, reference.lse_err(lse, rl)
    plain_o, plain_l = reference.attention_ref(q, k, v, scale, plain_vis)
    assert max(reference.rel_err(o, plain_o),
               reference.lse_err(lse, plain_l)) > 10 * bound
    d_o = rng.standard_normal(o.shape).astype(dtype)
    grads = flashjit.attention_backward(q, k, v, o, d_o, lse, causal=causal,
                                        scale=scale, score_mod=score_mod,
                                        mask_mod=mask_mod)
    ref = reference.attention_grads_ref(q, k, v, o, d_o, scale, vis,
                                        score_mod=score_mod)
    check_grads(grads, ref, bound)


def check_grads(grads, ref, bound=5e-3):
    """Each gradient finite and within bound of the reference's."""
    for got, want in zip(grads, ref):
        assert np.isfinite(got).all()
        assert reference.rel_err(got, want) < bound, reference.rel_err(
            got, want)
