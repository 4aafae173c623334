"""flashjit: JIT-compiled FlashAttention kernels, from Python.

A ctypes binding of libflashjit.so's C API: no compiled extension, any
Python >= 3.9, any recent torch. torch is imported only when torch tensors
are passed in; numpy only for numpy inputs and BlockMask.

    import torch, flashjit
    q = torch.randn(2, 8, 1024, 96, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 1024, 96, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 1024, 96, device="cuda", dtype=torch.bfloat16)
    o = flashjit.attention(q, k, v, causal=True)      # GQA: 8 / 2 heads

Variable-length batches (sequences of different lengths packed one after
another, FlashAttention's varlen layout): flashjit.attention_varlen(q, k,
v, cu_seqlens_q, cu_seqlens_k, ...) (flashjit/varlen.py).

Devices:
  * torch CUDA tensors (bfloat16 or float16) run on the GPU, on torch's
    current stream of the tensors' device, without synchronizing; autograd
    runs the backward there too.
  * numpy arrays run in the CPU execution mode (MLIR's JIT on host
    threads): float16 computes in fp16 and returns float16; float32 is
    rounded to bf16 for the kernel (the kernel's inputs are 16-bit) and the
    bf16 result is returned as float32.
"""

import ctypes
import operator
import sys

from . import _lib
from ._lib import (
    CompileError,
    CudaError,
    FlashjitError,
    InvalidArgumentError,
    LibraryNotFoundError,
    NoDriverError,
    NotImplementedFlashjitError,
    library_path,
)
from .block_mask import BlockMask
from . import mask_mods
from . import score_ops
from . import sinks as sinks_mod
from . import variants
from .varlen import attention_backward_varlen, attention_varlen

__all__ = [
    "attention",
    "compile",
    "Kernel",
    "BlockMask",
    "version",
    "library_path",
    "FlashjitError",
    "InvalidArgumentError",
    "NoDriverError",
    "CompileError",
    "CudaError",
    "NotImplementedFlashjitError",
    "attention_backward",
    "attention_varlen",
    "attention_backward_varlen",
    "LibraryNotFoundError",
    "score_ops",
    "variants",
    "create_block_mask",
]

__version__ = "0.1.0"


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None,
                      BLOCK_SIZE=128, *, kernel=False, like=None,
                      cu_seqlens_q=None, cu_seqlens_k=None):
    """FlexAttention's create_block_mask, for flashjit: the BlockMask of
    the blocks where mask_mod(b, h, i, j) keeps any element
    (BlockMask.from_mask_mod; B or H None broadcasts). Pass it with the
    same mask_mod: attention(q, k, v, mask_mod=fn, block_mask=bm).

    kernel=True: the layout comes from flashjit's own block-classification
    kernel (the C API's flashjit_mask_blocks) rather than from evaluating
    mask_mod in Python: mask_mod (a function, traced as attention's, or a
    mask_mod region's text starting with "{") is compiled with a
    block-sparse forward spec (sparse_block = BLOCK_SIZE, the mask_mod
    region, gqa 1, head dims and dtype of like=q, a numpy array or torch
    tensor shaped (B, H, N, d); without like head dim 64 and bf16) and
    evaluated per block pair, never N x N, on the CPU (device None or
    "cpu") or on a CUDA device (torch's current stream). The result equals
    from_mask_mod's (the same blocks and full marks). That kernel is
    compiled once per spec and cached in the process; with like=q, a later
    attention(q, k, v, mask_mod=fn, block_mask=bm) on the same device (k
    and v with q's heads and head dim, no other mask or score_mod) finds
    it compiled. With cu_seqlens_q and cu_seqlens_k (kernel=True only):
    the layout of a varlen batch for attention_varlen, a row per sequence
    (B None or their count; Q_LEN, KV_LEN the longest), each sequence
    classified on its own lengths and positions. What the C API refuses
    (no mask_mod, a bad BLOCK_SIZE or size) is its InvalidArgumentError
    with its message."""
    if kernel:
        from .mask_blocks import kernel_block_mask

        return kernel_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device,
                                 BLOCK_SIZE, like, cu_seqlens_q, cu_seqlens_k)
    if like is not None or cu_seqlens_q is not None or \
            cu_seqlens_k is not None:
        raise ValueError("flashjit.create_block_mask: like= and "
                         "cu_seqlens_* are the classification kernel's: "
                         "each needs kernel=True")
    return BlockMask.from_mask_mod(mask_mod, B, H, Q_LEN, KV_LEN,
                                   block_size=BLOCK_SIZE, device=device)


