"""The traces flashjit.attention keeps (flashjit._arguments._traced), on the
CPU with numpy: a variant of flashjit.variants (its trace depends only on
what it was made with) is traced on its first call and not again, while
the data of its captured tensors is read at every call (changed in place:
the output follows) and a captured tensor that changes shape or dtype is
traced again; a function of the user's own is traced at every call (it may
read state that changed: a rebound closure variable changes the output);
and_masks / or_masks keep their trace only when every mask they combine
is a variant. Each output against a float64 reference of the mask written
again in numpy, which misses the output for the other segmentation."""

import numpy as np
import pytest

import flashjit
import reference
from flashjit import mask_mods
from flashjit import variants as V
from reference import attention_ref, rel_err

BOUND = 5e-3  # fp16 inputs


class _Counted:
    """mask_mods.trace_mask_with_captures, counting its calls."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = mask_mods.trace_mask_with_captures

        def counted(fn):
            self.calls += 1
            return original(fn)

        monkeypatch.setattr(mask_mods, "trace_mask_with_captures", counted)


def _segments(rng, n, pieces):
    cuts = np.sort(rng.choice(np.arange(1, n), pieces - 1, replace=False))
    return np.repeat(np.arange(pieces), np.diff(np.r_[0, cuts, n]))


def _expect_documents(q, k, v, mask_mod, seg, other):
    """attention with mask_mod against the document mask of seg (within
    the bound) and of other (missed by 10x the bound)."""
    o = flashjit.attention(q, k, v, mask_mod=mask_mod)
    n = q.shape[2]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    want = attention_ref(q, k, v, visible=(seg[i] == seg[j])[None, None])[0]
    wrong = attention_ref(q, k, v, visible=(other[i] == other[j])[None, None])[0]
    assert rel_err(o, want) < BOUND
    assert rel_err(o, wrong) > 10 * BOUND


def test_a_variant_is_traced_once_and_reads_its_data_each_call(monkeypatch):
    rng = np.random.default_rng()
    q, k, v = reference.random_qkv(rng, 1, 2, 2, 64, 64)
    seg = _segments(rng, 64, 3)
    first = seg.copy()
    other = _segments(rng, 64, 5)
    traces = _Counted(monkeypatch)
    m = V.document(seg)
    _expect_documents(q, k, v, m, first, other)
    _expect_documents(q, k, v, m, first, other)
    assert traces.calls == 1
    seg[:] = other  # in place: the same trace, the new data
    _expect_documents(q, k, v, m, other, first)
    assert traces.calls == 1
    # Another shape: traced again (its indexing depends on the shape).
    longer = np.concatenate([first, first])
    q2, k2, v2 = reference.random_qkv(rng, 1, 2, 2, 128, 128)
    m2 = V.document(longer)
    _expect_documents(q2, k2, v2, m2, longer, np.concatenate([other, other]))
    assert traces.calls == 2


def test_a_variant_whose_tensor_changes_shape_is_traced_again(monkeypatch):
    """A kept trace indexes its tensor as it was shaped: ids reshaped in
    place to (2, 48) are traced again, which names the indexing that no
    longer fits instead of reading them as the old 1-d ids."""
    rng = np.random.default_rng()
    q, k, v = reference.random_qkv(rng, 1, 2, 2, 96, 96)
    ids = _segments(rng, 96, 3)
    traces = _Counted(monkeypatch)
    m = V.document(ids)
    _expect_documents(q, k, v, m, ids.copy(), _segments(rng, 96, 5))
    assert traces.calls == 1
    ids.shape = (2, 48)
    with pytest.raises(TypeError, match=r"shape \(2, 48\) indexed with 1"):
        flashjit.attention(q, k, v, mask_mod=m)
    assert traces.calls == 2


def test_a_users_function_is_traced_every_call(monkeypatch):
    rng = np.random.default_rng()
    q, k, v = reference.random_qkv(rng, 1, 2, 2, 64, 64)
    seg = _segments(rng, 64, 3)
    other = _segments(rng, 64, 5)
    traces = _Counted(monkeypatch)

    def document(b, h, i, j):
        from flashjit import score_ops

        ids = score_ops.captured(seg)
        return ids[i] == ids[j]

    first = seg
    _expect_documents(q, k, v, document, first, other)
    seg = other  # the closure now reads another array
    _expect_documents(q, k, v, document, other, first)
    assert traces.calls == 2


def test_combined_masks_keep_a_trace_only_of_variants(monkeypatch):
    rng = np.random.default_rng()
    q, k, v = reference.random_qkv(rng, 1, 2, 2, 64, 64)
    seg = _segments(rng, 64, 3)
    traces = _Counted(monkeypatch)
    fixed = V.and_masks(V.document(seg), V.sliding_window(16))
    assert fixed._flashjit_fixed is True
    mixed = V.or_masks(V.document(seg), lambda b, h, i, j: i == j)
    assert mixed._flashjit_fixed is False
    for _ in range(2):
        flashjit.attention(q, k, v, mask_mod=fixed)
        flashjit.attention(q, k, v, mask_mod=mixed)
    assert traces.calls == 1 + 2


def test_trace_once_marks_a_users_function(monkeypatch):
    """score_ops.trace_once: a function of the user's own traced once, its
    tensor's data still read at every call; a non-function is a named
    TypeError."""
    import pytest

    from flashjit import score_ops

    rng = np.random.default_rng()
    q, k, v = reference.random_qkv(rng, 1, 2, 2, 64, 64)
    seg = _segments(rng, 64, 3)
    first, other = seg.copy(), _segments(rng, 64, 5)
    traces = _Counted(monkeypatch)
    doc = score_ops.trace_once(
        lambda b, h, i, j: score_ops.captured(seg)[i] ==
        score_ops.captured(seg)[j])
    _expect_documents(q, k, v, doc, first, other)
    seg[:] = other
    _expect_documents(q, k, v, doc, other, first)
    assert traces.calls == 1
    with pytest.raises(TypeError, match="trace_once: expected a function"):
        score_ops.trace_once(3)
