"""flashjit.score_ops: score modifiers written as Python functions, traced into attn IR.

A score modifier is a function ``fn(score, batch, head, q_idx, kv_idx)``
of the scaled score ``score = scale * q.k`` (a float) and the integer
positions of the score (its batch, query head, query row and key row,
0-based), returning the modified score, as FlexAttention's ``score_mod``::

    softcap = lambda s, b, h, i, j: 30 * score_ops.tanh(s / 30)
    bias = lambda s, b, h, i, j: s - 0.1 * abs(i - j)

``trace(fn)`` calls ``fn`` once with proxy values that record each
operation and returns the ``score_mod`` region of the attn dialect as text
(the C API compiles it: the tiling passes inline it on every score tile,
and the backward's derivative is derived by the compiler). The same
function evaluated on numpy float64 arrays (or torch tensors) is the
float64 reference of the tests.

What a modifier may use: ``+ - * / //  %`` and unary ``-`` and ``abs`` on
the proxies and Python numbers; comparisons (``< <= > >= == !=``), which
give predicates combined with ``& | ~``; and the functions of
``flashjit.score_ops`` (``tanh exp exp2 log log2 sqrt sin cos minimum
maximum where``; numpy's ufuncs of the same names, ``np.where`` and, when
torch is imported, ``torch``'s, dispatch to them). Float values are f32 in
the kernel; integers are 32-bit (an integer mixed with a float becomes a
float). A predicate has no truth value during tracing (``if i > j`` is a
TypeError: write ``where(i > j, a, b)``).

Captured tensors
----------------
A modifier (or a mask_mod) may read tensors it closes over, indexed by
the positions, as FlexAttention's do::

    bias = torch.randn(H, Nq, Nkv, device="cuda")      # a learned bias
    slopes = torch.rand(H, device="cuda")               # a slope per head
    seg = torch.tensor([0, 0, 0, 1, 1, 2, ...])        # document ids
    lambda s, b, h, i, j: s + bias[h, i, j]
    lambda s, b, h, i, j: s + slopes[h] * (j - i)
    lambda s, b, h, i, j: where(seg[i] == seg[j], s, -float("inf"))

torch tensors are captured where they are indexed with a traced position
(``trace`` wraps ``torch.Tensor.__getitem__`` while it runs, and restores
it after). numpy's ``ndarray.__getitem__`` cannot be wrapped: wrap a numpy
array (or anything ``numpy.asarray`` takes; torch tensors too) with
``captured(array)``, which indexes as the array does outside tracing::

    slopes = score_ops.captured(np.array([0.5, 0.25, 0.125, 0.0625]))
    lambda s, b, h, i, j: s + slopes[h] * (j - i)

Each index is an integer position (``b h i j`` and integer arithmetic on
them, e.g. ``j - i + Nq - 1``) or a Python int (negative ints count from
the end, as in Python; checked at trace time); every dimension is indexed
(no slices), and a dimension of size 1 broadcasts (it is read at 0
whatever its index). A tensor of one element may also be used as a number
(``s * temperature``). The region reads the tensor as flat float32 at
``sum(index_d * stride_d)``, the C-contiguous strides of its float32 copy
on q's device (made at each call; none when the tensor already is one);
integers are exact up to 2^24 (checked where the data is on the host).
The same tensor object indexed several times is one captured tensor; a
region takes at most 8 (MAX_CAPTURES). The kernel evaluates the region
at the problem's positions only, so an index in range for every (b, h,
i, j) of the problem stays in range. An index that is not (a negative
position, or one past the tensor) is an out-of-bounds read in the kernel
on either device: undefined, and nothing checks it at run time. Check the
index arithmetic against a float64 reference, the same function evaluated
on numpy arrays, whose indexing raises IndexError. A captured element has
no Python value during tracing (``if bias[h, i, j] > 0`` and
``float(bias[h, i, j])`` are TraceErrors: use ``where``).

``trace(fn)`` returns the region's text (its arguments after kv_idx are
``%c0: memref<?xf32>, ...``, one per captured tensor, in first-use order,
read by ``memref.load``); ``trace_with_captures(fn)`` returns ``(text,
tensors)``, the captured tensors (the objects given) in that order.
``flashjit.attention(q, k, v, score_mod=fn)`` passes them to the kernel
(``flashjit_forward_captured``; plans are not used for such calls). The
backward (``flashjit_backward_captured``) gives dq, dk and dv, and the
gradients of captured tensors: torch's autograd reaches each captured
torch tensor that requires grad (a learned bias, slopes, a temperature;
through the float32 copy, so the gradient comes back in the tensor's own
dtype, device and shape); numpy's ``attention_backward(...,
capture_grads=True)`` returns them as a list (first-use order, None for
integer or bool data). The compiler derives them from the region (the
derivative of the modified score at each captured read, times d loss /
d score, added into a zeroed float32 buffer of the tensor's size by
atomic adds, whose order varies; with deterministic=True in 64-bit fixed
point, the same bits run to run). A ``captured(array)`` indexed with
ints only inside the traced function (``temp[0]``) is a captured read as
well, not its value baked into the region. A capturing modifier under
torch.compile is untested (tracing wraps a torch method while it runs).
"""