def version():
    """libflashjit.so's version string."""
    return _lib.lib().flashjit_version().decode()


# ---------------------------------------------------------------------------
# Arguments shared by both devices
# ---------------------------------------------------------------------------


def _mask_and_window(causal, window):
    """(flashjit_mask, window_left, window_right) from the Python options."""
    if window is None:
        return (_lib.MASK_CAUSAL if causal else _lib.MASK_NONE), -1, -1
    if causal:
        raise ValueError(
            "flashjit: causal=True and window=... are exclusive (causal is "
            "window=(None, 0); a causal sliding window is window=(left, 0))")
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(
            f"flashjit: window must be a pair (left, right), got {window!r}"
        ) from None

    def side(name, w):
        if w is None:
            return -1
        try:
            value = operator.index(w)
        except TypeError:
            value = -1
        if isinstance(w, bool) or value < 0:
            raise ValueError(
                f"flashjit: window {name} must be an int >= 0 or None "
                f"(unbounded), got {w!r}")
        if value > _lib.INT64_MAX:  # ctypes would wrap it (2**64 + 5 as 5)
            raise ValueError(
                f"flashjit: window {name} must be at most 2**63 - 1 (or None, "
                f"unbounded), got {value}")
        return value

    return _lib.MASK_SLIDING_WINDOW, side("left", left), side("right", right)


