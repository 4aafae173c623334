"""Every bad input is a named error (issue 16), on the CPU path: integers
that ctypes would wrap, BlockMask values that numpy would truncate, a scale
that overflows f32, a NaN lse, a layout that lists a key block twice."""

import numpy as np
import pytest

import flashjit


def arrays(shape=(1, 2, 32, 16), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float16) for _ in range(3)]


@pytest.mark.parametrize("window, shown", [
    ((2**70, 0), "left must be at most 2**63 - 1 (or None, unbounded), got "
                 "1180591620717411303424"),
    ((2**64 + 5, 0), "got 18446744073709551621"),
    ((2**63, 0), "got 9223372036854775808"),
    ((0, 2**63), "right must be at most 2**63 - 1"),
])
def test_window_past_int64_is_refused_with_its_true_value(window, shown):
    q, k, v = arrays()
    with pytest.raises(ValueError, match=r"window .*" + shown.replace(
            "(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        flashjit.attention(q, k, v, window=window)
    # The largest int64 is unbounded in effect: the same as None.
    o = flashjit.attention(q, k, v, window=(2**63 - 1, 2**63 - 1))
    np.testing.assert_array_equal(o, flashjit.attention(q, k, v))


def test_config_sizes_past_int64_are_refused():
    kern = flashjit.compile(64)
    with pytest.raises(ValueError, match="batch must fit in int64.*got "
                                         "1180591620717411303424"):
        kern.config(batch=2**70)
    with pytest.raises(TypeError, match="seq_len must be an integer"):
        kern.config(seq_len=128.5)
    with pytest.raises(ValueError, match="gqa must fit in int64"):
        flashjit.compile(64, gqa=2**64 + 1)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(block_size=1.5), TypeError, "block_size must be an int, got 1.5"),
    (dict(block_size=True), TypeError, "block_size must be an int"),
    (dict(block_size=2**64 + 16), ValueError,
     "block_size must be in \\[1, 65536\\], got 18446744073709551632"),
    (dict(indices=[[[[0.7, 0]]]]), TypeError,
     "indices must hold integers, got dtype float64"),
    (dict(counts=[[[2**32 + 1]]]), ValueError,
     "a count is out of range \\[0, 2\\]: 4294967297"),
    (dict(counts=np.array([[[2**32 + 1]]], dtype=np.int64)), ValueError,
     "4294967297"),
    (dict(counts=[[[2**70]]]), ValueError, "counts holds 1180591620717411303424"),
    (dict(counts=[[[1.0]]]), TypeError, "counts must hold integers"),
    (dict(indices=[[[[2**32, 0]]]]), ValueError,
     "key block index is out of range \\[0, 2\\): 4294967296"),
    (dict(counts=[[[2]]], indices=[[[[1, 1]]]]), ValueError,
     "key block 1 is listed twice for batch 0, head 0, query block 0"),
])
def test_block_mask_neither_truncates_nor_wraps(kwargs, error, message):
    args = dict(counts=[[[1]]], indices=[[[[0, 0]]]], block_size=16)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        flashjit.BlockMask(**args)


def test_block_mask_accepts_integer_values_of_any_int_dtype():
    for dt in (np.int8, np.int32, np.int64, np.uint16):
        m = flashjit.BlockMask(np.array([[[2]]], dt), np.array([[[[1, 0]]]], dt),
                               np.int64(16))
        assert m.counts.dtype == np.int32 and m.indices.dtype == np.int32
        assert m.block_size == 16 and m.to_dense().tolist() == [[[[True,
                                                                   True]]]]


@pytest.mark.parametrize("scale", [1e38, 1e19, 1e-320, 1e-39])
def test_scale_that_overflows_or_flushes_f32_is_refused(scale):
    q, k, v = arrays()
    with pytest.raises(flashjit.InvalidArgumentError,
                       match=r"scale must be 0 \(1/sqrt\(head_dim\)\) or in "
                             r"\[2\^-126, 2\^63\]"):
        flashjit.attention(q, k, v, scale=scale)


def test_nan_lse_in_the_backward_is_refused():
    q, k, v = arrays()
    o, lse = flashjit.attention(q, k, v, return_lse=True)
    d_o = np.ones_like(o)
    dq, _, _ = flashjit.attention_backward(q, k, v, o, d_o, lse)
    assert np.isfinite(dq).all()
    bad = lse.copy()
    bad[0, 1, 7] = np.nan
    with pytest.raises(flashjit.InvalidArgumentError,
                       match=r"lse\[0, 1, 7\] is nan"):
        flashjit.attention_backward(q, k, v, o, d_o, bad)


def test_forward_refuses_a_layout_that_lists_a_block_twice():
    # Built by hand past the constructor's check, as a caller of the C API
    # could: the C API refuses it for the forward as for the backward.
    q, k, v = arrays(shape=(1, 1, 32, 16))
    bm = flashjit.BlockMask([[[1, 1]]], [[[[0, 1], [1, 0]]]], block_size=16)
    bm.counts = np.array([[[2, 1]]], np.int32)
    bm.indices = np.array([[[[0, 0], [1, 0]]]], np.int32)
    with pytest.raises(flashjit.InvalidArgumentError, match="listed twice"):
        flashjit.attention(q, k, v, block_mask=bm)