import contextlib
import operator
import struct
import sys
import threading

# The traced values, captured(), tanh ... where and what they share are
# in flashjit._traced_values and flashjit._trace_common (imported here:
# every name stays importable from flashjit.score_ops); this module holds
# the tracer, the torch indexing hook and trace() with what builds on it.
from ._trace_common import (  # noqa: F401  (re-exported)
    MAX_CAPTURES, TraceError, _F32, _I1, _INDEX, _PREDICATES, _TORCH_REAL,
    _active_tracer, _check_capturable, _f32_hex, _is_numpy_scalar,
    _is_torch_tensor, _numel, _tracing, _tracing_with)
from ._traced_values import (  # noqa: F401  (re-exported)
    _BINARY, _TORCH, _TORCH_DUNDERS, _TORCH_NAMES, _UFUNCS, Captured,
    _Value, _eager, _minmax, _on_traced, _reflected, _traced, _traced_index,
    _unary, captured, cos, exp, exp2, log, log2, maximum, minimum, sin, sqrt,
    tanh, where)

__all__ = ["trace", "trace_with_captures", "trace_once", "captured",
           "Captured", "TraceError", "named", "with_mask", "tanh", "exp",
           "exp2",
           "log", "log2", "sqrt", "sin", "cos", "minimum", "maximum", "where",
           "MAX_CAPTURES"]


def _what(shape):
    """A captured tensor, as load()'s errors name it."""
    return f"a captured tensor of shape {shape}"


class _Tracer:
    """The region under construction: its lines, a counter of names and
    the tensors it captures (in first-use order; ids: id(tensor) -> its
    position, the same object is captured once)."""

    def __init__(self):
        self.lines = []
        self.count = 0
        self.constants = {}
        self.captures = []
        self.capture_ids = {}
        self.layouts = {}  # id(tensor): load()'s (n, shape, strides)

    def capture(self, tensor):
        """The position of ``tensor`` among the region's captured tensors
        (%c<n>), added on its first use."""
        n = self.capture_ids.get(id(tensor))
        if n is not None:
            return n
        _check_capturable(tensor)
        if len(self.captures) >= MAX_CAPTURES:
            raise TraceError(
                f"flashjit.score_mod: a region captures at most "
                f"{MAX_CAPTURES} tensors; this one indexes more (the same "
                "tensor object indexed twice counts once: concatenate "
                "small tables into one)")
        n = len(self.captures)
        self.captures.append(tensor)  # keeps it alive: its id stays unique
        self.capture_ids[id(tensor)] = n
        return n

    def load(self, tensor, index):
        """tensor[index] as an f32 value: a memref.load of the captured
        tensor at the flat index sum(index_d * stride_d) (C-contiguous
        strides; a dimension of size 1 is read at 0)."""
        layout = self.layouts.get(id(tensor))
        if layout is None:
            layout = self._layout(tensor)
        n, shape, strides = layout
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) != len(shape):
            raise TraceError(
                f"flashjit.score_mod: {_what(shape)} indexed with "
                f"{len(index)} indices: give one per dimension "
                f"({len(shape)}), each a position (b, h, i, j, integer "
                "arithmetic on them) or an int; slices, None and ... are "
                "not supported")
        offset = 0
        flat = None
        for d, (x, size, stride) in enumerate(zip(index, shape, strides)):
            if isinstance(x, _Value):
                if x._t is not self:
                    raise TraceError("flashjit.score_mod: values of two "
                                     "traces mixed")
                if x._type != _INDEX:
                    raise TraceError(
                        f"flashjit.score_mod: {_what(shape)} indexed "
                        f"(dimension {d}) with a "
                        f"{'predicate' if x._type == _I1 else 'float'}"
                        "; an index is an integer position (b, h, i, j or "
                        "integer arithmetic on them)")
                if size == 1:
                    continue  # broadcast: read at 0
                term = x if stride == 1 else x * stride
                flat = term if flat is None else flat + term
                continue
            if isinstance(x, bool) or type(x).__name__ in ("bool_", "bool"):
                raise TraceError(f"flashjit.score_mod: {_what(shape)} indexed "
                                 f"with the bool {x!r} (dimension {d})")
            try:
                c = operator.index(x)
            except TypeError:
                raise TraceError(
                    f"flashjit.score_mod: {_what(shape)} indexed with {x!r} "
                    f"(dimension {d}); an index is a position (b, h, i, j, "
                    "integer arithmetic on them) or an int") from None
            if c < 0:
                c += size
            if not 0 <= c < size:
                raise TraceError(f"flashjit.score_mod: index {x!r} is out of "
                                 f"range for dimension {d} of {_what(shape)}")
            offset += (0 if size == 1 else c) * stride
        if flat is None:
            flat = self.emit("arith.constant %d : index" % offset, _INDEX)
        elif offset:
            flat = flat + offset
        return self.emit("memref.load %%c%d[%s] : memref<?xf32>"
                         % (n, flat._name), _F32)

    def _layout(self, tensor):
        """(n, shape, strides) of a tensor's first load in this trace: its
        capture position, its shape and C-contiguous strides (kept per
        tensor: a function that reads it twice pays once)."""
        n = self.capture(tensor)
        shape = tuple(int(d) for d in tensor.shape)
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        layout = self.layouts[id(tensor)] = (n, shape, tuple(strides))
        return layout

    def emit(self, text, type_):
        if text.startswith("arith.constant"):  # each constant once
            if text not in self.constants:
                self.constants[text] = self._emit(text, type_)
            return self.constants[text]
        return self._emit(text, type_)

    def _emit(self, text, type_):
        name = "%%v%d" % self.count
        self.count += 1
        self.lines.append("    %s = %s" % (name, text))
        return _Value(self, name, type_)