def _check_shapes(q_shape, k_shape, v_shape):
    """gqa group size; ValueError for shapes that do not fit together."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 4:
            raise ValueError(
                f"flashjit: {name} must be 4-D (batch, heads, seq_len, "
                f"head_dim), got shape {tuple(s)}")
    if k_shape[0] != q_shape[0] or v_shape[0] != q_shape[0]:
        raise ValueError(
            f"flashjit: batch sizes differ: q {tuple(q_shape)}, "
            f"k {tuple(k_shape)}, v {tuple(v_shape)}")
    return _kv_group(q_shape, k_shape, v_shape, "(batch, heads, seq_len)",
                     "flashjit")


def _kv_group(q_shape, k_shape, v_shape, dims, prefix):
    """gqa group size of q, k, v shapes whose heads are dimension 1 and
    head dims the last (dense (B, H, N, d), packed (total, H, d)): k and v
    agree in every other dimension (dims names them), q and k in the
    head dim, q's heads are a multiple of k's; else a ValueError starting
    with prefix."""
    if tuple(k_shape[:-1]) != tuple(v_shape[:-1]):
        raise ValueError(f"{prefix}: k and v must agree in {dims}: "
                         f"k {tuple(k_shape)}, v {tuple(v_shape)}")
    if k_shape[-1] != q_shape[-1]:
        raise ValueError(f"{prefix}: q and k head dims differ: "
                         f"{q_shape[-1]} and {k_shape[-1]}")
    hq, hkv = q_shape[1], k_shape[1]
    if hkv < 1 or hq % hkv != 0:
        raise ValueError(f"{prefix}: q's heads ({hq}) must be a multiple of "
                         f"k's and v's ({hkv}) (GQA)")
    return hq // hkv


def _scale(scale):
    if scale is None:
        return 0.0
    scale = float(scale)
    if not scale > 0:
        raise ValueError(f"flashjit: scale must be > 0 (or None), got {scale}")
    return scale


def _block(block_mask):
    if block_mask is None:
        return None
    if not isinstance(block_mask, BlockMask):
        if hasattr(block_mask, "kv_num_blocks"):  # FlexAttention's BlockMask
            return BlockMask.from_flex(block_mask)
        raise TypeError(
            "flashjit: block_mask must be a flashjit.BlockMask (or a "
            f"FlexAttention BlockMask), got {type(block_mask).__name__}")
    return block_mask


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


# ---------------------------------------------------------------------------
# attention()
# ---------------------------------------------------------------------------

# The eager torch CUDA forward's short path (flashjit._torch_impl's
# fast_forward: a cached plan, one foreign call), set when that module is
# first imported (by the first call with torch tensors); None until then.
# It returns None for every call it does not take (autograd, tracing,
# masks other than causal, CPU tensors, ...), which then go the general way.
_torch_forward = None



def attention(q, k, v, causal=False, scale=None, window=None, block_mask=None,
              return_lse=False, deterministic=False, score_mod=None,
              mask_mod=None, sinks=None):
    """softmax(scale * q k^T + mask) v.

    q: (B, H, Nq, d); k: (B, Hkv, Nkv, d); v: (B, Hkv, Nkv, dv), with H a
    multiple of Hkv (GQA; Hkv = H is multi-head attention). Outer strides are
    arbitrary; the innermost (head-dim) stride must be 1.

    causal: bottom-right aligned (query i sees keys j <= i + Nkv - Nq).
    scale: default 1/sqrt(d).
    window: (left, right): query i sees keys j with
        i + (Nkv - Nq) - left <= j <= i + (Nkv - Nq) + right; None on a side
        is unbounded. Exclusive with causal (causal is (None, 0)).
    block_mask: a flashjit.BlockMask (or FlexAttention's BlockMask) whose
        blocks cover ceil(Nq / block) x ceil(Nkv / block).
    return_lse: also return lse (B, H, Nq) float32, the natural-log
        logsumexp of each row's scaled scores (-inf where a row sees no key;
        its output row is 0).
    deterministic: how autograd's backward sums dq: False (default), by
        atomic adds into an fp32 buffer from the dk/dv loop (faster; dq's
        last bits may vary run to run); True, by a separate pass over query
        blocks, bit-identical run to run. The forward is the same either way.
    score_mod: a score modifier on s = scale * q.k, forward and backward:
        a function fn(s, b, h, i, j) of the score and its batch, query head,
        query row and key row, e.g. lambda s, b, h, i, j: s - 0.1 * abs(i -
        j), traced into the kernel (flashjit.score_ops lists what it may
        use; the backward's derivative is the compiler's); a named one,
        "softcap:C" (C tanh(s / C)) or "alibi:H" (s + 2^(-8 (h + 1) / H) (j
        - i), H the query heads); None (default) for none. A function may
        read tensors indexed by the positions (captured tensors, as
        FlexAttention's): lambda s, b, h, i, j: s + bias[h, i, j] with a
        torch tensor bias, or score_ops.captured(array)[h, i, j] for a
        numpy array; they are passed to the kernel as float32 copies on q's
        device at each call (flashjit.score_ops, "Captured tensors").
        Autograd reaches a captured torch tensor that requires grad (a
        learned bias or slopes; summed by atomic adds, or with
        deterministic=True in 64-bit fixed point, the same bits run to
        run); numpy:
        attention_backward(..., capture_grads=True). flashjit.variants
        makes the common ones (softcap, alibi, relative_position_bias,
        bias; masks causal, sliding_window, document, and_masks,
        or_masks).
    mask_mod: a function fn(b, h, i, j) -> predicate (comparisons of the
        positions combined with & | ~), e.g. lambda b, h, i, j: (i - j <
        256) & (j <= i): keys where it does not hold are masked (on top of
        causal / window / block_mask). Traced into the description's
        mask_mod region (flashjit.mask_mods), which the kernel evaluates
        after the score_mod; blocks it masks whole are skipped only where
        a block_mask says so. It may index captured tensors too (a document
        mask: seg[i] == seg[j]); they take no gradient.
    sinks: attention sinks, one learnable logit per query head (shape (H,),
        any float dtype; gpt-oss): each row's softmax denominator gains
        exp(sinks[h]), as a key whose value is 0; lse includes it. Autograd
        reaches sinks (torch); numpy: attention_backward(..., sinks=)
        returns its gradient too (flashjit.sinks).

    torch CUDA tensors (bfloat16/float16) run on the GPU, with autograd: the
    backward recomputes from the saved q, k, v, o and lse (dk and dv summed
    over each GQA group; no double backward); numpy arrays (float16, or
    float32 via bf16) run on the CPU (their backward: attention_backward).
    """
    score_mod, captures = _score_mod_and_captures(score_mod, mask_mod)
    fast = _torch_forward
    if (fast is not None and window is None and block_mask is None
            and not score_mod and sinks is None):
        out = fast(q, k, v, causal, scale, return_lse)
        if out is not None:
            return out if return_lse else out[0]
    mask, wl, wr = _mask_and_window(causal, window)
    scale = _scale(scale)
    bm = _block(block_mask)
    if sinks is not None:
        sinks_mod.check_sinks(sinks, q.shape[1])
    if _is_torch(q) or _is_torch(k) or _is_torch(v):
        return _attention_torch(q, k, v, mask, scale, wl, wr, bm, return_lse,
                                bool(deterministic), score_mod, sinks,
                                captures)
    if sinks is not None:
        o, lse = _attention_numpy(q, k, v, mask, scale, wl, wr, bm, True,
                                  score_mod, captures)
        o, lse = sinks_mod.apply_numpy(o, lse, sinks)
        return (o, lse) if return_lse else o
    return _attention_numpy(q, k, v, mask, scale, wl, wr, bm, return_lse,
                            score_mod, captures)


def _score_mod(score_mod, mask_mod=None):
    """score_mod as the C API takes it: "" for None, a function traced
    into its region's text (flashjit.score_ops), else the name or region
    text given (which the C API checks and canonicalises: a bad one is its
    InvalidArgumentError, a ValueError). A mask_mod's region (traced by
    flashjit.mask_mods, or given as text) joins it (_lib.join_modifiers;
    make_spec gives it to the C API's spec.mask_mod). The tensors a
    function captures are dropped: compile() describes a kernel, which
    takes any data; running one needs _score_mod_and_captures."""
    return _score_mod_and_captures(score_mod, mask_mod)[0]


def _score_mod_and_captures(score_mod, mask_mod=None):
    """(text, captures): _score_mod's text and the tensors the traced
    functions capture (score_ops.trace_with_captures, then
    mask_mods.trace_mask_with_captures: a tuple, in the kernel's argument
    order; () for names, region text or None)."""
    text, captures = _score_text_and_captures(score_mod)
    if mask_mod is None:
        return text, captures
    if isinstance(mask_mod, str) and mask_mod.lstrip().startswith("{"):
        mask_text, mask_captures = mask_mod, ()
    else:
        mask_text, mask_captures = mask_mods.trace_mask_with_captures(mask_mod)
    return (_lib.join_modifiers(text, mask_text),
            captures + tuple(mask_captures))


def _score_text_and_captures(score_mod):
    """The score modifier's part of _score_mod_and_captures."""
    if score_mod is None:
        return "", ()
    if callable(score_mod):
        text, captures = score_ops.trace_with_captures(score_mod)
        return text, tuple(captures)
    if not isinstance(score_mod, str):
        raise TypeError("flashjit: score_mod must be a function of (score, "
                        "batch, head, q_idx, kv_idx), a str such as "
                        "'softcap:30' or 'alibi:16', or None; got "
                        f"{score_mod!r}")
    return score_mod, ()


# Integers up to this magnitude are exact in float32.
_F32_EXACT_INT = 1 << 24


def _host_captures(captures, fn="attention"):
    """The captured tensors as float32 C-contiguous numpy arrays (the CPU
    path's host data): numpy arrays, or torch tensors (copied to the
    host). ValueError for an integer past 2^24 (not exact in float32: two
    segment ids could compare equal)."""
    import numpy as np

    out = []
    for n, c in enumerate(captures):
        if _is_torch(c):
            c = c.detach().cpu()
            if c.dtype.is_floating_point:
                c = c.float()  # bfloat16 and float8 have no numpy dtype
            c = c.numpy()
        a = np.asarray(c)
        check_exact_integers(a, n, fn)
        out.append(np.ascontiguousarray(a, dtype=np.float32))
    return out


def check_exact_integers(a, n, fn="attention"):
    """ValueError if the integer array a (captured tensor n) holds a value
    past 2^24 in magnitude, which float32 does not hold exactly."""
    if a.dtype.kind in "iu" and a.size:
        hi, lo = int(a.max()), int(a.min())
        bad = hi if hi > _F32_EXACT_INT else lo
        if hi > _F32_EXACT_INT or lo < -_F32_EXACT_INT:
            raise ValueError(
                f"flashjit.{fn}: captured tensor {n} holds the integer "
                f"{bad}, which float32 (the kernel's type of captured data) "
                "does not hold exactly (|x| <= 2^24 is exact)")


def _captured_args(arrays):
    """(ctypes array, count, keep) of float32 host arrays for the C API."""
    caps, count = _lib.make_captured([(a.ctypes.data, a.size)
                                      for a in arrays])
    return caps, count, arrays


# -- numpy: the CPU path ----------------------------------------------------


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


def attention_backward(q, k, v, o, d_o, lse, causal=False, scale=None,
                       window=None, block_mask=None, deterministic=False,
                       score_mod=None, mask_mod=None, sinks=None,
                       capture_grads=False):
    """dq, dk, dv of attention(q, k, v, ...) for the upstream gradient d_o,
    recomputed from the forward's o and lse (return_lse=True), on the CPU
    for numpy arrays (the same dtypes as attention's numpy path). dk and dv
    are summed over each GQA group. dq: by atomic adds into an fp32 buffer
    (default; its last bits may vary run to run), or with deterministic=True
    by a separate pass over Q blocks, bit-identical run to run. (torch CUDA
    tensors get their backward from autograd: attention(...).backward().)
    With sinks (o and lse then attention(..., sinks=)'s): (dq, dk, dv,
    dsinks). A score_mod or mask_mod that captures tensors reads the same
    data as the forward did (pass the same function and tensors).

    capture_grads: False (default): the captured tensors are constants.
    True: one more element at the end, a list with one entry per captured
    tensor in the region's order (first use while tracing;
    score_ops.trace_with_captures lists them): d loss / d tensor, shaped as
    the tensor and of its dtype (a numpy array; a torch tensor for a
    captured torch tensor), computed by the compiler's derivative of the
    region at each read and summed by atomic adds (float32; with
    deterministic=True in 64-bit fixed point, two words 2^-56 apart from
    2^38, so the same bits run to run); None for an integer or bool tensor
    (segment ids: no gradient). So (dq, dk, dv[, dsinks], [d_capture,
    ...]); [] when nothing is captured."""
    mask, wl, wr = _mask_and_window(causal, window)
    if sinks is not None:
        sinks_mod.check_sinks(sinks, q.shape[1], "attention_backward")
    text, captures = _score_mod_and_captures(score_mod, mask_mod)
    # A mask_mod's captured tensors (the last ones) take no gradient.
    masked = _lib.mask_capture_count(text)
    wanted = ([_differentiable_capture(c) and n < len(captures) - masked
               for n, c in enumerate(captures)]
              if capture_grads else None)
    dq, dk, dv, cgrads = _backward_numpy(
        q, k, v, o, d_o, lse, mask, _scale(scale), wl, wr, _block(block_mask),
        deterministic, text, captures, wanted)
    grads = (dq, dk, dv)
    if sinks is not None:
        grads += (sinks_mod.sink_grad_numpy(o, d_o, lse, sinks),)
    if capture_grads:
        grads += ([None if g is None else _grad_like(g, c)
                   for g, c in zip(cgrads, captures)],)
    return grads


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
    args = (_lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec),
            *(ctypes.byref(x) for x in t[:5]),
            lse.ctypes.data_as(ctypes.c_void_p),
            *(ctypes.byref(x) for x in t[5:]), scale, wl, wr,
            ctypes.byref(layout) if layout is not None else None, None, 0)
    cgrads = [None] * len(captures)
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
        _lib.check(_lib.lib().flashjit_backward_captured(
            *args, caps, count, None))
        del host, caps
    else:
        _lib.check(_lib.lib().flashjit_backward(*args, None))
    del keep
    return tuple(from_kernel(g) for g in grads) + (cgrads,)


