"""Variable-length packing: a batch of sequences of different lengths,
packed one after another (FlashAttention's flash_attn_varlen_func layout),
forward and backward, numpy and torch (C API version 8,
flashjit_forward_varlen / flashjit_backward_varlen).

    q: (total_q, H, d)   k: (total_k, Hkv, d)   v: (total_k, Hkv, dv)
    cu_seqlens_q, cu_seqlens_k: int32 [B + 1] offsets, 0 first,
        non-decreasing: sequence b is rows [cu[b], cu[b + 1]) of q (k, v)
    o: (total_q, H, dv)   lse: float32 (B, H, max_seqlen_q), padded

Everything that attention() does per batch row happens per sequence here:
causal is bottom-right aligned per sequence (query i of a sequence of nq
queries and nkv keys sees key j iff j <= i + nkv - nq), windows likewise,
and a score_mod / mask_mod sees positions within the sequence (q_idx,
kv_idx) and the sequence's index as its batch index. A sequence without
keys gives o = 0 and lse = -inf; lse's rows past a sequence's length are
-inf (padding). Rows of q, k, v past the last offset belong to no
sequence: their o (and gradient) rows are 0 where the offsets are read on
the host (see max_seqlen_* below) and are not written otherwise (CUDA with
explicit max_seqlen_q and max_seqlen_k).

This module imports neither numpy nor torch at import time.
"""

import ctypes
import operator
import sys

from . import _lib

__all__ = ["attention_varlen", "attention_backward_varlen"]

_INT32_MAX = (1 << 31) - 1


def _pkg():
    """The flashjit package (its argument helpers), imported by now."""
    return sys.modules[__package__]


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


# ---------------------------------------------------------------------------
# Checks shared by numpy and torch
# ---------------------------------------------------------------------------


def check_shapes(q_shape, k_shape, v_shape, fn="attention_varlen"):
    """gqa group size of packed (total, heads, head_dim) shapes; a named
    ValueError for shapes that do not fit together."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 3:
            raise ValueError(
                f"flashjit.{fn}: {name} must be 3-D (total_tokens, heads, "
                f"head_dim): the sequences packed one after another, got "
                f"shape {tuple(s)}")
    return _pkg()._kv_group(q_shape, k_shape, v_shape, "(total_k, heads)",
                            f"flashjit.{fn}")


def check_offset_shapes(cu_q_shape, cu_k_shape, fn="attention_varlen"):
    """batch B of two offset arrays' shapes: 1-D, of one length B + 1 >=
    2 (ValueError otherwise)."""
    for name, s in (("cu_seqlens_q", cu_q_shape), ("cu_seqlens_k",
                                                   cu_k_shape)):
        if len(s) != 1:
            raise ValueError(
                f"flashjit.{fn}: {name} must be 1-D (batch + 1 offsets), "
                f"got shape {tuple(s)}")
        if s[0] < 2:
            raise ValueError(
                f"flashjit.{fn}: {name} must hold at least 2 offsets (one "
                f"sequence: [0, length]), got {s[0]}")
    if cu_q_shape[0] != cu_k_shape[0]:
        raise ValueError(
            f"flashjit.{fn}: cu_seqlens_q and cu_seqlens_k must have one "
            f"length (batch + 1), got {cu_q_shape[0]} and {cu_k_shape[0]}")
    return cu_q_shape[0] - 1


def check_offsets(cu, rows, name, fn="attention_varlen"):
    """The longest sequence of host offsets cu (a 1-D integer numpy
    array): 0 first, non-decreasing, the last at most rows (the packed
    tensor's tokens); ValueError naming the first bad one."""
    import numpy as np

    cu = np.asarray(cu, dtype=np.int64)
    if cu[0] != 0:
        raise ValueError(f"flashjit.{fn}: {name}[0] must be 0, got {cu[0]}")
    lengths = np.diff(cu)
    bad = np.flatnonzero(lengths < 0)
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"flashjit.{fn}: {name} must be non-decreasing: {name}[{b + 1}] "
            f"= {cu[b + 1]} < {name}[{b}] = {cu[b]} (sequence {b} would "
            f"have length {lengths[b]})")
    if cu[-1] > rows:
        raise ValueError(
            f"flashjit.{fn}: {name}[-1] = {cu[-1]} is past the packed "
            f"tensor's {rows} tokens")
    return int(lengths.max()) if lengths.size else 0


