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
TypeError: write ``where(i > j, a, b)``); captured tensors are refused for
now (NotImplementedError).
"""

import operator
import struct

__all__ = ["trace", "TraceError", "named", "with_mask", "tanh", "exp", "exp2",
           "log", "log2", "sqrt", "sin", "cos", "minimum", "maximum", "where"]


class TraceError(TypeError):
    """A score modifier that cannot be traced into the attn dialect."""


def _f32_hex(x):
    """x as an f32 constant of MLIR's hex form (exact, also for inf/nan)."""
    return "0x%08X" % struct.unpack("<I", struct.pack("<f", float(x)))[0]


class _Tracer:
    """The region under construction: its lines and a counter of names."""

    def __init__(self):
        self.lines = []
        self.count = 0
        self.constants = {}

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
        if hasattr(other, "shape") or hasattr(other, "__array__"):
            raise NotImplementedError(
                "flashjit.score_mod: captured tensors are not supported yet; "
                "use Python numbers (constants) and the score's positions")
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
                         "index a Python or numpy object (captured tensors "
                         "are not supported yet)")

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
        fn = _TORCH.get(name)
        if fn is None or kwargs:
            if name == "__getitem__":
                raise NotImplementedError(
                    "flashjit.score_mod: captured tensors are not supported "
                    "yet; use Python numbers and the score's positions")
            raise TraceError(f"flashjit.score_mod: torch.{name} is not "
                             "supported in a score modifier")
        return fn(*args)

    def __repr__(self):
        return f"<flashjit.score_mod traced {self._type} {self._name}>"


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


def trace(fn):
    """The score_mod region of ``fn(score, batch, head, q_idx, kv_idx)``
    as attn-dialect text (``{ ^bb0(...): ... attn.yield %v : f32 }``).
    Raises TraceError (a TypeError) for what cannot be traced and
    NotImplementedError for captured tensors."""
    if not callable(fn):
        raise TraceError(f"flashjit.score_mod: expected a function of "
                         f"(score, batch, head, q_idx, kv_idx), got {fn!r}")
    t = _Tracer()
    names = ("%s", "%b", "%h", "%i", "%j")
    args = [_Value(t, n, _F32 if n == "%s" else _INDEX) for n in names]
    try:
        out = fn(*args)
    except TypeError as e:
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"flashjit.score_mod: tracing {fn!r} failed: {e} "
                         "(a modifier takes (score, batch, head, q_idx, "
                         "kv_idx); see flashjit.score_ops's doc)") from e
    if out is None or isinstance(out, (complex, str)):
        raise TraceError(f"flashjit.score_mod: {fn!r} returned {out!r}; a "
                         "modifier returns the modified score")
    v = args[0]._lift(out)._as_f32()
    body = "\n".join(t.lines)
    return ("{\n  ^bb0(%s: f32, %b: index, %h: index, %i: index, "
            "%j: index):\n" + (body + "\n" if body else "") +
            "    attn.yield %s : f32\n  }" % v._name)


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
    0 and lse -inf). The mask is part of the score_mod region; blocks it
    masks whole are still visited (block skipping from a mask_mod is not
    there yet)."""
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
