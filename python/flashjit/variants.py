"""flashjit.variants: named attention variants, each a score_mod or mask_mod.

Every function here returns a plain Python function in FlexAttention's
signatures, ``score_mod(score, batch, head, q_idx, kv_idx)`` or
``mask_mod(batch, head, q_idx, kv_idx)``, written with
``flashjit.score_ops``: ``flashjit.attention(q, k, v, score_mod=...,
mask_mod=...)`` traces it into the attn dialect's ``score_mod`` (or
``mask_mod``) region like any function of your own. No variant has kernel code of its own: the
compiler inlines the region on each score tile and derives its backward
(the gradients of the captured tensors too) from it. A variant is traced
on its first call only (its trace depends on nothing but what it was made
with; it is traced again when a captured tensor's shape or dtype changes,
and its tensors' data is read at every call), where a function of your
own is traced at every call::

    from flashjit import variants as V

    o = flashjit.attention(q, k, v, score_mod=V.softcap(30))
    o = flashjit.attention(q, k, v, score_mod=V.alibi(V.alibi_slopes(8)))
    o = flashjit.attention(q, k, v, score_mod=V.bias(table),
                           mask_mod=V.and_masks(V.causal(), V.document(seg)))

Tensors a variant reads (ALiBi slopes, a relative-position table, a bias,
segment ids) are captured tensors (``flashjit.score_ops``, "Captured
tensors"): numpy arrays, or torch tensors on any device, passed to the
kernel at each call as float32 copies on q's device. A float tensor is
trainable: torch's autograd reaches it when it requires grad, and numpy's
``flashjit.attention_backward(..., capture_grads=True)`` returns its
gradient (a list, one entry per captured tensor in the kernel's order,
score_mod's then mask_mod's; ``None`` for integer data such as segment
ids and for a mask_mod's tensors). Nothing checks an index
at run time: a tensor too small for the problem's (b, h, i, j) is an
out-of-bounds read (each function's doc says what size is needed; the
region reads it wherever the score is computed, masked or not).

The functions evaluate on numpy arrays (or torch tensors) of the
positions as well, as FlexAttention's do: ``create_block_mask(mask_mod,
B, H, Nq, Nkv)`` (``BlockMask.from_mask_mod``) evaluates a mask here on
numpy positions to find the blocks to skip; pass the block mask together
with the same mask_mod: ``attention(q, k, v, mask_mod=m,
block_mask=create_block_mask(m, B, H, Nq, Nkv))``; its full blocks (the
mask keeps them whole) are marked and skip the mask. Without one, a
mask_mod masks elements and every block is visited, but a mask of
positions only (causal, windows) is still skipped on the blocks it keeps
whole (the compiler bounds it per block).

Positions are absolute and top-left aligned, as FlexAttention's: query
``i`` and key ``j`` are rows ``i`` of q and ``j`` of k. flashjit's own
``causal=True`` and ``window=`` are bottom-right aligned (query ``i`` is
at key position ``i + Nkv - Nq``); the two agree when Nq == Nkv, where the
built-in options are also faster (no region, native block skipping).

Variants that are options rather than functions: attention sinks (one
learnable logit per query head in each softmax denominator, gpt-oss) are
``flashjit.attention(..., sinks=t)`` (flashjit.sinks); the named score
modifiers ``score_mod="softcap:C"`` and ``"alibi:H"`` are strings
(``softcap(C)`` compiles to the very kernel of ``"softcap:C"``: the
compiler canonicalises the traced region to that name).
"""

import math
import numbers
import operator
import struct

from . import score_ops as F

__all__ = ["softcap", "alibi", "alibi_slopes", "relative_position_bias",
           "bias", "causal", "sliding_window", "document", "and_masks",
           "or_masks"]

# Traced integer constants are 32-bit in the kernel.
_INT32_MAX = 2**31 - 1


