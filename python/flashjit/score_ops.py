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

__all__ = ["trace", "trace_with_captures", "captured", "Captured",
           "TraceError", "named", "with_mask", "tanh", "exp", "exp2",
           "log", "log2", "sqrt", "sin", "cos", "minimum", "maximum", "where",
           "MAX_CAPTURES"]

# The C API's limit on the tensors one region captures.
MAX_CAPTURES = 8


class TraceError(TypeError):
    """A score modifier that cannot be traced into the attn dialect."""


def _f32_hex(x):
    """x as an f32 constant of MLIR's hex form (exact, also for inf/nan)."""
    return "0x%08X" % struct.unpack("<I", struct.pack("<f", float(x)))[0]


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
        shape = tuple(int(d) for d in tensor.shape)
        what = f"a captured tensor of shape {shape}"
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) != len(shape):
            raise TraceError(
                f"flashjit.score_mod: {what} indexed with {len(index)} "
                f"indices: give one per dimension ({len(shape)}), each a "
                "position (b, h, i, j, integer arithmetic on them) or an "
                "int; slices, None and ... are not supported")
        n = self.capture(tensor)
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        offset = 0
        flat = None
        for d, (x, size, stride) in enumerate(zip(index, shape, strides)):
            if isinstance(x, _Value):
                if x._t is not self:
                    raise TraceError("flashjit.score_mod: values of two "
                                     "traces mixed")
                if x._type != _INDEX:
                    raise TraceError(
                        f"flashjit.score_mod: {what} indexed (dimension "
                        f"{d}) with a {'predicate' if x._type == _I1 else 'float'}"
                        "; an index is an integer position (b, h, i, j or "
                        "integer arithmetic on them)")
                if size == 1:
                    continue  # broadcast: read at 0
                term = x if stride == 1 else x * stride
                flat = term if flat is None else flat + term
                continue
            if isinstance(x, bool) or type(x).__name__ in ("bool_", "bool"):
                raise TraceError(f"flashjit.score_mod: {what} indexed with "
                                 f"the bool {x!r} (dimension {d})")
            try:
                c = operator.index(x)
            except TypeError:
                raise TraceError(
                    f"flashjit.score_mod: {what} indexed with {x!r} "
                    f"(dimension {d}); an index is a position (b, h, i, j, "
                    "integer arithmetic on them) or an int") from None
            if c < 0:
                c += size
            if not 0 <= c < size:
                raise TraceError(f"flashjit.score_mod: index {x!r} is out of "
                                 f"range for dimension {d} of {what}")
            offset += (0 if size == 1 else c) * stride
        if flat is None:
            flat = self.emit("arith.constant %d : index" % offset, _INDEX)
        elif offset:
            flat = flat + offset
        return self.emit("memref.load %%c%d[%s] : memref<?xf32>"
                         % (n, flat._name), _F32)

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


_F32, _INDEX, _I1 = "f32", "index", "i1"

# Comparison predicates: Python operator -> (cmpf, cmpi) predicate.
_PREDICATES = {"lt": ("olt", "slt"), "le": ("ole", "sle"),
               "gt": ("ogt", "sgt"), "ge": ("oge", "sge"),
               "eq": ("oeq", "eq"), "ne": ("une", "ne")}


