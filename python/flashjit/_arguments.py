"""The argument handling shared by flashjit's entry points (attention,
attention_backward, compile, the varlen functions in flashjit.varlen and
the torch ops of flashjit.ops): mask and window, q / k / v shapes and the
GQA group, scale, block masks; score_mod and mask_mod as the C API takes
them (names, region text, or functions traced by flashjit.score_ops and
flashjit.mask_mods) with the tensors they capture; and the captured
tensors' float32 host copies for the CPU execution mode.

The package re-exports every name here (flashjit._block, from . import
_host_captures, ...): the other modules and the tests use them from there.
"""

import operator
import sys

from . import _lib
from . import mask_mods
from . import score_ops
from .block_mask import BlockMask


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


# -- score_mod and mask_mod: text and captured tensors -------------------


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
        mask_text, mask_captures = _traced(mask_mod,
                                           mask_mods.trace_mask_with_captures)
    return (_lib.join_modifiers(text, mask_text),
            captures + tuple(mask_captures))


def _traced(fn, trace):
    """trace(fn) as (text, captures tuple). A function every call traces
    the same way, a fixed variant of flashjit.variants (_named: its trace
    depends only on what it was made with), is traced once: the trace is
    kept on the function and reused while each captured tensor keeps its
    shape and dtype (the text's indexing depends on them; the data is read
    at each call). Any other function is traced on every call, since it
    may read state that changed since the last."""
    if not score_ops._is_traced_once(fn):
        text, captures = trace(fn)
        return text, tuple(captures)
    kept = getattr(fn, "_flashjit_trace", None)
    if kept is not None and kept[2] == _capture_guards(kept[1]):
        return kept[0], kept[1]
    text, captures = trace(fn)
    captures = tuple(captures)
    fn._flashjit_trace = (text, captures, _capture_guards(captures))
    return text, captures


def _capture_guards(captures):
    """What a kept trace depends on in its captured tensors: their shapes
    and dtypes."""
    return tuple((tuple(c.shape), str(c.dtype)) for c in captures)


def _score_text_and_captures(score_mod):
    """The score modifier's part of _score_mod_and_captures."""
    if score_mod is None:
        return "", ()
    if callable(score_mod):
        return _traced(score_mod, score_ops.trace_with_captures)
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