def max_seqlen(given, longest, name, fn="attention_varlen"):
    """The max_seqlen_* the kernels get: the given int (>= 1, and at least
    the longest sequence when that is known, i.e. not None) or, when None,
    the longest sequence (at least 1)."""
    if given is None:
        if longest is None:  # pragma: no cover (callers compute it first)
            raise ValueError(f"flashjit.{fn}: {name} is needed")
        return max(int(longest), 1)
    if isinstance(given, bool):
        raise TypeError(f"flashjit.{fn}: {name} must be an int, got "
                        f"{given!r}")
    try:
        value = operator.index(given)
    except TypeError:
        raise TypeError(f"flashjit.{fn}: {name} must be an int (or None: "
                        f"computed from the offsets), got {given!r}") from None
    if not 1 <= value <= _INT32_MAX:
        raise ValueError(f"flashjit.{fn}: {name} must be in [1, 2**31 - 1] "
                         f"(at least the longest sequence), got {value}")
    if longest is not None and value < longest:
        raise ValueError(
            f"flashjit.{fn}: {name} = {value} is shorter than the longest "
            f"sequence ({longest}): it must be at least that (or None)")
    return value


def host_offsets(cu, name, fn="attention_varlen"):
    """Offsets given with numpy inputs as a C-contiguous int32 numpy array:
    an int32 array, or a sequence of ints (converted; each must fit int32).
    TypeError for another dtype (an int64 array is not narrowed
    silently)."""
    import numpy as np

    if isinstance(cu, np.ndarray):
        if cu.dtype != np.int32:
            raise TypeError(f"flashjit.{fn}: {name} must be int32 offsets, "
                            f"got dtype {cu.dtype}")
        return np.ascontiguousarray(cu)
    if _is_torch(cu):
        raise TypeError(f"flashjit.{fn}: {name} is a torch tensor but q, k, "
                        "v are numpy arrays: pass all of one kind")
    try:
        values = [_lib.int64(f"{name} entry", x) for x in cu]
    except TypeError as e:
        raise TypeError(f"flashjit.{fn}: {name} must be an int32 numpy "
                        f"array or a sequence of ints ({e})") from None
    if any(not -_INT32_MAX - 1 <= x <= _INT32_MAX for x in values):
        raise ValueError(f"flashjit.{fn}: {name} holds values past int32: "
                         f"{values}")
    return np.array(values, dtype=np.int32).reshape(-1)


def pad_lse(lse, cu_q):
    """Sets lse's (numpy, [B, H, M]) rows past each sequence's length to
    -inf (the kernels do not write them); cu_q: host offsets."""
    import numpy as np

    lens = np.diff(np.asarray(cu_q, dtype=np.int64))
    pad = np.arange(lse.shape[2])[None, :] >= lens[:, None]  # [B, M]
    lse[np.broadcast_to(pad[:, None, :], lse.shape)] = -np.inf
    return lse