def _named(fn, name, doc, fixed=True):
    """fn named and documented; fixed: its trace depends only on what the
    variant was made with (flashjit.attention then traces it once,
    _arguments._traced)."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn._flashjit_fixed = fixed
    return fn


def _all_fixed(mods):
    """Whether every mask in mods is a fixed variant (so their & or | is)."""
    return all(F._is_traced_once(m) for m in mods)


def _count(fn, what, x, allow_none=False):
    """x as an int in [0, 2^31 - 1] (None kept where allowed); TypeError
    for a non-integer (bool, 2.5), ValueError out of range."""
    if x is None and allow_none:
        return None
    if isinstance(x, bool):
        raise TypeError(f"flashjit.variants.{fn}: {what} must be an int, got "
                        f"{x!r}")
    try:
        n = operator.index(x)
    except TypeError:
        raise TypeError(f"flashjit.variants.{fn}: {what} must be an int"
                        f"{' or None' if allow_none else ''}, got {x!r}"
                        ) from None
    if not 0 <= n <= _INT32_MAX:
        raise ValueError(f"flashjit.variants.{fn}: {what} must be in [0, "
                         f"2^31 - 1] (positions are 32-bit in the kernel), "
                         f"got {n}")
    return n


def _tensor(fn, what, x, ranks):
    """x captured (score_ops.captured: numpy arrays and anything
    numpy.asarray takes are wrapped, torch tensors kept as they are); its
    rank must be one of ranks (ValueError), its data real numbers (a
    TypeError from score_ops)."""
    if isinstance(x, (numbers.Number, str)) or x is None:
        raise TypeError(f"flashjit.variants.{fn}: {what} must be a numpy "
                        f"array or a torch tensor, got {x!r}")
    t = F.captured(x)
    if t.ndim not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"flashjit.variants.{fn}: {what} must have {want} "
                         f"dimensions, got shape {t.shape}")
    return t


def _integer_data(fn, what, t):
    """TypeError unless the captured t holds integers or bools (segment
    ids compared for equality: float ids would be trainable nonsense)."""
    dtype = t.dtype
    if F._is_torch_tensor(t.data):
        ok = not (dtype.is_floating_point or dtype.is_complex)
    else:
        ok = getattr(dtype, "kind", None) in ("b", "i", "u")
    if not ok:
        raise TypeError(f"flashjit.variants.{fn}: {what} must hold integers "
                        f"(document ids), got dtype {dtype}")


# -- score modifiers ------------------------------------------------------


def softcap(cap):
    """score_mod ``cap * tanh(s / cap)``: logit soft-capping (Gemma 2,
    Grok): scores squashed into (-cap, cap).

    cap: a real number, > 0 and finite as a float32 (the kernel's
    constant); a constant of the kernel, so no captured tensor and no
    gradient of its own. The traced region canonicalises to the named
    modifier ``"softcap:C"`` (``flashjit.attention(...,
    score_mod="softcap:30")``): both spellings are one kernel. The
    backward's derivative is 1 - tanh^2(s / cap)."""
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real):
        raise TypeError("flashjit.variants.softcap: cap must be a real "
                        f"number (a constant of the kernel), got {cap!r}")
    c = float(cap)
    try:
        c32 = struct.unpack("<f", struct.pack("<f", c))[0]
    except OverflowError:
        c32 = math.inf
    if not (c > 0 and c32 > 0 and math.isfinite(c32)):
        raise ValueError("flashjit.variants.softcap: cap must be > 0 and "
                         f"finite as a float32, got {cap!r}")

    def score_mod(s, b, h, i, j):
        return c * F.tanh(s / c)

    return _named(score_mod, f"softcap_{c:g}",
                  f"{c:g} * tanh(s / {c:g}) (flashjit.variants.softcap)")


def alibi_slopes(heads, like=None):
    """The standard ALiBi slopes of ``heads`` query heads: ``slope_h =
    2^(-8 (h + 1) / heads)`` for h = 0 .. heads - 1 (the slopes of the
    named modifier ``"alibi:H"``; for a power of two, the ALiBi paper's;
    the paper's rule for other head counts interleaves two power-of-two
    series instead).

    like: None (default): a numpy float64 array of shape (heads,). A
    torch tensor: a float32 torch tensor on like's device (call
    ``.requires_grad_()`` on it to learn the slopes)."""
    n = _count("alibi_slopes", "heads", heads)
    if n < 1:
        raise ValueError("flashjit.variants.alibi_slopes: heads must be >= "
                         f"1, got {n}")
    if like is None:
        import numpy as np

        return np.exp2(-8.0 * np.arange(1, n + 1, dtype=np.float64) / n)
    if not F._is_torch_tensor(like):
        raise TypeError("flashjit.variants.alibi_slopes: like must be None "
                        "(a numpy array) or a torch tensor (a float32 "
                        f"tensor on its device), got {type(like).__name__}")
    import torch

    h = torch.arange(1, n + 1, dtype=torch.float64, device=like.device)
    return torch.exp2(-8.0 * h / n).to(torch.float32)


