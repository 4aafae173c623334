"""The traced values of flashjit.score_ops: _Value (an SSA value of the
region under construction, with Python's operators, comparisons and
numpy's / torch's dispatch emitting attn-dialect ops), Captured and
captured() (numpy arrays a modifier indexes with positions), and the
functions a modifier may call (tanh exp exp2 log log2 sqrt sin cos
minimum maximum where, eager numpy or torch on other values) with the
tables that route numpy ufuncs and torch functions to them.

These refer to each other (a value's abs is a where, where lifts a
value), so they are one module; the tracer (_Tracer) and trace() are in
flashjit.score_ops, whose doc is the user guide and which re-exports
every name here.
"""

import operator

from ._trace_common import (TraceError, _F32, _I1, _INDEX, _PREDICATES,
                            _active_tracer, _check_capturable, _f32_hex,
                            _is_numpy_scalar, _is_torch_tensor, _numel)


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
