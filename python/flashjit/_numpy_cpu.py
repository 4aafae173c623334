"""The CPU execution mode for numpy arrays: attention's forward
(_attention_numpy) and attention_backward's computation (_backward_numpy)
on the C API's CPU handle, the numpy arrays as flashjit_tensors (float16
as is, float32 rounded to bf16 bits and back), and the gradients of
captured tensors (which have one; returned as the tensor's kind and
dtype).

The package re-exports every name here (flashjit._backward_numpy, from .
import _attention_numpy, ...): flashjit.varlen, flashjit._torch_impl (torch
CPU tensors) and the tests use them from there.
"""

import ctypes

from . import _lib
from ._arguments import (_captured_args, _check_shapes, _host_captures,
                         _is_torch)


def _f32_to_bf16_bits(x):
    import numpy as np

    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    bits = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
            >> np.uint32(16)).astype(np.uint16)
    bits[np.isnan(x)] = np.uint16(0x7FC0)
    return bits


def _bf16_bits_to_f32(bits):
    import numpy as np

    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _numpy_tensor(name, a):
    """flashjit_tensor of a 16-bit numpy array (strides in elements)."""
    import numpy as np

    item = a.itemsize
    for i, s in enumerate(a.strides):
        if s < 0 or s % item:
            raise ValueError(
                f"flashjit: {name} has byte strides {a.strides}: strides "
                "must be non-negative multiples of the element size")
    strides = [s // item for s in a.strides]
    if a.size == 0:  # numpy gives empty arrays zero strides; C rejects them
        strides = [int(np.prod(a.shape[i + 1:])) for i in range(4)]
    if a.shape[3] > 1 and strides[3] != 1:
        raise ValueError(
            f"flashjit: {name}'s innermost (head-dim) stride must be 1, got "
            f"{strides[3]} (strides {tuple(strides)})")
    if a.shape[3] == 1:
        strides[3] = 1
    return _lib.make_tensor(a.ctypes.data, a.shape, strides)


def _numpy_kind(fn, arrays):
    """(flashjit dtype, to-kernel-bits, from-kernel-bits) of numpy inputs."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        raise TypeError(f"flashjit.{fn}: expected torch CUDA tensors or "
                        "numpy arrays (numpy is not installed)") from None
    for name, a in arrays:
        if not isinstance(a, np.ndarray):
            raise TypeError(
                f"flashjit.{fn}: {name} is a {type(a).__module__}."
                f"{type(a).__name__}; expected torch CUDA tensors or numpy "
                "arrays (all of one kind)")
    dtypes = {a.dtype for _, a in arrays}
    if len(dtypes) != 1:
        raise TypeError(f"flashjit.{fn}: the inputs' dtypes differ: " +
                        ", ".join(f"{n} {a.dtype}" for n, a in arrays))
    dt = dtypes.pop()
    if dt == np.float16:
        return (_lib.DTYPE_FP16, lambda a: a.view(np.uint16),
                lambda bits: bits.view(np.float16))
    if dt == np.float32:
        return _lib.DTYPE_BF16, _f32_to_bf16_bits, _bf16_bits_to_f32
    raise TypeError(f"flashjit.{fn}: numpy inputs must be float16 or float32 "
                    f"(rounded to bf16), got {dt}")


def _attention_numpy(q, k, v, mask, scale, wl, wr, bm, return_lse,
                     score_mod="", captures=()):
    """attention() of numpy arrays on the CPU handle; captures: the
    tensors the score_mod region captures (flashjit_forward_captured)."""
    import numpy as np

    dtype, as_kernel, from_kernel = _numpy_kind(
        "attention", (("q", q), ("k", k), ("v", v)))
    gqa = _check_shapes(q.shape, k.shape, v.shape)
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    qk, kk, vk = as_kernel(q), as_kernel(k), as_kernel(v)
    o = np.empty((B, H, Nq, Dv), dtype=np.uint16)
    lse = np.empty((B, H, Nq), dtype=np.float32)
    spec = _lib.make_spec(D, Dv, dtype, mask, gqa, bm.block_size if bm else 0,
                          score_mod=score_mod)
    tq, tk, tv = (_numpy_tensor(n, a) for n, a in (("q", qk), ("k", kk), ("v", vk)))
    to = _numpy_tensor("o", o)
    layout, keep = (bm._host_layout() if bm else (None, None))
    lib = _lib.lib()
    args = (_lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec),
            ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
            ctypes.byref(to), lse.ctypes.data_as(ctypes.c_void_p), scale, wl,
            wr, ctypes.byref(layout) if layout is not None else None)
    if captures:
        caps, count, held = _captured_args(_host_captures(captures))
        _lib.check(_lib.lib().flashjit_forward_captured(
            *args, caps, count, None))
        del held
    else:
        _lib.check(lib.flashjit_forward(*args, None))
    del keep
    out = from_kernel(o)
    return (out, lse) if return_lse else out


def _differentiable_capture(c):
    """Whether captured tensor c (numpy array or torch tensor) has a
    gradient: float data does; integer and bool data does not."""
    if _is_torch(c):
        return bool(c.dtype.is_floating_point)
    import numpy as np

    return np.asarray(c).dtype.kind == "f"


def _grad_like(g, c):
    """The float32 gradient g (shaped as c) as c's kind and dtype: a numpy
    array of c's dtype, or a torch tensor of c's dtype on c's device."""
    if _is_torch(c):
        import torch

        return torch.from_numpy(g).to(device=c.device, dtype=c.dtype)
    import numpy as np

    return g.astype(np.asarray(c).dtype, copy=False)


def _backward_numpy(q, k, v, o, d_o, lse, mask, scale, wl, wr, bm,
                    deterministic, score_mod="", captures=(), wanted=None):
    """(dq, dk, dv, capture_grads) of numpy arrays on the CPU handle;
    captures: the tensors the score_mod region captures
    (flashjit_backward_captured); wanted: one bool per captured tensor,
    whose gradient is computed (None: none). capture_grads: one entry per
    captured tensor, its float32 gradient shaped as the tensor where
    wanted, else None."""
    import numpy as np

    dtype, as_kernel, from_kernel = _numpy_kind(
        "attention_backward",
        (("q", q), ("k", k), ("v", v), ("o", o), ("d_o", d_o)))
    gqa = _check_shapes(q.shape, k.shape, v.shape)
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    if tuple(o.shape) != (B, H, Nq, Dv) or tuple(d_o.shape) != tuple(o.shape):
        raise ValueError(f"flashjit.attention_backward: o and d_o must be "
                         f"{(B, H, Nq, Dv)}, got {o.shape} and {d_o.shape}")
    lse = np.ascontiguousarray(lse, dtype=np.float32)
    if lse.shape != (B, H, Nq):
        raise ValueError(f"flashjit.attention_backward: lse must be "
                         f"{(B, H, Nq)}, got {lse.shape}")
    wanted = [False] * len(captures) if wanted is None else list(wanted)
    if len(wanted) != len(captures):
        raise ValueError(f"flashjit.attention_backward: {len(wanted)} "
                         f"gradient flags for {len(captures)} captured "
                         "tensors")
    ins = [as_kernel(a) for a in (q, k, v, o, d_o)]
    grads = [np.empty(a.shape, dtype=np.uint16) for a in (q, k, v)]
    spec = _lib.make_spec(D, Dv, dtype, mask, gqa, bm.block_size if bm else 0,
                          deterministic=deterministic, score_mod=score_mod)
    t = [_numpy_tensor(n, a) for n, a in
         zip(("q", "k", "v", "o", "d_o", "dq", "dk", "dv"), ins + grads)]
    layout, keep = (bm._host_layout() if bm else (None, None))
    # A BlockMask's KV-major transpose (None: none known), as the CUDA path
    # takes it: the CPU handle checks it against its own.
    kv, kv_keep = (bm._kv_host_layout() if bm else None) or (None, None)
    args = (_lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec),
            *(ctypes.byref(x) for x in t[:5]),
            lse.ctypes.data_as(ctypes.c_void_p),
            *(ctypes.byref(x) for x in t[5:]), scale, wl, wr,
            ctypes.byref(layout) if layout is not None else None)
    cgrads = [None] * len(captures)
    caps, count = None, 0
    if captures:
        host = _host_captures(captures, "attention_backward")
        # Zeroed float32 buffers (the C API adds into them) of the flat
        # copy's size, shaped as the tensor: the copy is C-contiguous over
        # the tensor's own shape (a size-1 dimension is stored once, read
        # at 0), so the flat gradient is the tensor's.
        cgrads = [np.zeros(tuple(c.shape), np.float32) if w else None
                  for c, w in zip(captures, wanted)]
        caps, count = _lib.make_captured(
            [(a.ctypes.data, a.size, g.ctypes.data if g is not None else 0)
             for a, g in zip(host, cgrads)])
    if kv is not None:
        _lib.check(_lib.lib().flashjit_backward_kv_major(
            *args, ctypes.byref(kv), None, 0, caps, count, None))
    else:  # with no captured tensors, flashjit_backward
        _lib.check(_lib.lib().flashjit_backward_captured(
            *args, None, 0, caps, count, None))
    del keep, kv_keep, caps
    return tuple(from_kernel(g) for g in grads) + (cgrads,)
