"""The C API's prepared forward calls (flashjit_plan_*) through ctypes on a
CPU handle: the signatures _lib declares, a plan's output against
flashjit.attention's on the same inputs (new data each call), and the named
errors. Needs numpy only."""

import ctypes

import numpy as np
import pytest

import flashjit
from flashjit import _lib


def _inputs(rng, shape, kv_shape):
    return (rng.standard_normal(shape).astype(np.float16),
            rng.standard_normal(kv_shape).astype(np.float16),
            rng.standard_normal(kv_shape).astype(np.float16))


def _tensor(a):
    return _lib.make_tensor(a.ctypes.data, a.shape,
                            [s // a.itemsize for s in a.strides])


def _make_plan(q, k, v, o, mask=_lib.MASK_NONE, gqa=1, scale=0.0):
    spec = _lib.make_spec(q.shape[3], v.shape[3], _lib.DTYPE_FP16, mask, gqa,
                          0)
    plan = ctypes.c_void_p()
    ts = [_tensor(a) for a in (q, k, v, o)]
    _lib.check(_lib.lib().flashjit_plan_create(
        _lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec),
        *(ctypes.byref(t) for t in ts), None, scale, -1, -1, None, None,
        ctypes.byref(plan)))
    assert plan.value
    return plan.value


@pytest.mark.parametrize("causal", [False, True])
def test_plan_matches_attention_on_new_inputs(causal):
    rng = np.random.default_rng(1)
    shape, kv_shape = (2, 4, 33, 16), (2, 2, 40, 16)
    q, k, v = _inputs(rng, shape, kv_shape)
    o = np.empty(shape, np.float16)
    lse = np.empty(shape[:3], np.float32)
    plan = _make_plan(q, k, v, o, _lib.MASK_CAUSAL if causal else
                      _lib.MASK_NONE, gqa=2, scale=0.25)
    lib = _lib.lib()
    try:
        for _ in range(3):
            q, k, v = _inputs(rng, shape, kv_shape)
            _lib.check(lib.flashjit_plan_forward(
                plan, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                o.ctypes.data, lse.ctypes.data, None, None, None))
            want, want_lse = flashjit.attention(q, k, v, causal=causal,
                                                scale=0.25, return_lse=True)
            assert np.array_equal(o, want)
            assert np.array_equal(lse, want_lse)
    finally:
        lib.flashjit_plan_destroy(plan)


def test_plan_errors_are_named():
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng, (1, 1, 8, 16), (1, 1, 8, 16))
    o = np.empty_like(q)
    lib = _lib.lib()
    with pytest.raises(flashjit.InvalidArgumentError, match="innermost"):
        _make_plan(q[..., ::2], k[..., ::2], v[..., ::2], o[..., ::2])
    plan = _make_plan(q, k, v, o)
    try:
        status = lib.flashjit_plan_forward(plan, q.ctypes.data, None,
                                           v.ctypes.data, o.ctypes.data, None,
                                           None, None, None)
        with pytest.raises(flashjit.InvalidArgumentError, match="k is NULL"):
            _lib.check(status)
        status = lib.flashjit_plan_forward(None, q.ctypes.data, k.ctypes.data,
                                           v.ctypes.data, o.ctypes.data, None,
                                           None, None, None)
        with pytest.raises(flashjit.InvalidArgumentError,
                           match="plan is NULL"):
            _lib.check(status)
    finally:
        lib.flashjit_plan_destroy(plan)


def test_captured_plan_reads_each_calls_tensor():
    """flashjit_plan_create_captured / flashjit_plan_forward_captured (C API
    version 12) through _lib's signatures: a plan of a score_mod that reads
    a bias tensor gives, for a new bias on each call, flashjit.attention's
    output with that bias; a call without the tensors, or with another
    size, is a named error."""
    from flashjit import score_ops

    rng = np.random.default_rng(3)
    shape = (1, 2, 24, 16)
    q, k, v = _inputs(rng, shape, shape)
    o = np.empty(shape, np.float16)
    lse = np.empty(shape[:3], np.float32)
    first = rng.standard_normal((2, 24, 24)).astype(np.float32)
    text, caps = score_ops.trace_with_captures(
        lambda s, b, h, i, j: s + score_ops.captured(first)[h, i, j])
    assert len(caps) == 1
    spec = _lib.make_spec(16, 16, _lib.DTYPE_FP16, _lib.MASK_NONE, 1, 0,
                          score_mod=text)
    array, count = _lib.make_captured([(first.ctypes.data, first.size)])
    plan = ctypes.c_void_p()
    ts = [_tensor(a) for a in (q, k, v, o)]
    lib = _lib.lib()
    _lib.check(lib.flashjit_plan_create_captured(
        _lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec),
        *(ctypes.byref(t) for t in ts), None, 0.0, -1, -1, None, array, count,
        None, ctypes.byref(plan)))
    assert plan.value
    try:
        for _ in range(2):
            bias = rng.standard_normal((2, 24, 24)).astype(np.float32)
            array, count = _lib.make_captured([(bias.ctypes.data, bias.size)])
            o.fill(np.nan)
            _lib.check(lib.flashjit_plan_forward_captured(
                plan.value, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                o.ctypes.data, lse.ctypes.data, None, None, array, count,
                None))
            want = flashjit.attention(
                q, k, v,
                score_mod=lambda s, b, h, i, j:
                    s + score_ops.captured(bias)[h, i, j])
            other = flashjit.attention(
                q, k, v,
                score_mod=lambda s, b, h, i, j:
                    s + score_ops.captured(first)[h, i, j])
            assert np.array_equal(o, want)
            assert not np.array_equal(o, other)
        status = lib.flashjit_plan_forward(
            plan.value, q.ctypes.data, k.ctypes.data, v.ctypes.data,
            o.ctypes.data, lse.ctypes.data, None, None, None)
        with pytest.raises(flashjit.InvalidArgumentError,
                           match="flashjit_plan_forward_captured"):
            _lib.check(status)
        short, count = _lib.make_captured([(first.ctypes.data,
                                            first.size - 1)])
        status = lib.flashjit_plan_forward_captured(
            plan.value, q.ctypes.data, k.ctypes.data, v.ctypes.data,
            o.ctypes.data, lse.ctypes.data, None, None, short, count, None)
        with pytest.raises(flashjit.InvalidArgumentError,
                           match=r"captured\[0\].size is 1151, the plan's "
                                 "1152"):
            _lib.check(status)
    finally:
        lib.flashjit_plan_destroy(plan.value)