def alibi(slopes):
    """score_mod ``s + slopes[h] * (j - i)``: ALiBi with a slope per query
    head (with GQA the query head), top-left aligned as FlexAttention's
    (and ``"alibi:H"``): linear in j - i, so without a causal mask keys
    after the query get a positive bias (not -slope |i - j|).

    slopes: shape (H,) (H the query heads; (1,) shares one slope), a
    numpy array or torch tensor; ``alibi_slopes(H)`` gives the standard
    values. Captured tensor: slopes (one), trainable: its gradient is
    d loss / d slopes (torch autograd when it requires grad; numpy
    ``attention_backward(..., capture_grads=True)``). With the standard
    slopes the result equals ``score_mod="alibi:H"``, which bakes them
    into the kernel instead of reading them."""
    t = _tensor("alibi", "slopes", slopes, (1,))

    def score_mod(s, b, h, i, j):
        return s + t[h] * (j - i)

    return _named(score_mod, "alibi",
                  "s + slopes[h] * (j - i) (flashjit.variants.alibi)")


def relative_position_bias(table, max_distance=None):
    """score_mod ``s + table[h, j - i + N - 1]``: a learned bias per
    relative position (Shaw et al.; T5 without buckets), top-left aligned
    (``j - i`` the key's offset from the query).

    table: shape (H, L) (a row per query head; (1, L) or (L,) one row
    shared by all heads), a numpy array or torch tensor. Without
    max_distance: L = 2 N - 1 (odd), entry ``d + N - 1`` holds relative
    position d in [-(N - 1), N - 1]; it covers problems with Nq <= N and
    Nkv <= N (a larger one reads outside the table: undefined, unchecked
    at run time). With max_distance = D: the relative position is clipped
    to [-D, D] (every farther key shares the end entries) and L must be
    2 D + 1; any Nq, Nkv. Captured tensor: table (one), trainable: its
    gradient, shaped as the table, sums d loss / d score over the
    positions that read each entry (torch autograd; numpy
    ``attention_backward(..., capture_grads=True)``)."""
    t = _tensor("relative_position_bias", "table", table, (1, 2))
    length = t.shape[-1]
    if max_distance is None:
        if length % 2 != 1:
            raise ValueError("flashjit.variants.relative_position_bias: the "
                             "table's last dimension must be odd, 2 N - 1 "
                             "(relative positions -(N - 1) .. N - 1), got "
                             f"shape {t.shape}")
        offset = (length - 1) // 2
        clip = None
    else:
        clip = _count("relative_position_bias", "max_distance",
                      max_distance)
        if length != 2 * clip + 1:
            raise ValueError("flashjit.variants.relative_position_bias: with "
                             f"max_distance={clip} the table's last "
                             f"dimension must be {2 * clip + 1} (relative "
                             f"positions -{clip} .. {clip}), got shape "
                             f"{t.shape}")
        offset = clip
    shared = t.ndim == 1

    def score_mod(s, b, h, i, j):
        d = j - i
        if clip is not None:
            d = F.minimum(F.maximum(d, -clip), clip)
        return s + (t[d + offset] if shared else t[h, d + offset])

    return _named(score_mod, "relative_position_bias",
                  "s + table[h, j - i + offset] "
                  "(flashjit.variants.relative_position_bias)")


def bias(tensor):
    """score_mod ``s + tensor[b, h, i, j]``: an additive bias (an
    attention bias, a learned bias, a float mask with -inf entries).

    tensor: shape (B or 1, H or 1, Nq or 1, Nkv or 1); fewer dimensions
    are leading ones left out, as numpy broadcasting has it: (H, Nq, Nkv)
    is ``tensor[h, i, j]``, (Nq, Nkv) ``tensor[i, j]``. A dimension of
    size 1 broadcasts (read at 0; e.g. (1, H, 1, Nkv), a bias per key and
    head); the others must cover the problem (B, H query heads, Nq, Nkv;
    a smaller one reads outside it: undefined, unchecked). Captured
    tensor: tensor (one), trainable: its gradient is shaped as the
    tensor (summed over the broadcast dimensions; torch autograd,
    numpy ``attention_backward(..., capture_grads=True)``)."""
    t = _tensor("bias", "tensor", tensor, (2, 3, 4))
    rank = t.ndim

    def score_mod(s, b, h, i, j):
        return s + t[(b, h, i, j)[4 - rank:]]

    return _named(score_mod, "bias",
                  "s + tensor[b, h, i, j] (flashjit.variants.bias)")


# -- mask modifiers -------------------------------------------------------


def causal():
    """mask_mod ``i >= j``: query i sees keys 0 .. i, top-left aligned as
    FlexAttention's causal mask. flashjit's ``causal=True`` is
    bottom-right aligned (j <= i + Nkv - Nq): the same when Nq == Nkv,
    where ``causal=True`` is the faster spelling (native, blocks above
    the diagonal skipped without a block mask); with Nq < Nkv (decoding)
    this one hides the keys after position i from query i. No captured
    tensor."""
    def mask_mod(b, h, i, j):
        return i >= j

    return _named(mask_mod, "causal", "i >= j (flashjit.variants.causal)")