# -- torch: the ops of flashjit.ops ---------------------------------------
# (flashjit/_torch_impl.py runs them; both modules import torch.)


def _forward_cuda(torch, q, k, v, mask, scale, wl, wr, bm):
    """(o, lse) of torch CUDA tensors (tests call it directly)."""
    from . import _torch_impl

    return _torch_impl.forward_cuda(q, k, v, mask, scale, wl, wr, bm)


def _backward_cuda(torch, q, k, v, o, lse, d_o, mask, scale, wl, wr, bm,
                   deterministic):
    """(dq, dk, dv) of torch CUDA tensors (tests call it directly)."""
    from . import _torch_impl

    return _torch_impl.backward_cuda(q, k, v, o, lse, d_o, mask, scale, wl,
                                     wr, bm, deterministic)[:3]


def _cuda_handle(device):
    from . import _torch_impl

    return _torch_impl.cuda_handle(
        device.index if device.index is not None else 0)


def _attention_torch(q, k, v, mask, scale, wl, wr, bm, return_lse,
                     deterministic, score_mod="", sinks=None, captures=()):
    from . import ops

    o, lse = ops.attention(q, k, v, mask, scale, wl, wr, bm, deterministic,
                           score_mod, sinks, captures)
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------------------
# compile(): inspecting a kernel
# ---------------------------------------------------------------------------

