"""Score modifiers written as Python functions (flashjit.score_ops), on the
CPU: traced into the attn IR's score_mod region, compiled (the backward's
derivative derived by the compiler) and checked against the same function
evaluated in float64 by numpy (its derivative by central differences)."""

import numpy as np
import pytest

import flashjit
import reference
import score_mods
from flashjit import score_ops as F
from reference import attention_ref, lse_err, rel_err
from score_mods import (check_forward_and_gradients, check_grads,
                        first_rows_masked, relative_bias, tanh_and_waves)


@pytest.mark.parametrize("fn,causal,gqa", [
    (relative_bias, False, 1),
    (relative_bias, True, 2),
    (tanh_and_waves, False, 2),
    (tanh_and_waves, True, 1),
])
def test_function_forward_and_gradients(fn, causal, gqa):
    check_forward_and_gradients(fn, causal, gqa)


def prefix_lm(b, h, i, j):
    """Keys 0..9 seen by every query, the rest causally."""
    return (j < 10) | (j <= i)


def every_third_key_off_in_odd_heads(b, h, i, j):
    return ~((h % 2 == 1) & (j % 3 == 0))


@pytest.mark.parametrize("score_mod,mask_mod,causal,gqa", [
    (None, prefix_lm, False, 1),
    ("softcap:4", every_third_key_off_in_odd_heads, True, 2),
    (tanh_and_waves, prefix_lm, False, 2),
])
def test_mask_functions(score_mod, mask_mod, causal, gqa):
    """mask_mod (traced into the score_mod region as -inf where the mask
    does not hold) against the reference's own mask, forward and
    gradients, alone and with a named or traced score modifier."""
    check_forward_and_gradients(score_mod, causal, gqa, mask_mod=mask_mod)


def test_mask_errors():
    q, k, v = (np.zeros((1, 1, 16, 16), np.float16) for _ in range(3))
    with pytest.raises(TypeError, match="predicate"):
        flashjit.attention(q, k, v, mask_mod=lambda b, h, i, j: i - j)
    with pytest.raises(TypeError, match="batch, head, q_idx, kv_idx"):
        flashjit.attention(q, k, v, mask_mod=lambda s, b, h, i, j: True)
    # A score_mod given as region text goes beside a mask_mod now (the
    # mask is a region of its own): the same output as the traced function.
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 1, 16, 16)).astype(np.float16)
               for _ in range(3))
    by_text = flashjit.attention(q, k, v, score_mod=F.trace(relative_bias),
                                 mask_mod=prefix_lm)
    by_fn = flashjit.attention(q, k, v, score_mod=relative_bias,
                               mask_mod=prefix_lm)
    assert np.array_equal(by_text, by_fn) and not np.isnan(by_text).any()


def test_rows_emptied_by_the_modifier_give_zero_and_minus_inf():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float16)
               for _ in range(3))
    o, lse = flashjit.attention(q, k, v, score_mod=first_rows_masked,
                                return_lse=True)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert (o[:, :, :5] == 0).all() and np.isneginf(lse[:, :, :5]).all()
    ro, rl = attention_ref(q, k, v, None, None, score_mod=first_rows_masked)
    assert rel_err(o, ro) <= 5e-3 and lse_err(lse, rl) <= 5e-3
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    grads = flashjit.attention_backward(q, k, v, o, d_o, lse,
                                        score_mod=first_rows_masked)
    check_grads(grads, reference.attention_grads_ref(
        q, k, v, o, d_o, None, None, score_mod=first_rows_masked))


def test_trace_is_the_region_and_a_named_variant_is_recognised():
    text = F.trace(relative_bias)
    assert text.startswith("{") and "attn.yield" in text
    assert "arith.select" in text and "arith.cmpi sle" in text
    kernel = flashjit.compile(64, score_mod=relative_bias)
    attn = kernel.emit("attn")
    assert "score_mod" in attn and "arith.select" in attn
    assert 'score_mod = "custom"' in kernel.emit("tile")
    # 30 tanh(s / 30) is softcap:30 after canonicalisation: its kernels.
    softcap = flashjit.compile(64, score_mod=lambda s, b, h, i, j:
                               30 * F.tanh(s / 30))
    assert 'score_mod = "softcap:30"' in softcap.emit("tile")
    # The region text itself is accepted too.
    again = flashjit.compile(64, score_mod=text)
    assert again.emit("attn") == attn


def test_untraceable_functions_are_named_errors():
    q, k, v = (np.zeros((1, 1, 16, 16), np.float16) for _ in range(3))
    with pytest.raises(TypeError, match="no truth value"):
        flashjit.attention(q, k, v, score_mod=lambda s, b, h, i, j:
                           s if s > 0 else -s)
    with pytest.raises(TypeError, match="score, batch, head"):
        flashjit.attention(q, k, v, score_mod=lambda s: s)
    with pytest.raises(TypeError, match="returned None"):
        flashjit.attention(q, k, v, score_mod=lambda s, b, h, i, j: None)
    table = np.ones(16)  # captured tensors are indexed (test_captured_cpu)
    with pytest.raises(TypeError, match="used as a number"):
        flashjit.attention(q, k, v, score_mod=lambda s, b, h, i, j:
                           s + table)
    with pytest.raises(ValueError, match="score_mod region"):
        flashjit.attention(q, k, v, score_mod="{ ^bb0(%s: f32): "
                                              "attn.yield %s : f32 }")
    with pytest.raises(TypeError, match="predicate"):
        F.trace(lambda s, b, h, i, j: (i < j) + s)


