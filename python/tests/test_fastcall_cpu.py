"""flashjit._fastcall (python/src/FastCall.cpp): flashjit_plan_forward
called without ctypes. Built beside libflashjit.so (build/lib, or the
wheel's package), it is what flashjit._lib.plan_forward_function gives and
flashjit.attention's planned CUDA calls use. Checked here on CPU plans:
the same outputs as the ctypes call and flashjit.attention on new inputs
each call, the C API's named errors through its status, its own TypeErrors,
and FLASHJIT_FASTCALL=0 falling back to ctypes. Needs numpy only."""

import ctypes
import pathlib

import numpy as np
import pytest

import flashjit
from flashjit import _lib

from test_plan_cpu import _inputs, _make_plan


def _fastcall():
    fn = _lib.plan_forward_function()
    assert fn is not _lib.lib().flashjit_plan_forward, (
        "flashjit._fastcall was not found beside "
        f"{_lib.library_path()} (python/CMakeLists.txt builds it)")
    return fn


def test_the_extension_sits_beside_the_library():
    path = pathlib.Path(_lib.library_path()).parent / "_fastcall.abi3.so"
    assert path.is_file()
    fn = _fastcall()
    assert fn.__module__ == "flashjit._fastcall" or "_fastcall" in repr(fn)


@pytest.mark.parametrize("causal", [False, True])
def test_same_outputs_as_ctypes_and_attention(causal):
    rng = np.random.default_rng(7)
    shape, kv_shape = (1, 4, 29, 24), (1, 2, 35, 24)
    mask = _lib.MASK_CAUSAL if causal else _lib.MASK_NONE
    o = np.empty(shape, np.float16)
    lse = np.empty(shape[:3], np.float32)
    q, k, v = _inputs(rng, shape, kv_shape)
    plan = _make_plan(q, k, v, o, mask, gqa=2, scale=0.3)
    fast, slow = _fastcall(), _lib.lib().flashjit_plan_forward
    try:
        for _ in range(3):
            q, k, v = _inputs(rng, shape, kv_shape)
            o.fill(np.nan)
            lse.fill(np.nan)
            args = (plan, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                    o.ctypes.data, lse.ctypes.data, None, None, None)
            assert fast(*args) == _lib.OK
            got, got_lse = o.copy(), lse.copy()
            o.fill(np.nan)
            assert slow(*args) == _lib.OK
            assert np.array_equal(got, o)
            want, want_lse = flashjit.attention(q, k, v, causal=causal,
                                                scale=0.3, return_lse=True)
            assert np.array_equal(got, want)
            assert np.array_equal(got_lse, want_lse)
    finally:
        _lib.lib().flashjit_plan_destroy(plan)


def test_errors_come_back_as_the_c_api_status():
    rng = np.random.default_rng(8)
    q, k, v = _inputs(rng, (1, 1, 8, 16), (1, 1, 8, 16))
    o = np.empty_like(q)
    plan = _make_plan(q, k, v, o)
    fast = _fastcall()
    try:
        status = fast(plan, q.ctypes.data, None, v.ctypes.data,
                      o.ctypes.data, None, None, None, None)
        with pytest.raises(flashjit.InvalidArgumentError, match="k is NULL"):
            _lib.check(status)
        status = fast(None, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                      o.ctypes.data, None, None, None, None)
        with pytest.raises(flashjit.InvalidArgumentError,
                           match="plan is NULL"):
            _lib.check(status)
        with pytest.raises(TypeError, match="9 arguments"):
            fast(plan, q.ctypes.data)
        with pytest.raises(TypeError, match="argument 2 must be an int"):
            fast(plan, q.ctypes.data, "k", v.ctypes.data, o.ctypes.data,
                 None, None, None, None)
        with pytest.raises(OverflowError):
            fast(plan, 1 << 80, k.ctypes.data, v.ctypes.data, o.ctypes.data,
                 None, None, None, None)
    finally:
        _lib.lib().flashjit_plan_destroy(plan)


def test_flashjit_fastcall_0_takes_ctypes(monkeypatch):
    monkeypatch.setenv("FLASHJIT_FASTCALL", "0")
    assert (_lib.plan_forward_function() is
            _lib.lib().flashjit_plan_forward)


def test_set_function_refuses_a_null_address():
    module = _lib.fastcall_module(
        pathlib.Path(_lib.library_path()).parent / "_fastcall.abi3.so")
    with pytest.raises(ValueError, match="null address"):
        module.set_function(0)
    # Still set to the library's function: a call works.
    _fastcall()