# trace()'s wrapping of torch.Tensor.__getitem__: nested and concurrent
# traces share one wrapper (a depth count under a lock); the original is
# restored when the last trace ends.
_patch_lock = threading.Lock()
_patch_depth = 0
_patch_saved = None
_MISSING = object()


def _install_torch_getitem(torch):
    cls = torch.Tensor
    own = cls.__dict__.get("__getitem__", _MISSING)
    original = cls.__getitem__

    def __getitem__(self, index):
        v = _traced_index(index)
        if v is None:
            return original(self, index)
        return v._t.load(self, index)

    __getitem__.__doc__ = ("torch.Tensor.__getitem__, wrapped while "
                           "flashjit.score_ops.trace runs: an index with a "
                           "traced position captures the tensor")
    cls.__getitem__ = __getitem__
    return own


def _restore_torch_getitem(torch, own):
    if own is _MISSING:
        del torch.Tensor.__getitem__
    else:
        torch.Tensor.__getitem__ = own


@contextlib.contextmanager
def _capturing_torch_indexing():
    """While it is entered, a torch tensor indexed with a traced position
    records a capture (torch.Tensor.__getitem__ wrapped; restored on exit,
    also on errors). Nothing when torch is not imported."""
    global _patch_depth, _patch_saved
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    with _patch_lock:
        if _patch_depth == 0:
            _patch_saved = _install_torch_getitem(torch)
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                _restore_torch_getitem(torch, _patch_saved)
                _patch_saved = None


def trace(fn):
    """The score_mod region of ``fn(score, batch, head, q_idx, kv_idx)``
    as attn-dialect text (``{ ^bb0(...): ... attn.yield %v : f32 }``).
    Raises TraceError (a TypeError) for what cannot be traced. A function
    that indexes tensors gives a region with one ``memref<?xf32>``
    argument per captured tensor: the text alone cannot run (the C API
    refuses a capturing region without its tensors); use
    trace_with_captures for the tensors too."""
    return trace_with_captures(fn)[0]


def trace_once(fn):
    """``fn`` (a score_mod or mask_mod), marked to be traced once:
    flashjit.attention keeps its first trace on the function and reuses it
    while each tensor it captured keeps its shape and dtype (their data is
    read at every call), as it does for flashjit.variants. For a function
    whose trace depends only on what it closes over when marked: one that
    reads state that changes later (a rebound closure variable, a Python
    number it turns into a constant) would keep its old trace. Unmarked,
    a function is traced at every call (about 17 us for a document mask
    on this machine's CPU)::

        doc = score_ops.trace_once(lambda b, h, i, j: seg[i] == seg[j])
    """
    if not callable(fn):
        raise TypeError("flashjit.score_ops.trace_once: expected a function "
                        f"(a score_mod or mask_mod), got {fn!r}")
    fn._flashjit_fixed = True
    return fn


def _is_traced_once(fn):
    """Whether fn is marked to be traced once (trace_once, or a fixed
    flashjit.variants function)."""
    return getattr(fn, "_flashjit_fixed", False) is True