# ---------------------------------------------------------------------------
# The public functions
# ---------------------------------------------------------------------------


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                     max_seqlen_k=None, causal=False, scale=None,
                     window=None, score_mod=None, return_lse=False,
                     deterministic=False, mask_mod=None, block_mask=None):
    """attention() over a batch of sequences of different lengths, packed
    one after another (FlashAttention's flash_attn_varlen_func layout).

    q: (total_q, H, d); k: (total_k, Hkv, d); v: (total_k, Hkv, dv), H a
    multiple of Hkv (GQA). The token and head strides are arbitrary, the
    innermost (head-dim) stride must be 1.
    cu_seqlens_q, cu_seqlens_k: int32 offsets of length B + 1 (B >= 1), 0
        first, non-decreasing, the last at most total_q (total_k):
        sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and
        the output, and rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k
        and v. torch: int32 tensors on q's device; numpy: int32 arrays
        (or lists of ints).
    max_seqlen_q, max_seqlen_k: the longest query (key) sequence, or any
        int at least that (the kernels' grid spans it; lse is padded to
        max_seqlen_q). None (default): computed from the offsets on the
        host, which also checks them (ValueError naming a bad one); for
        CUDA tensors that copies the offsets to the host, a synchronization
        of the current stream. Give both (as FlashAttention's callers do)
        to keep a CUDA call free of synchronization (then the offsets are
        not checked: offsets out of range are undefined behaviour, as in
        FlashAttention) and for torch.compile (needed there).
    causal: bottom-right aligned per sequence: query i of a sequence of
        nq queries and nkv keys sees key j iff j <= i + nkv - nq.
    scale, window, score_mod, mask_mod, deterministic: as attention()'s,
        per sequence: positions (q_idx, kv_idx) are within the sequence and
        the batch index b is the sequence's index. Captured tensors work
        (autograd reaches a torch one that requires grad).
    block_mask: a flashjit.BlockMask (or FlexAttention's) over the
        sequences: [B or 1, H or 1, ceil(max_seqlen_q / S), ceil(max_seqlen_k
        / S)], each sequence's blocks counted from its own start (a block
        listed past a sequence's keys is masked there); full blocks as in
        attention().
    return_lse: also return lse, float32 (B, H, max_seqlen_q): the
        natural-log logsumexp of each row (-inf for a row that sees no key,
        whose output row is 0, e.g. a sequence without keys); the rows past
        a sequence's length are -inf.

    Returns o (total_q, H, dv) [, lse]. Rows of q that belong to no
    sequence (past cu_seqlens_q[-1]) get o = 0 where the offsets are read
    on the host (numpy, torch CPU tensors, or max_seqlen_q / max_seqlen_k
    left None) and are not written otherwise.

    torch CUDA tensors (bfloat16 / float16) run on the GPU on torch's
    current stream, torch CPU tensors and numpy arrays (float16, or
    float32 via bf16) in the CPU execution mode; torch tensors get autograd
    (flashjit::attention_varlen_fwd / _bwd), numpy arrays
    attention_backward_varlen. No attention sinks.
    """
    fj = _pkg()
    text, captures = fj._score_mod_and_captures(score_mod, mask_mod)
    mask, wl, wr = fj._mask_and_window(causal, window)
    scale = fj._scale(scale)
    bm = fj._block(block_mask)
    if _is_torch(q) or _is_torch(k) or _is_torch(v):
        from . import ops

        o, lse = ops.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            mask, scale, wl, wr, bool(deterministic), text, captures, bm)
        return (o, lse) if return_lse else o
    cu_q, cu_k, B, mq, mk = _numpy_offsets(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    o, lse = forward_numpy(q, k, v, cu_q, cu_k, mq, mk, mask, scale, wl, wr,
                           text, captures, bm=bm)
    return (o, lse) if return_lse else o


def _numpy_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, fn="attention_varlen"):
    """(cu_q, cu_k, B, max_seqlen_q, max_seqlen_k) of numpy inputs,
    checked (q and k first: numpy arrays of the kernels' dtypes)."""
    _pkg()._numpy_kind(fn, (("q", q), ("k", k)))
    cu_q = host_offsets(cu_seqlens_q, "cu_seqlens_q", fn)
    cu_k = host_offsets(cu_seqlens_k, "cu_seqlens_k", fn)
    B = check_offset_shapes(cu_q.shape, cu_k.shape, fn)
    for name, t in (("q", q), ("k", k)):
        if getattr(t, "ndim", None) != 3:
            raise ValueError(
                f"flashjit.{fn}: {name} must be 3-D (total_tokens, heads, "
                f"head_dim), got shape "
                f"{tuple(getattr(t, 'shape', ()))}")
    lq = check_offsets(cu_q, q.shape[0], "cu_seqlens_q", fn)
    lk = check_offsets(cu_k, k.shape[0], "cu_seqlens_k", fn)
    return (cu_q, cu_k, B, max_seqlen(max_seqlen_q, lq, "max_seqlen_q", fn),
            max_seqlen(max_seqlen_k, lk, "max_seqlen_k", fn))