@pytest.mark.parametrize("causal,gqa", [(False, 1), (True, 2)])
def test_sinks_forward_and_gradients(causal, gqa):
    """Attention sinks (a logit per query head in each denominator): o,
    lse and dq, dk, dv and dsinks against the extended-softmax reference
    (dsinks by central differences); without the sinks the check fails."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv, D = 2, 4, 40, 56, 32
    q = rng.standard_normal((B, H, Nq, D)).astype(np.float16)
    k = rng.standard_normal((B, H // gqa, Nkv, D)).astype(np.float16)
    v = rng.standard_normal((B, H // gqa, Nkv, D)).astype(np.float16)
    # Large enough to matter: the sink takes exp(sink) / (exp(sink) + sum
    # of exp(score)) of each row, about 35% at +6 (scores of sd ~2.3 over
    # 56 keys sum to ~700 on average, heavy-tailed: at +4, ~7% typically
    # and below the 5e-2 the check below needs in some draws).
    sinks = rng.standard_normal(H) + 6.0
    scale = 0.4
    o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                sinks=sinks, return_lse=True)
    vis = reference.visible_mask(Nq, Nkv, causal=causal)
    ro, rl = reference.sink_attention_ref(q, k, v, scale, vis, sinks)
    assert rel_err(o, ro) <= 5e-3 and lse_err(lse, rl) <= 5e-3
    plain_o, plain_l = attention_ref(q, k, v, scale, vis)
    assert rel_err(o, plain_o) > 5e-2
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    grads = flashjit.attention_backward(q, k, v, o, d_o, lse, causal=causal,
                                        scale=scale, sinks=sinks)
    assert len(grads) == 4 and grads[3].shape == (H,)
    check_grads(grads, reference.sink_attention_grads_ref(
        q, k, v, d_o, scale, vis, sinks))


def test_sinks_on_rows_that_see_no_key_and_bad_shapes():
    """A row that sees no key gives o = 0 and lse = the sink; a sinks
    array of the wrong shape is a named ValueError."""
    q, k, v = (np.ones((1, 2, 8, 16), np.float16) for _ in range(3))
    sinks = np.array([0.5, -1.0])
    o, lse = flashjit.attention(q, k, v, sinks=sinks, return_lse=True,
                                mask_mod=lambda b, h, i, j: i > 3)
    assert (o[:, :, :4] == 0).all() and not np.isnan(o).any()
    assert np.allclose(lse[0, :, :4], sinks[:, None])
    with pytest.raises(ValueError, match="one logit per query head"):
        flashjit.attention(q, k, v, sinks=np.zeros(3))


def test_block_mask_from_a_mask_function_skips_blocks():
    """BlockMask.from_mask_mod lists the blocks where the mask keeps any
    element (checked against every element); with it, attention visits
    only those and still matches the mask's reference."""
    def window_and_prefix(b, h, i, j):
        return ((i - j < 40) & (j <= i)) | (j < 8) | (h == 1)

    B, H, Nq, Nkv, bs = 1, 2, 150, 150, 32
    bm = flashjit.BlockMask.from_mask_mod(window_and_prefix, B, H, Nq, Nkv,
                                          block_size=bs)
    dense = score_mods.visible_by(window_and_prefix, (B, H, Nq, Nkv))
    pad = np.zeros((B, H, 160, 160), bool)
    pad[:, :, :Nq, :Nkv] = dense
    want = pad.reshape(B, H, 5, bs, 5, bs).any(axis=(3, 5))
    assert np.array_equal(bm.to_dense(), want)
    assert bm.to_dense()[0, 0].sum() < 25 and bm.to_dense()[0, 1].all()
    same = flashjit.create_block_mask(window_and_prefix, B, H, Nq, Nkv,
                                      BLOCK_SIZE=bs)
    assert np.array_equal(same.to_dense(), want)
    check_forward_and_gradients_blocks(window_and_prefix, bm, B, H, Nq, Nkv)


def check_forward_and_gradients_blocks(mask_mod, bm, B, H, Nq, Nkv):
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((B, H, n, 32)).astype(np.float16)
               for n in (Nq, Nkv, Nkv))
    o, lse = flashjit.attention(q, k, v, mask_mod=mask_mod, block_mask=bm,
                                return_lse=True)
    vis = score_mods.visible_by(mask_mod, (B, H, Nq, Nkv))
    ro, rl = attention_ref(q, k, v, None, vis)
    assert rel_err(o, ro) <= 5e-3 and lse_err(lse, rl) <= 5e-3
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    grads = flashjit.attention_backward(q, k, v, o, d_o, lse, block_mask=bm,
                                        mask_mod=mask_mod)
    check_grads(grads, reference.attention_grads_ref(q, k, v, o, d_o, None,
                                                     vis))
