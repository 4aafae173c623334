"""Tracing a mask modifier into a mask_mod region.

``flashjit.attention(q, k, v, mask_mod=fn)`` takes a function
``fn(batch, head, q_idx, kv_idx) -> predicate`` (FlexAttention's
mask_mod): comparisons of the positions, ``&``, ``|`` and ``~`` of them,
and tensors indexed by the positions (captured, as in a score_mod). It is
traced, as a score_mod is (flashjit.score_ops), into the description's
mask_mod region:

    {
      ^bb0(%b: index, %h: index, %i: index, %j: index, %c0: memref<?xf32>):
        %v0 = memref.load %c0[%i] : memref<?xf32>
        %v1 = memref.load %c0[%j] : memref<?xf32>
        %v2 = arith.cmpf oeq, %v0, %v1 : f32
        attn.yield %v2 : i1
    }

which the kernel evaluates on each score tile: false makes the score -inf
after the score_mod (a row that keeps no key gives 0 and lse -inf). Its
captured tensors follow the score_mod's in the kernel's arguments and take
no gradient.
"""

from .score_ops import (TraceError, _I1, _INDEX, _Tracer, _Value,
                        _region_text, _trace_call)


def trace_mask_with_captures(fn):
    """``(text, tensors)``: the mask_mod region of ``fn(batch, head, q_idx,
    kv_idx)`` as attn-dialect text and the tensors it captures, in the
    order of the region's ``%c0, %c1, ...`` arguments. Raises TraceError
    (a TypeError) for what cannot be traced or a result that is no
    predicate."""
    if not callable(fn):
        raise TraceError("flashjit.mask_mod: expected a function of (batch, "
                         f"head, q_idx, kv_idx), got {fn!r}")
    t = _Tracer()
    args = [_Value(t, n, _INDEX) for n in ("%b", "%h", "%i", "%j")]
    keep = _trace_call(fn, t, args, "flashjit.mask_mod: calling",
                      "a mask takes (batch, head, q_idx, kv_idx)")
    if isinstance(keep, bool):  # a constant mask
        keep = args[0]._lift(keep)
    if not isinstance(keep, _Value) or keep._type != _I1:
        raise TraceError(f"flashjit.mask_mod: {fn!r} returned {keep!r}; a "
                         "mask returns a predicate (a comparison, or & | ~ "
                         "of comparisons)")
    return (_region_text(t, "%b: index, %h: index, %i: index, %j: index",
                        keep, "i1"), list(t.captures))