def attention_backward_varlen(q, k, v, o, d_o, lse, cu_seqlens_q,
                              cu_seqlens_k, max_seqlen_q=None,
                              max_seqlen_k=None, causal=False, scale=None,
                              window=None, score_mod=None,
                              deterministic=False, mask_mod=None,
                              capture_grads=False, block_mask=None):
    """dq, dk, dv of attention_varlen(q, k, v, cu_seqlens_q, ...) for the
    upstream gradient d_o, recomputed from its o and lse (return_lse=True;
    the same offsets, max_seqlen_q and options), on the CPU for numpy
    arrays (attention_backward's dtypes and dq modes). dq, dk and dv are
    packed as q, k and v; dk and dv summed over each GQA group; rows that
    belong to no sequence get 0. capture_grads: as attention_backward's
    (one more element, the captured tensors' gradients; None for a
    mask_mod's). block_mask: the forward's. torch tensors get their
    backward from autograd."""
    fj = _pkg()
    mask, wl, wr = fj._mask_and_window(causal, window)
    text, captures = fj._score_mod_and_captures(score_mod, mask_mod)
    fn = "attention_backward_varlen"
    if any(_is_torch(t) for t in (q, k, v, o, d_o, lse)):
        raise TypeError(f"flashjit.{fn} takes numpy arrays; torch tensors "
                        "get their backward from autograd "
                        "(attention_varlen(...).backward())")
    cu_q, cu_k, B, mq, mk = _numpy_offsets(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, fn)
    masked = _lib.mask_capture_count(text)  # a mask's: no gradient
    wanted = ([fj._differentiable_capture(c) and n < len(captures) - masked
               for n, c in enumerate(captures)]
              if capture_grads else None)
    dq, dk, dv, cgrads = backward_numpy(
        q, k, v, o, d_o, lse, cu_q, cu_k, mq, mk, mask, fj._scale(scale), wl,
        wr, deterministic, text, captures, wanted, bm=fj._block(block_mask))
    grads = (dq, dk, dv)
    if capture_grads:
        grads += ([None if g is None else fj._grad_like(g, c)
                   for g, c in zip(cgrads, captures)],)
    return grads


# ---------------------------------------------------------------------------
# numpy: the CPU handle
# ---------------------------------------------------------------------------


def numpy_tensor(name, a, fn="attention_varlen"):
    """flashjit_tensor {1, H, T, d} of a 16-bit numpy array (T, H, d)."""
    import numpy as np

    item = a.itemsize
    for s in a.strides:
        if s < 0 or s % item:
            raise ValueError(
                f"flashjit.{fn}: {name} has byte strides {a.strides}: "
                "strides must be non-negative multiples of the element size")
    st = [s // item for s in a.strides]
    if a.size == 0:  # numpy gives empty arrays zero strides
        st = [int(np.prod(a.shape[i + 1:])) for i in range(3)]
    if a.shape[2] > 1 and st[2] != 1:
        raise ValueError(
            f"flashjit.{fn}: {name}'s innermost (head-dim) stride must be 1, "
            f"got {st[2]} (strides {tuple(st)})")
    return _lib.make_tensor(a.ctypes.data, (1, a.shape[1], a.shape[0],
                                            a.shape[2]),
                            (0, st[1], st[0], 1))


def with_layout(vl, bm, backward=False):
    """(sparse_block, objects to keep alive): bm's layout (a BlockMask,
    or the torch ops' block tensors) set into Varlen vl (host memory:
    the CPU handle's), and for the backward its KV-major transpose where
    bm has one (the CPU handle checks it, as the CUDA path takes it);
    (0, ()) without a layout."""
    if bm is None:
        return 0, ()
    layout, keep = bm._host_layout()
    vl.layout = ctypes.addressof(layout)
    kv = bm._kv_host_layout() if backward else None
    if kv is not None:
        vl.kv_layout = ctypes.addressof(kv[0])
    return bm.block_size, (layout, keep, kv)


def forward_numpy(q, k, v, cu_q, cu_k, max_q, max_k, mask, scale, wl, wr,
                  score_mod="", captures=(), fn="attention_varlen", bm=None):
    """(o, lse) of numpy arrays on the CPU handle; cu_q, cu_k: checked
    int32 host offsets; lse's padding rows -inf; bm: a block mask (or
    None)."""
    import numpy as np

    fj = _pkg()
    dtype, as_kernel, from_kernel = fj._numpy_kind(
        fn, (("q", q), ("k", k), ("v", v)))
    gqa = check_shapes(q.shape, k.shape, v.shape, fn)
    T, H, D = q.shape
    Dv = v.shape[2]
    B = cu_q.shape[0] - 1
    o = np.zeros((T, H, Dv), dtype=np.uint16)
    lse = np.empty((B, H, max_q), dtype=np.float32)
    if T == 0 or k.shape[0] == 0:  # no query or no key: nothing to run
        lse.fill(-np.inf)  # (the C API refuses tensors without rows)
        return from_kernel(o), lse
    ins = [as_kernel(a) for a in (q, k, v)]
    t = [numpy_tensor(n, a, fn) for n, a in zip("qkvo", ins + [o])]
    cu_q = np.ascontiguousarray(cu_q, dtype=np.int32)
    cu_k = np.ascontiguousarray(cu_k, dtype=np.int32)
    vl = _lib.make_varlen(cu_q.ctypes.data, cu_k.ctypes.data, B, max_q, max_k)
    sparse, layout = with_layout(vl, bm)
    spec = _lib.make_spec(D, Dv, dtype, mask, gqa, sparse,
                          score_mod=score_mod, varlen=True)
    held = ()
    caps, count = None, 0
    if captures:
        caps, count, held = fj._captured_args(fj._host_captures(captures, fn))
    _lib.check(_lib.lib().flashjit_forward_varlen(
        _lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec),
        *(ctypes.byref(x) for x in t), lse.ctypes.data_as(ctypes.c_void_p),
        scale, wl, wr, ctypes.byref(vl), caps, count, None))
    del held, ins, layout
    return from_kernel(o), pad_lse(lse, cu_q)