def sliding_window(left, right=0):
    """mask_mod ``(i - left <= j) & (j <= i + right)``: query i sees keys
    i - left .. i + right, top-left aligned. right=0 (default) is a
    causal sliding window of left + 1 keys. None on a side is unbounded
    (not both). flashjit's ``window=(left, right)`` is the same window
    bottom-right aligned (centred on i + Nkv - Nq), native and faster;
    the two agree when Nq == Nkv. left, right: ints >= 0 (or None). No
    captured tensor."""
    lo = _count("sliding_window", "left", left, allow_none=True)
    hi = _count("sliding_window", "right", right, allow_none=True)
    if lo is None and hi is None:
        raise ValueError("flashjit.variants.sliding_window: left and right "
                         "are both None (unbounded): that is no mask")

    def mask_mod(b, h, i, j):
        if lo is None:
            return j <= i + hi
        if hi is None:
            return j >= i - lo
        return (j >= i - lo) & (j <= i + hi)

    return _named(mask_mod, "sliding_window",
                  f"{'-inf' if lo is None else f'i - {lo}'} <= j <= "
                  f"{'inf' if hi is None else f'i + {hi}'} "
                  "(flashjit.variants.sliding_window)")


def document(segment_ids, kv_segment_ids=None):
    """mask_mod ``seg[i] == seg[j]``: document (packed sequence) masking,
    each query sees the keys of its own document (combine with
    ``causal()`` by ``and_masks``). With kv_segment_ids:
    ``segment_ids[i] == kv_segment_ids[j]``, for Nq != Nkv (e.g. decoding
    the last Nq positions: segment_ids = ids[-Nq:], kv_segment_ids =
    ids).

    segment_ids: shape (Nq,) (or longer), kv_segment_ids: (Nkv,); without
    kv_segment_ids, segment_ids covers both (at least max(Nq, Nkv)
    entries). Integer (or bool) numpy arrays or torch tensors, exact in
    float32 (|id| <= 2^24, checked at each call for host data). Captured
    tensors: one (the same ids for queries and keys) or two, with no
    gradient (integer data: None in capture_grads' list)."""
    qs = _tensor("document", "segment_ids", segment_ids, (1,))
    _integer_data("document", "segment_ids", qs)
    if kv_segment_ids is None:
        ks = qs
    else:
        ks = _tensor("document", "kv_segment_ids", kv_segment_ids, (1,))
        _integer_data("document", "kv_segment_ids", ks)

    def mask_mod(b, h, i, j):
        return qs[i] == ks[j]

    return _named(mask_mod, "document",
                  "segment_ids[i] == kv_segment_ids[j] "
                  "(flashjit.variants.document)")


def _mask_mods(fn, mods):
    for n, m in enumerate(mods):
        if not callable(m):
            raise TypeError(f"flashjit.variants.{fn}: argument {n} must be a "
                            "mask_mod, a function of (batch, head, q_idx, "
                            f"kv_idx), got {m!r}")
    return tuple(mods)


def and_masks(*mask_mods):
    """mask_mod keeping a key where every mask_mod keeps it (``&`` of
    their predicates), as FlexAttention's ``and_masks``; with none, every
    key. The captured tensors are those of the masks given."""
    mods = _mask_mods("and_masks", mask_mods)

    def mask_mod(b, h, i, j):
        if not mods:
            return j >= 0
        keep = mods[0](b, h, i, j)
        for m in mods[1:]:
            keep = keep & m(b, h, i, j)
        return keep

    return _named(mask_mod, "and_masks",
                  "& of %d masks (flashjit.variants.and_masks)" % len(mods),
                  _all_fixed(mods))


def or_masks(*mask_mods):
    """mask_mod keeping a key where any mask_mod keeps it (``|`` of their
    predicates), as FlexAttention's ``or_masks``; with none, no key. The
    captured tensors are those of the masks given."""
    mods = _mask_mods("or_masks", mask_mods)

    def mask_mod(b, h, i, j):
        if not mods:
            return j < 0
        keep = mods[0](b, h, i, j)
        for m in mods[1:]:
            keep = keep | m(b, h, i, j)
        return keep

    return _named(mask_mod, "or_masks",
                  "| of %d masks (flashjit.variants.or_masks)" % len(mods),
                  _all_fixed(mods))