class _Value:
    """A traced value: an SSA name in the region and its type."""

    __array_priority__ = 1000  # numpy defers its operators to ours

    def __init__(self, tracer, name, type_):
        self._t = tracer
        self._name = name
        self._type = type_

    # -- conversions ------------------------------------------------------

    def _lift(self, other):
        """other (a _Value or a Python number) as a _Value."""
        if isinstance(other, _Value):
            if other._t is not self._t:
                raise TraceError("flashjit.score_mod: values of two traces "
                                 "mixed")
            return other
        if isinstance(other, bool):
            return self._t.emit("arith.constant %s" % str(other).lower(), _I1)
        if isinstance(other, int):
            if not -2**31 <= other < 2**31:
                raise TraceError(f"flashjit.score_mod: the integer {other} "
                                 "does not fit in 32 bits (positions are "
                                 "32-bit in the kernel)")
            return self._t.emit("arith.constant %d : index" % other, _INDEX)
        if isinstance(other, float):
            return self._t.emit("arith.constant %s : f32" % _f32_hex(other),
                                _F32)
        if _is_numpy_scalar(other):  # np.float32(0.5), np.int64(3)
            return self._lift(other.item())
        if isinstance(other, Captured):
            other = other.data
        if hasattr(other, "shape"):
            size = _numel(other)
            if size == 1:  # a one-element tensor used as a number
                return self._t.load(other, (0,) * len(other.shape))
            raise TraceError(
                "flashjit.score_mod: a tensor of shape "
                f"{tuple(getattr(other, 'shape', ()))} used as a number; "
                "index it with the positions (bias[h, i, j]; numpy arrays "
                "through flashjit.score_ops.captured(array)), or use a "
                "one-element tensor")
        raise TraceError(f"flashjit.score_mod: cannot use {other!r} "
                         f"({type(other).__name__}) in a score modifier")

    def _as_f32(self):
        if self._type == _F32:
            return self
        if self._type == _I1:
            raise TraceError("flashjit.score_mod: a predicate (a comparison) "
                             "used as a number; use where(pred, a, b)")
        i32 = self._t.emit("arith.index_cast %s : index to i32" % self._name,
                           "i32")
        return self._t.emit("arith.sitofp %s : i32 to f32" % i32._name, _F32)

    def _pair(self, other):
        """(self, other) lifted to one type: f32 if either is a float (a
        Python number beside a float is an f32 constant)."""
        if (self._type == _F32 and isinstance(other, int)
                and not isinstance(other, bool)):
            other = float(other)
        o = self._lift(other)
        a = self
        if _I1 in (a._type, o._type):
            raise TraceError("flashjit.score_mod: arithmetic on a predicate "
                             "(a comparison); use where(pred, a, b)")
        if a._type != o._type:
            a, o = a._as_f32(), o._as_f32()
        return a, o

    def __bool__(self):
        raise TraceError("flashjit.score_mod: a traced value has no truth "
                         "value (Python's if / and / or / min / max see "
                         "one); use flashjit.score_ops.where, minimum, "
                         "maximum and & | ~ on predicates")

    def __index__(self):
        raise TraceError("flashjit.score_mod: a traced position cannot "
                         "index a Python list or tuple; capture a table as "
                         "an array: flashjit.score_ops.captured(np.asarray("
                         "table))[i]")

    def __array__(self, *args, **kwargs):
        # numpy converts an index it does not know to an array: a numpy
        # array indexed with a position lands here.
        raise TraceError("flashjit.score_mod: a traced value used as a "
                         "numpy array (a numpy array indexed with a "
                         "position?); numpy arrays are captured through "
                         "flashjit.score_ops.captured(array)[h, i, j]")

    def _no_value(self, *args):
        raise TraceError("flashjit.score_mod: a traced value (the score, a "
                         "position or a captured tensor's element) has no "
                         "Python value during tracing (float(), int(), "
                         "if ...); use flashjit.score_ops.where, minimum, "
                         "maximum")

    __float__ = __int__ = __complex__ = _no_value

    # -- arithmetic -------------------------------------------------------

    def _operands(self, other, reverse):
        """(self, other) of one type (_pair), in the operator's order: the
        reflected operators (__radd__, ...) have the other value first."""
        a, b = self._pair(other)
        return (b, a) if reverse else (a, b)

    def _binary(self, other, fop, iop, reverse=False):
        a, b = self._operands(other, reverse)
        op = fop if a._type == _F32 else iop
        return self._t.emit("%s %s, %s : %s" % (op, a._name, b._name,
                                                 a._type), a._type)

    def __add__(self, o):
        return self._binary(o, "arith.addf", "arith.addi")

    def __radd__(self, o):
        return self._binary(o, "arith.addf", "arith.addi", True)

    def __sub__(self, o):
        return self._binary(o, "arith.subf", "arith.subi")

    def __rsub__(self, o):
        return self._binary(o, "arith.subf", "arith.subi", True)

    def __mul__(self, o):
        return self._binary(o, "arith.mulf", "arith.muli")

    def __rmul__(self, o):
        return self._binary(o, "arith.mulf", "arith.muli", True)

    def _truediv(self, o, reverse):
        a, b = self._operands(o, reverse)
        a, b = a._as_f32(), b._as_f32()  # Python's / is a float division
        return self._t.emit("arith.divf %s, %s : f32" % (a._name, b._name),
                            _F32)

    def __truediv__(self, o):
        return self._truediv(o, False)

    def __rtruediv__(self, o):
        return self._truediv(o, True)

    def _floordiv(self, o, reverse):
        a, b = self._operands(o, reverse)
        if a._type == _F32:
            q = a._t.emit("arith.divf %s, %s : f32" % (a._name, b._name), _F32)
            return a._t.emit("math.floor %s : f32" % q._name, _F32)
        return a._t.emit("arith.floordivsi %s, %s : index" % (a._name,
                                                               b._name), _INDEX)

    def __floordiv__(self, o):
        return self._floordiv(o, False)

    def __rfloordiv__(self, o):
        return self._floordiv(o, True)

    def _mod(self, o, reverse):
        # Python's a % b = a - (a // b) * b (the sign of b), for both types.
        a, b = self._operands(o, reverse)
        return a - a._floordiv(b, False) * b

    def __mod__(self, o):
        return self._mod(o, False)

    def __rmod__(self, o):
        return self._mod(o, True)

    def __neg__(self):
        if self._type == _F32:
            return self._t.emit("arith.negf %s : f32" % self._name, _F32)
        return self._lift(0) - self

    def __pos__(self):
        return self

    def __abs__(self):
        if self._type == _F32:
            return self._t.emit("math.absf %s : f32" % self._name, _F32)
        return where(self < 0, -self, self)

    # -- comparisons and predicates ---------------------------------------

    def _compare(self, o, which):
        a, b = self._pair(o)
        fpred, ipred = _PREDICATES[which]
        if a._type == _F32:
            text = "arith.cmpf %s, %s, %s : f32" % (fpred, a._name, b._name)
        else:
            text = "arith.cmpi %s, %s, %s : index" % (ipred, a._name, b._name)
        return self._t.emit(text, _I1)

    def __lt__(self, o):
        return self._compare(o, "lt")

    def __le__(self, o):
        return self._compare(o, "le")

    def __gt__(self, o):
        return self._compare(o, "gt")

    def __ge__(self, o):
        return self._compare(o, "ge")

    def __eq__(self, o):
        return self._compare(o, "eq")

    def __ne__(self, o):
        return self._compare(o, "ne")

    __hash__ = None

    def _logical(self, o, op):
        p = self._lift(o)
        if self._type != _I1 or p._type != _I1:
            raise TraceError("flashjit.score_mod: & | ~ combine predicates "
                             "(comparisons) only")
        return self._t.emit("%s %s, %s : i1" % (op, self._name, p._name), _I1)

    def __and__(self, o):
        return self._logical(o, "arith.andi")

    __rand__ = __and__

    def __or__(self, o):
        return self._logical(o, "arith.ori")

    __ror__ = __or__

    def __invert__(self):
        return self._logical(True, "arith.xori")

    # -- numpy and torch dispatch -------------------------------------------

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = _UFUNCS.get(ufunc.__name__)
        if method != "__call__" or fn is None or kwargs:
            return NotImplemented
        return fn(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ == "where" and not kwargs:
            return where(*args)
        return NotImplemented

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "__getitem__" and not kwargs and len(args) == 2:
            # A tensor indexed with positions outside trace()'s wrapping of
            # torch.Tensor.__getitem__ (e.g. a tensor subclass's).
            v = _traced_index(args[1])
            if v is not None and not isinstance(args[0], _Value):
                return v._t.load(args[0], args[1])
        fn = _TORCH.get(name)
        if fn is None and name in _TORCH_DUNDERS and not kwargs:
            fn = _TORCH_DUNDERS[name]
        if fn is None or kwargs:
            raise TraceError(f"flashjit.score_mod: torch.{name} is not "
                             "supported in a score modifier")
        return fn(*args)

    def __repr__(self):
        return f"<flashjit.score_mod traced {self._type} {self._name}>"


def _traced_index(index):
    """The first traced value of an index (a value or a tuple), or None."""
    if isinstance(index, _Value):
        return index
    if isinstance(index, tuple):
        return _traced(*index)
    return None


def _is_numpy_scalar(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.generic)


def _numel(x):
    n = 1
    for d in x.shape:
        n *= int(d)
    return n


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


# torch dtypes a captured tensor may have (read as float32).
_TORCH_REAL = {"float64", "float32", "float16", "bfloat16", "bool", "uint8",
               "int8", "int16", "int32", "int64", "uint16", "uint32",
               "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
               "float8_e5m2fnuz"}


def _check_capturable(x):
    """TraceError unless x is a torch tensor or numpy array of real numbers
    (float, int or bool: read as float32) with 1 to 2^31 - 1 elements."""
    if _is_torch_tensor(x):
        dtype = str(x.dtype).replace("torch.", "")
        if dtype not in _TORCH_REAL:
            raise TraceError(f"flashjit.score_mod: a captured tensor must "
                             f"hold real numbers (read as float32), got "
                             f"torch.{dtype}")
    else:
        dtype = getattr(x, "dtype", None)
        if getattr(dtype, "kind", None) not in ("b", "i", "u", "f"):
            raise TraceError(f"flashjit.score_mod: a captured tensor must be "
                             f"a torch tensor or a numpy array of real "
                             f"numbers (read as float32), got "
                             f"{type(x).__name__} of dtype {dtype}")
    size = _numel(x)
    if not 1 <= size < 2**31:
        raise TraceError(f"flashjit.score_mod: a captured tensor must have "
                         f"1 to 2^31 - 1 elements (its indices are 32-bit), "
                         f"got shape {tuple(x.shape)}")


class Captured:
    """A tensor a score modifier reads, for numpy arrays (whose indexing
    cannot be intercepted): ``captured(array)[h, i, j]`` in a modifier
    traced by flashjit records a read of the captured tensor at those
    positions (flashjit.score_ops' doc); outside tracing (a float64
    reference evaluating the same function on numpy positions) it indexes
    the array as numpy does, with a dimension of size 1 broadcast as in
    the kernel. ``.data`` is the array (or torch tensor) wrapped; numpy
    sees the wrapper as that array (``__array__``)."""

    def __init__(self, data):
        if isinstance(data, Captured):
            data = data.data
        if not (_is_torch_tensor(data) or hasattr(data, "__array_interface__")
                and hasattr(data, "shape")):
            import numpy as np

            data = np.asarray(data)
        _check_capturable(data)
        self.data = data

    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def ndim(self):
        return len(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        v = _traced_index(index)
        if v is not None:
            return v._t.load(self.data, index)
        tracer = _active_tracer()
        if tracer is not None:
            # Constant indices while a modifier is traced (temp[0]): a read
            # of the captured tensor too, not its value baked in as a
            # constant, so that its data (and gradient) is the call's.
            return tracer.load(self.data, index)
        shape = self.data.shape
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) == len(shape):  # size-1 dimensions broadcast
            idx = tuple((x * 0 if hasattr(x, "shape") else 0)
                        if size == 1 and not isinstance(x, slice)
                        and x is not None and x is not Ellipsis else x
                        for x, size in zip(idx, shape))
        return self.data[idx]

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        data = self.data
        if _is_torch_tensor(data):
            data = data.detach().cpu().numpy()
        return np.asarray(data, dtype=dtype)

    def __repr__(self):
        return f"flashjit.score_ops.captured({self.data!r})"


def captured(data):
    """``data`` (a numpy array, anything numpy.asarray takes, or a torch
    tensor) as a tensor a score modifier may index with positions:
    ``captured(slopes)[h]``, ``captured(bias)[h, i, j]``. torch tensors
    need no wrapping (they are captured where indexed); numpy arrays do.
    Objects wrapping the same array are one captured tensor."""
    return data if isinstance(data, Captured) else Captured(data)


def _traced(*xs):
    """The first traced value among xs, or None."""
    for x in xs:
        if isinstance(x, _Value):
            return x
    return None


def _unary(name, op):
    def fn(x):
        v = _traced(x)
        if v is None:
            return _eager(name, x)
        x = v._as_f32()
        return x._t.emit("%s %s : f32" % (op, x._name), _F32)

    fn.__name__ = name
    fn.__doc__ = f"{name}(x): {op} on a traced value, else numpy's or torch's."
    return fn


def _eager(name, *args):
    """name(*args) by torch for torch tensors, else by numpy."""
    if any(type(a).__module__.startswith("torch") for a in args):
        import torch
        return getattr(torch, name)(*args)
    import numpy as np
    return getattr(np, name)(*args)


tanh = _unary("tanh", "math.tanh")
exp = _unary("exp", "math.exp")
exp2 = _unary("exp2", "math.exp2")
log = _unary("log", "math.log")
log2 = _unary("log2", "math.log2")
sqrt = _unary("sqrt", "math.sqrt")
sin = _unary("sin", "math.sin")
cos = _unary("cos", "math.cos")


def _minmax(name, op):
    def fn(x, y):
        v = _traced(x, y)
        if v is None:
            return _eager(name, x, y)
        a, b = v._lift(x)._pair(y)
        if a._type == _F32:
            return a._t.emit("%s %s, %s : f32" % (op, a._name, b._name), _F32)
        return where(a < b, a, b) if name == "minimum" else where(a < b, b, a)

    fn.__name__ = name
    fn.__doc__ = f"{name}(x, y) elementwise (NaN-propagating on floats)."
    return fn


minimum = _minmax("minimum", "arith.minimumf")
maximum = _minmax("maximum", "arith.maximumf")


def where(cond, a, b):
    """a where cond holds, else b (numpy's or torch's where when nothing
    is traced)."""
    v = _traced(cond, a, b)
    if v is None:
        return _eager("where", cond, a, b)
    c = v._lift(cond)
    if c._type != _I1:
        raise TraceError("flashjit.score_mod: where's condition must be a "
                         "predicate (a comparison)")
    x, y = c._lift(a)._pair(b)
    return c._t.emit("arith.select %s, %s, %s : %s" % (c._name, x._name,
                                                       y._name, x._type),
                     x._type)


def _on_traced(op):
    """op(x, y) with x lifted to a traced value (a ufunc or torch function
    called with a traced value second: np.add(1.0, s))."""
    return lambda x, y: op(_traced(x, y)._lift(x), y)


_BINARY = {"add": operator.add, "subtract": operator.sub,
           "multiply": operator.mul, "divide": operator.truediv,
           "true_divide": operator.truediv,
           "floor_divide": operator.floordiv, "remainder": operator.mod,
           "less": operator.lt, "less_equal": operator.le,
           "greater": operator.gt, "greater_equal": operator.ge,
           "equal": operator.eq, "not_equal": operator.ne}
# torch's names of the same functions.
_TORCH_NAMES = {"sub": "subtract", "mul": "multiply", "div": "true_divide",
                "lt": "less", "le": "less_equal", "gt": "greater",
                "ge": "greater_equal", "eq": "equal", "ne": "not_equal"}

_UFUNCS = {"tanh": tanh, "exp": exp, "exp2": exp2, "log": log, "log2": log2,
           "sqrt": sqrt, "sin": sin, "cos": cos, "minimum": minimum,
           "maximum": maximum, "fmin": minimum, "fmax": maximum,
           "absolute": abs, "negative": operator.neg,
           **{name: _on_traced(op) for name, op in _BINARY.items()}}

_TORCH = dict(_UFUNCS, where=where, abs=abs, neg=operator.neg,
              **{t: _UFUNCS[n] for t, n in _TORCH_NAMES.items()})


def _reflected(op):
    return lambda x, y: _on_traced(op)(y, x)


# torch.Tensor's operators with a traced value as the other operand (a
# one-element tensor times the score: tensor.__mul__(tensor, value)).
_TORCH_DUNDERS = {}
for _name, _op in (("add", operator.add), ("sub", operator.sub),
                   ("mul", operator.mul), ("truediv", operator.truediv),
                   ("div", operator.truediv),
                   ("floordiv", operator.floordiv), ("mod", operator.mod)):
    _TORCH_DUNDERS["__%s__" % _name] = _on_traced(_op)
    _TORCH_DUNDERS["__r%s__" % _name] = _reflected(_op)
for _name, _op in (("lt", operator.lt), ("le", operator.le),
                   ("gt", operator.gt), ("ge", operator.ge),
                   ("eq", operator.eq), ("ne", operator.ne)):
    _TORCH_DUNDERS["__%s__" % _name] = _on_traced(_op)
del _name, _op


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


# The tracers running on this thread (innermost last): Captured indexes
# with constant indices as a captured read while one runs.
_tracing = threading.local()


def _active_tracer():
    stack = getattr(_tracing, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def _tracing_with(tracer):
    stack = getattr(_tracing, "stack", None)
    if stack is None:
        stack = _tracing.stack = []
    stack.append(tracer)
    try:
        yield
    finally:
        stack.pop()


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