_DTYPE_NAMES = {"bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16,
                "fp16": _lib.DTYPE_FP16, "float16": _lib.DTYPE_FP16}


class Kernel:
    """A kernel description; its stages are compiled on demand.

    .ptx          PTX for .arch (None: the current GPU's, else sm_90a)
    .emit(stage)  "attn", "tile" (or "tiled"), "gpu", "llvm", "ptx" or "cpu-llvm" text
    .config(...)  the tiling flashjit chooses for a problem
    """

    def __init__(self, spec, arch):
        self._spec = spec
        self.arch = arch

    @property
    def spec(self):
        s = self._spec
        return {"head_dim_qk": s.head_dim_qk, "head_dim_v": s.head_dim_v,
                "dtype": "bf16" if s.dtype == _lib.DTYPE_BF16 else "fp16",
                "mask": ("none", "causal", "sliding_window")[s.mask],
                "gqa": s.gqa,
                "sparse_block": s.sparse_block if s.block_sparse else None,
                "backward": bool(s.direction),
                "deterministic": bool(s.deterministic),
                "score_mod": s.score_mod.decode() if s.score_mod else None}

    def _handle(self):
        if self.arch is None:  # the current GPU's arch, if there is one
            try:
                return _lib.handle(_lib.DEVICE_CUDA)
            except (NoDriverError, CudaError):
                pass
        return _lib.handle(_lib.DEVICE_CPU)

    def emit(self, stage):
        lib = _lib.lib()
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        arch = self.arch.encode() if self.arch else None
        _lib.check(lib.flashjit_emit(self._handle(), ctypes.byref(self._spec),
                                     stage.encode(), arch, ctypes.byref(out),
                                     ctypes.byref(n)))
        try:
            return ctypes.string_at(out, n.value).decode("utf-8", "replace")
        finally:
            lib.flashjit_free(out)

    @property
    def ptx(self):
        return self.emit("ptx")

    def config(self, batch=1, heads=None, seq_len=128, seq_len_kv=None,
               device="cpu"):
        """{"block_m", "block_n", "warps", "stages"} for a problem."""
        heads = self._spec.gqa if heads is None else heads
        seq_len_kv = seq_len if seq_len_kv is None else seq_len_kv
        sizes = [_lib.int64(n, x) for n, x in (
            ("batch", batch), ("heads", heads), ("seq_len", seq_len),
            ("seq_len_kv", seq_len_kv))]
        out = (ctypes.c_int64 * 4)()
        h = _lib.handle(_lib.DEVICE_CUDA if device == "cuda" else _lib.DEVICE_CPU)
        _lib.check(_lib.lib().flashjit_chosen_config(
            h, ctypes.byref(self._spec), *sizes, out))
        return dict(zip(("block_m", "block_n", "warps", "stages"), list(out)))

    def __repr__(self):
        return f"flashjit.Kernel({self.spec}, arch={self.arch!r})"