def trace_with_captures(fn):
    """``(text, tensors)``: trace(fn)'s region text and the tensors it
    captures, in the order of the region's ``%c0, %c1, ...`` arguments
    (the objects the function indexed: torch tensors, or the data of
    captured(...) wrappers; [] when it captures none). torch tensors
    are captured while this runs (torch.Tensor.__getitem__ is wrapped and
    then restored)."""
    if not callable(fn):
        raise TraceError(f"flashjit.score_mod: expected a function of "
                         f"(score, batch, head, q_idx, kv_idx), got {fn!r}")
    t = _Tracer()
    names = ("%s", "%b", "%h", "%i", "%j")
    args = [_Value(t, n, _F32 if n == "%s" else _INDEX) for n in names]
    out = _trace_call(fn, t, args, "flashjit.score_mod: tracing",
                     "a modifier takes (score, batch, head, q_idx, kv_idx); "
                     "see flashjit.score_ops's doc")
    if out is None or isinstance(out, (complex, str)):
        raise TraceError(f"flashjit.score_mod: {fn!r} returned {out!r}; a "
                         "modifier returns the modified score")
    v = args[0]._lift(out)._as_f32()
    return _region_text(t, "%s: f32, %b: index, %h: index, %i: index, "
                       "%j: index", v, "f32"), list(t.captures)


def _trace_call(fn, t, args, doing, takes):
    """fn(*args) traced into tracer t (torch tensors indexed meanwhile are
    captured); a TypeError of the call becomes a TraceError "<doing>
    <fn> failed: <error> (<takes>)"."""
    with _capturing_torch_indexing(), _tracing_with(t):
        try:
            return fn(*args)
        except TypeError as e:
            if isinstance(e, TraceError):
                raise
            raise TraceError(f"{doing} {fn!r} failed: {e} ({takes})") from e


def _region_text(t, params, result, type_):
    """The region tracer t built: ``{ ^bb0(<params>, %c0: memref<?xf32>,
    ...): <its lines> attn.yield <result> : <type_> }``, one captured
    tensor argument per tensor it captured."""
    body = "\n".join(t.lines)
    captures = "".join(", %%c%d: memref<?xf32>" % n
                       for n in range(len(t.captures)))
    return ("{\n  ^bb0(" + params + captures + "):\n"
            + (body + "\n" if body else "")
            + "    attn.yield %s : %s\n  }" % (result._name, type_))


def named(name):
    """The named score modifier ``name`` ("softcap:C", "alibi:H") as a
    function of (score, batch, head, q_idx, kv_idx), computed as the
    kernel's region computes it (f32 constants)."""
    kind, _, arg = name.partition(":")
    if kind == "softcap":
        cap = struct.unpack("<f", struct.pack("<f", float(arg)))[0]
        return lambda s, b, h, i, j: tanh(s / cap) * cap
    if kind == "alibi" and arg.isdigit() and int(arg) > 0:
        k = -8.0 / int(arg)
        return lambda s, b, h, i, j: s + exp2((h + 1) * k) * (j - i)
    raise ValueError(f"flashjit.score_mod: '{name}' is no named modifier "
                     "(softcap:C, alibi:H)")


def with_mask(score_mod, mask_mod):
    """One score modifier: ``score_mod``'s value (a function, a name, or
    None for the score itself) where ``mask_mod(batch, head, q_idx,
    kv_idx)`` holds, -inf where it does not (a row that keeps no key gives
    0 and lse -inf), folded into one score_mod region. attention's mask_mod=
    makes a mask_mod region instead (flashjit.mask_mods), which full blocks
    and per-block bounds skip; this is for a text that carries its mask."""
    if not callable(mask_mod):
        raise TraceError("flashjit.mask_mod: expected a function of (batch, "
                         f"head, q_idx, kv_idx), got {mask_mod!r}")
    if score_mod is None:
        base = None
    elif callable(score_mod):
        base = score_mod
    elif isinstance(score_mod, str) and not score_mod.lstrip().startswith("{"):
        base = named(score_mod)
    else:
        raise TraceError("flashjit.mask_mod: with a mask_mod, give score_mod "
                         "as a function or a name, not as region text")

    def masked(s, b, h, i, j):
        try:
            keep = mask_mod(b, h, i, j)
        except TypeError as e:
            if isinstance(e, TraceError):
                raise
            raise TraceError(f"flashjit.mask_mod: calling {mask_mod!r} "
                             f"failed: {e} (a mask takes (batch, head, "
                             "q_idx, kv_idx))") from e
        if isinstance(keep, _Value) and keep._type != _I1:
            raise TraceError("flashjit.mask_mod: a mask returns a predicate "
                             "(a comparison, or & | ~ of comparisons)")
        value = s if base is None else base(s, b, h, i, j)
        return where(keep, value, -float("inf"))

    return masked