def backward_numpy(q, k, v, o, d_o, lse, cu_q, cu_k, max_q, max_k, mask,
                   scale, wl, wr, deterministic, score_mod="", captures=(),
                   wanted=None, fn="attention_backward_varlen", bm=None):
    """(dq, dk, dv, capture_grads) of numpy arrays on the CPU handle
    (flashjit_backward_varlen); capture_grads as
    flashjit._backward_numpy's."""
    import numpy as np

    fj = _pkg()
    dtype, as_kernel, from_kernel = fj._numpy_kind(
        fn, (("q", q), ("k", k), ("v", v), ("o", o), ("d_o", d_o)))
    gqa = check_shapes(q.shape, k.shape, v.shape, fn)
    T, H, D = q.shape
    Dv = v.shape[2]
    B = cu_q.shape[0] - 1
    if tuple(o.shape) != (T, H, Dv) or tuple(d_o.shape) != tuple(o.shape):
        raise ValueError(f"flashjit.{fn}: o and d_o must be {(T, H, Dv)}, "
                         f"got {tuple(o.shape)} and {tuple(d_o.shape)}")
    lse = np.ascontiguousarray(lse, dtype=np.float32)
    if lse.shape != (B, H, max_q):
        raise ValueError(f"flashjit.{fn}: lse must be {(B, H, max_q)} "
                         f"(batch, heads, max_seqlen_q: the forward's), got "
                         f"{lse.shape}")
    wanted = [False] * len(captures) if wanted is None else list(wanted)
    if len(wanted) != len(captures):
        raise ValueError(f"flashjit.{fn}: {len(wanted)} gradient flags for "
                         f"{len(captures)} captured tensors")
    grads = [np.zeros(a.shape, dtype=np.uint16) for a in (q, k, v)]
    cgrads = [np.zeros(tuple(c.shape), np.float32) if w else None
              for c, w in zip(captures, wanted)]
    if T == 0 or k.shape[0] == 0:  # no query or no key: all gradients 0
        return tuple(from_kernel(g) for g in grads) + (cgrads,)
    ins = [as_kernel(a) for a in (q, k, v, o, d_o)]
    t = [numpy_tensor(n, a, fn) for n, a in
         zip(("q", "k", "v", "o", "d_o", "dq", "dk", "dv"), ins + grads)]
    cu_q = np.ascontiguousarray(cu_q, dtype=np.int32)
    cu_k = np.ascontiguousarray(cu_k, dtype=np.int32)
    vl = _lib.make_varlen(cu_q.ctypes.data, cu_k.ctypes.data, B, max_q, max_k)
    sparse, layout = with_layout(vl, bm, backward=True)
    spec = _lib.make_spec(D, Dv, dtype, mask, gqa, sparse,
                          deterministic=deterministic, score_mod=score_mod,
                          varlen=True)
    caps, count, host = None, 0, ()
    if captures:
        host = fj._host_captures(captures, fn)
        caps, count = _lib.make_captured(
            [(a.ctypes.data, a.size, g.ctypes.data if g is not None else 0)
             for a, g in zip(host, cgrads)])
    # The C API sizes the workspace for a CPU handle too (unused there):
    # NULL and 0, the library's own.
    _lib.check(_lib.lib().flashjit_backward_varlen(
        _lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec),
        *(ctypes.byref(x) for x in t[:5]),
        lse.ctypes.data_as(ctypes.c_void_p),
        *(ctypes.byref(x) for x in t[5:]), scale, wl, wr, ctypes.byref(vl),
        None, 0, caps, count, None))
    del host, ins, layout
    return tuple(from_kernel(g) for g in grads) + (cgrads,)