def compile(head_dim, head_dim_v=None, dtype="bf16", causal=False,
            sliding_window=False, gqa=1, sparse_block=None, arch=None,
            backward=False, deterministic=False, score_mod=None,
            mask_mod=None, varlen=False):
    """Describes a kernel; read its .ptx or .emit(stage). Validation
    (head dims 1..512, ...) happens here: InvalidArgumentError names the
    field. sparse_block: an int for a block-sparse kernel. arch: "sm_80",
    "sm_90a", ... (None: the current GPU's, else sm_90a). backward: the
    backward's kernels (preprocess, dK/dV, dQ) and tiling instead;
    deterministic (with backward=True): dQ by a separate pass instead of
    atomic adds. score_mod: a score modifier, as attention's (a function,
    traced, or a name; its region is in .emit("attn")); mask_mod: a mask
    function, as attention's. varlen: the variable-length kernel that
    attention_varlen runs (its tiled functions read the sequences'
    offsets); not with sparse_block."""
    if deterministic and not backward:
        raise ValueError("flashjit.compile: deterministic needs backward=True "
                         "(it chooses how the backward sums dQ)")
    if isinstance(dtype, str):
        if dtype not in _DTYPE_NAMES:
            raise TypeError(f"flashjit.compile: dtype must be bf16 or fp16, "
                            f"got {dtype!r}")
        dt = _DTYPE_NAMES[dtype]
    else:  # a torch or numpy dtype
        name = str(dtype).replace("torch.", "")
        if name not in _DTYPE_NAMES:
            raise TypeError(f"flashjit.compile: dtype must be bf16 or fp16, "
                            f"got {dtype!r}")
        dt = _DTYPE_NAMES[name]
    if causal and sliding_window:
        raise ValueError("flashjit.compile: causal and sliding_window are "
                         "exclusive")
    mask = (_lib.MASK_CAUSAL if causal else
            _lib.MASK_SLIDING_WINDOW if sliding_window else _lib.MASK_NONE)
    text = _score_mod(score_mod, mask_mod)
    spec = _lib.make_spec(head_dim, head_dim if head_dim_v is None else head_dim_v,
                          dt, mask, gqa, sparse_block or 0, backward=backward,
                          deterministic=deterministic,
                          score_mod=text, varlen=varlen)
    # Validate now: chosen_config checks the spec on the CPU handle (with
    # alibi:H's H heads, the only count it allows).
    heads = max(1, spec.gqa)
    name, _, arg = text.partition(":")
    if name == "alibi" and arg.isdigit() and int(arg) % heads == 0:
        heads = int(arg)
    out = (ctypes.c_int64 * 4)()
    _lib.check(_lib.lib().flashjit_chosen_config(
        _lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec), 1, heads, 1, 1,
        out))
    return Kernel(spec, arch)
