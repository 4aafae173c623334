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
