"""What flashjit.score_ops' tracer, its traced values and captured tensors
share: TraceError, MAX_CAPTURES, the value types of a region (f32, index,
i1) and the comparison predicates, f32 constants as MLIR hex, the checks
of a tensor a modifier may capture (torch or numpy, real numbers, its
size), and the stack of tracers running on this thread (which makes a
captured(array) indexed with ints while tracing a captured read).

No other flashjit module is imported here: flashjit._traced_values and
flashjit.score_ops build on it. Its names are importable from
flashjit.score_ops as before (flashjit.score_ops' doc is the user guide).
"""

import contextlib
import struct
import sys
import threading


# The C API's limit on the tensors one region captures.
MAX_CAPTURES = 8


class TraceError(TypeError):
    """A score modifier that cannot be traced into the attn dialect."""


def _f32_hex(x):
    """x as an f32 constant of MLIR's hex form (exact, also for inf/nan)."""
    return "0x%08X" % struct.unpack("<I", struct.pack("<f", float(x)))[0]


_F32, _INDEX, _I1 = "f32", "index", "i1"

# Comparison predicates: Python operator -> (cmpf, cmpi) predicate.
_PREDICATES = {"lt": ("olt", "slt"), "le": ("ole", "sle"),
               "gt": ("ogt", "sgt"), "ge": ("oge", "sge"),
               "eq": ("oeq", "eq"), "ne": ("une", "ne")}


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
