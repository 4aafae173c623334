"""ctypes binding of libflashjit.so's C API (tools/capi/flashjit.h).

The library is found, on first use, as
  1. $FLASHJIT_LIBRARY (if set, the only candidate),
  2. libflashjit.so beside this package (an installed copy),
  3. <repo>/build/lib/libflashjit.so (a source checkout's build).
Nothing here imports torch or numpy.
"""

import ctypes
import os
import pathlib
import threading

LIBRARY_NAME = "libflashjit.so"

# flashjit_status
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_NO_DRIVER = 2
ERROR_COMPILE = 3
ERROR_CUDA = 4
ERROR_NOT_IMPLEMENTED = 5
ERROR_INTERNAL = 6

DEVICE_CPU = 0
DEVICE_CUDA = 1

DTYPE_BF16 = 0
DTYPE_FP16 = 1

MASK_NONE = 0
MASK_CAUSAL = 1
MASK_SLIDING_WINDOW = 2


class FlashjitError(RuntimeError):
    """A failing flashjit call; .status is the C API's flashjit_status."""

    def __init__(self, message, status=ERROR_INTERNAL):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(FlashjitError, ValueError):
    """A bad argument (FLASHJIT_ERROR_INVALID_ARGUMENT); also a ValueError."""


class NoDriverError(FlashjitError):
    """No CUDA driver or GPU (FLASHJIT_ERROR_NO_DRIVER)."""


class CompileError(FlashjitError):
    """The compiler or nvJitLink failed (FLASHJIT_ERROR_COMPILE)."""


class CudaError(FlashjitError):
    """A CUDA driver call failed (FLASHJIT_ERROR_CUDA)."""


class NotImplementedFlashjitError(FlashjitError, NotImplementedError):
    """Not implemented yet (FLASHJIT_ERROR_NOT_IMPLEMENTED); also a
    NotImplementedError."""


class LibraryNotFoundError(FlashjitError, OSError):
    """libflashjit.so could not be found or loaded."""


_STATUS_ERRORS = {
    ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    ERROR_NO_DRIVER: NoDriverError,
    ERROR_COMPILE: CompileError,
    ERROR_CUDA: CudaError,
    ERROR_NOT_IMPLEMENTED: NotImplementedFlashjitError,
}


class Spec(ctypes.Structure):
    _fields_ = [
        ("head_dim_qk", ctypes.c_int64),
        ("head_dim_v", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("mask", ctypes.c_int32),
        ("gqa", ctypes.c_int64),
        ("block_sparse", ctypes.c_int32),
        ("direction", ctypes.c_int32),
        ("sparse_block", ctypes.c_int64),
        ("deterministic", ctypes.c_int32),
        ("varlen", ctypes.c_int32),
        # C API version 5; None: none. Since version 7 the region may
        # capture tensors (flashjit_forward_captured takes them).
        ("score_mod", ctypes.c_char_p),
        # C API version 9: a mask_mod region's text; None: none.
        ("mask_mod", ctypes.c_char_p),
    ]


# The binding passes a score modifier and a mask modifier as one string
# through its layers (the torch ops take one `score_mod: str`): the
# score_mod text, then this separator and the mask_mod region's text when
# there is one. make_spec splits it into the C API's two fields.
MASK_MOD_SEPARATOR = "\n// mask_mod\n"


def join_modifiers(score_text, mask_text):
    """One string for a score_mod text ("" none) and a mask_mod region's
    text ("" none): what make_spec's score_mod takes."""
    return score_text + (MASK_MOD_SEPARATOR + mask_text if mask_text else "")


def split_modifiers(text):
    """(score_text, mask_text) of join_modifiers' string."""
    score, sep, mask = (text or "").partition(MASK_MOD_SEPARATOR)
    return score, mask


def mask_capture_count(text):
    """How many of the captured tensors of join_modifiers' string are the
    mask_mod region's (the last ones; they take no gradient): its
    memref<?xf32> arguments."""
    mask = split_modifiers(text)[1]
    header = mask[mask.find("^bb0("):mask.find(")", mask.find("^bb0("))]
    return header.count("memref<")


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("shape", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
    ]


class Layout(ctypes.Structure):
    _fields_ = [
        ("counts", ctypes.c_void_p),
        ("indices", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("q_blocks", ctypes.c_int64),
        ("kv_blocks", ctypes.c_int64),
    ]


class Varlen(ctypes.Structure):
    """flashjit_varlen (C API version 8): the sequences of a
    variable-length batch. cu_seqlens_q / cu_seqlens_kv: [batch + 1] int32
    offsets (0 first, non-decreasing; sequence b is rows [cu[b], cu[b + 1])
    of the packed tensors), device pointers on CUDA (not read on the host:
    bad offsets are undefined behaviour there), host pointers on the CPU
    (checked); max_seqlen_q / max_seqlen_kv: at least the longest query
    (key) sequence and at least 1 (the grid spans them and lse is padded to
    max_seqlen_q)."""

    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_kv", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_kv", ctypes.c_int64),
        # C API version 9: a block-sparse layout (flashjit_layout *), NULL
        # without.
        ("layout", ctypes.c_void_p),
        # C API version 13: its KV-major transpose for the backward
        # (flashjit_layout *), NULL: made on the host.
        ("kv_layout", ctypes.c_void_p),
    ]


def make_layout(counts, indices, shape):
    """A Layout of two int32 array addresses (ints) and its shape (batch,
    heads, rows, entries a row): a Q-major layout's (batch, heads,
    q_blocks, kv_blocks), or a KV-major transpose's, whose rows are KV
    blocks (flashjit_backward_kv_major's kv_layout)."""
    layout = Layout()
    layout.counts = counts
    layout.indices = indices
    layout.batch, layout.heads, layout.q_blocks, layout.kv_blocks = shape
    return layout


def make_varlen(cu_q, cu_kv, batch, max_q, max_kv):
    """A Varlen of two offset pointers (ints) and the sizes."""
    v = Varlen()
    v.cu_seqlens_q = cu_q
    v.cu_seqlens_kv = cu_kv
    v.batch = int64("batch", batch)
    v.max_seqlen_q = int64("max_seqlen_q", max_q)
    v.max_seqlen_kv = int64("max_seqlen_kv", max_kv)
    return v


class Captured(ctypes.Structure):
    """flashjit_captured (C API version 7): a tensor a score_mod region
    captures, float32, size elements at data (host memory on a CPU handle,
    device memory on CUDA); grad: where flashjit_backward_captured ADDS
    d loss / d data (float32, size elements, on data's device, zeroed by
    the caller; NULL: no gradient for this tensor). A non-NULL grad with
    spec.deterministic = 1 is INVALID_ARGUMENT (the gradient is summed by
    atomic adds)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_int64),
        ("grad", ctypes.c_void_p),
    ]


INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def int64(what, value):
    """value as an int that fits the C API's int64_t. ctypes would wrap a
    larger one silently (2**64 + 5 as 5); this raises ValueError naming
    `what` and the true value, and TypeError for a non-integer (1.5 is not
    truncated to 1)."""
    import operator

    if isinstance(value, bool):
        raise TypeError(f"flashjit: {what} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"flashjit: {what} must be an integer, got "
                        f"{value!r} ({type(value).__name__})") from None
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"flashjit: {what} must fit in int64 "
                         f"([-2**63, 2**63 - 1]), got {v}")
    return v


def make_tensor(data_ptr, shape, strides):
    t = Tensor()
    t.data = data_ptr
    for i in range(4):
        t.shape[i] = int64(f"shape[{i}]", shape[i])
        t.strides[i] = int64(f"strides[{i}]", strides[i])
    return t


def make_spec(head_dim_qk, head_dim_v, dtype, mask, gqa, sparse_block,
              backward=False, deterministic=False, score_mod="",
              varlen=False):
    s = Spec()
    s.head_dim_qk = int64("head_dim", head_dim_qk)
    s.head_dim_v = int64("head_dim_v", head_dim_v)
    s.dtype = dtype
    s.mask = mask
    s.gqa = int64("gqa", gqa)
    s.block_sparse = 1 if sparse_block else 0
    s.direction = 1 if backward else 0  # which pass emit / chosen_config see
    s.sparse_block = int64("sparse_block", sparse_block) if sparse_block else 128
    # The backward's dQ: 1, a separate pass (bit-identical); 0, atomic adds.
    s.deterministic = 1 if deterministic else 0
    # Variable-length packing (flashjit_forward_varlen / _backward_varlen).
    s.varlen = 1 if varlen else 0
    # The score modifier ("" none) and the mask modifier (join_modifiers);
    # ctypes keeps the bytes alive.
    score_text, mask_text = split_modifiers(score_mod)
    s.score_mod = score_text.encode() if score_text else None
    s.mask_mod = mask_text.encode() if mask_text else None
    return s


def make_captured(buffers):
    """(array, count) for flashjit_forward_captured /
    flashjit_backward_captured: buffers is a sequence of (data pointer,
    float32 elements) or (data pointer, float32 elements, grad pointer)
    (grad: flashjit_backward_captured's gradient buffer of the same size,
    or None / 0 for none); array is a ctypes array of Captured, which the
    caller keeps alive across the call (the buffers too). (None, 0) when
    there are none."""
    if not buffers:
        return None, 0
    array = (Captured * len(buffers))()
    for c, buf in zip(array, buffers):
        data, size = buf[0], buf[1]
        c.data = data
        c.size = int64("captured size", size)
        c.grad = (buf[2] or None) if len(buf) > 2 else None
    return array, len(buffers)


def library_candidates():
    """The paths tried, in order."""
    env = os.environ.get("FLASHJIT_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    here = pathlib.Path(__file__).resolve().parent
    return [here / LIBRARY_NAME, here.parents[1] / "build" / "lib" / LIBRARY_NAME]


_lock = threading.RLock()
_lib = None
_lib_path = None
_handles = {}


def _declare(lib):
    c_handle = ctypes.c_void_p
    P = ctypes.POINTER
    sigs = {
        "flashjit_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "flashjit_last_error": (ctypes.c_char_p, [c_handle]),
        "flashjit_version": (ctypes.c_char_p, []),
        "flashjit_create": (ctypes.c_int, [P(c_handle), ctypes.c_int]),
        "flashjit_destroy": (None, [c_handle]),
        "flashjit_set_cuda_device": (ctypes.c_int, [c_handle, ctypes.c_int]),
        "flashjit_cached_kernels": (ctypes.c_int64, [c_handle]),
        "flashjit_spec_init": (None, [P(Spec)]),
        "flashjit_forward": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_void_p, ctypes.c_double, ctypes.c_int64, ctypes.c_int64,
             P(Layout), ctypes.c_void_p],
        ),
        "flashjit_backward": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             P(Tensor), ctypes.c_void_p, P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_double, ctypes.c_int64, ctypes.c_int64, P(Layout),
             ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
        ),
        "flashjit_backward_workspace_size": (
            ctypes.c_int,
            [c_handle, P(Spec), ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
             ctypes.c_int64, P(ctypes.c_size_t)],
        ),
        "flashjit_chosen_config": (
            ctypes.c_int,
            [c_handle, P(Spec), ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
             ctypes.c_int64, P(ctypes.c_int64)],
        ),
        "flashjit_emit": (
            ctypes.c_int,
            [c_handle, P(Spec), ctypes.c_char_p, ctypes.c_char_p,
             P(ctypes.c_void_p), P(ctypes.c_size_t)],
        ),
        "flashjit_free": (None, [ctypes.c_void_p]),
        "flashjit_plan_create": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_void_p, ctypes.c_double, ctypes.c_int64, ctypes.c_int64,
             P(Layout), ctypes.c_void_p, P(ctypes.c_void_p)],
        ),
        # The per-call function: nine pointer-sized arguments, no struct
        # (ctypes converts an int argument faster than a struct field).
        "flashjit_plan_forward": (ctypes.c_int, [ctypes.c_void_p] * 9),
        "flashjit_plan_destroy": (None, [ctypes.c_void_p]),
    }
    # C API version 7 (captured tensors): the array of flashjit_captured
    # is passed as a void pointer (make_captured).
    sigs.update({
        "flashjit_forward_captured": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_void_p, ctypes.c_double, ctypes.c_int64, ctypes.c_int64,
             P(Layout), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p],
        ),
        "flashjit_backward_captured": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             P(Tensor), ctypes.c_void_p, P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_double, ctypes.c_int64, ctypes.c_int64, P(Layout),
             ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_void_p],
        ),
    })
    # C API version 8 (variable-length packing): flashjit_varlen by
    # pointer, the captured array as a void pointer.
    sigs.update({
        "flashjit_forward_varlen": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_void_p, ctypes.c_double, ctypes.c_int64, ctypes.c_int64,
             P(Varlen), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p],
        ),
        "flashjit_backward_varlen": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             P(Tensor), ctypes.c_void_p, P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_double, ctypes.c_int64, ctypes.c_int64, P(Varlen),
             ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_void_p],
        ),
    })
    # C API version 10: the block classification of a mask_mod region
    # (handle, spec, batch, heads, seq_q, seq_kv, the layout it writes,
    # the captured array as a void pointer, its count, the CUDA stream).
    sigs.update({
        "flashjit_mask_blocks": (
            ctypes.c_int,
            [c_handle, P(Spec), ctypes.c_int64, ctypes.c_int64,
             ctypes.c_int64, ctypes.c_int64, P(Layout), ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_void_p],
        ),
    })
    # C API version 11: a varlen batch's mask blocks (the layout in the
    # Varlen); the backward's workspace for its captured tensors (a
    # deterministic backward holds their gradients' words there). The
    # captured array as a void pointer, its count.
    sigs.update({
        "flashjit_mask_blocks_varlen": (
            ctypes.c_int,
            [c_handle, P(Spec), ctypes.c_int64, P(Varlen), ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_void_p],
        ),
        "flashjit_backward_captured_workspace_size": (
            ctypes.c_int,
            [c_handle, P(Spec), ctypes.c_int64, ctypes.c_int64,
             ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
             P(ctypes.c_size_t)],
        ),
    })
    # C API version 13: the backward with the layout's KV-major transpose
    # (a second Layout), the captured array as a void pointer, its count.
    sigs.update({
        "flashjit_backward_kv_major": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             P(Tensor), ctypes.c_void_p, P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_double, ctypes.c_int64, ctypes.c_int64, P(Layout),
             P(Layout), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_void_p],
        ),
    })
    # C API version 12: plans of specs whose regions capture tensors (the
    # captured array as a void pointer, its count).
    sigs.update({
        "flashjit_plan_create_captured": (
            ctypes.c_int,
            [c_handle, P(Spec), P(Tensor), P(Tensor), P(Tensor), P(Tensor),
             ctypes.c_void_p, ctypes.c_double, ctypes.c_int64, ctypes.c_int64,
             P(Layout), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
             P(ctypes.c_void_p)],
        ),
        "flashjit_plan_forward_captured": (
            ctypes.c_int,
            [ctypes.c_void_p] * 8 + [ctypes.c_void_p, ctypes.c_int64,
                                     ctypes.c_void_p],
        ),
    })
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def lib():
    """The loaded library (loads it on first use)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in library_candidates():
            if not path.is_file():
                tried.append(f"{path}: no such file")
                continue
            try:
                loaded = ctypes.CDLL(str(path))
                _declare(loaded)
            except (OSError, AttributeError) as e:
                tried.append(f"{path}: {e}")
                continue
            _lib_path = path
            _lib = loaded
            return _lib
        raise LibraryNotFoundError(
            "flashjit: libflashjit.so not found (set $FLASHJIT_LIBRARY, or "
            "build it: cmake --build build --target flashjit); tried: "
            + "; ".join(tried))


def plan_forward_function():
    """The fastest callable for flashjit_plan_forward(plan, q, k, v, o, lse,
    counts, indices, stream) -> status, with addresses as ints or None:
    flashjit._fastcall's plan_forward (a CPython extension on the stable
    ABI, python/src/FastCall.cpp) where it sits beside the loaded
    libflashjit.so and FLASHJIT_FASTCALL is not 0, else the library's ctypes
    function. Both call the same library's function (the extension is given
    its address); the extension skips ctypes' argument conversion."""
    loaded = lib()
    path = _lib_path.parent / "_fastcall.abi3.so"
    if os.environ.get("FLASHJIT_FASTCALL", "1") != "0" and path.is_file():
        module = fastcall_module(path)
        module.set_function(
            ctypes.cast(loaded.flashjit_plan_forward, ctypes.c_void_p).value)
        return module.plan_forward
    return loaded.flashjit_plan_forward


def fastcall_module(path):
    """The flashjit._fastcall extension module at path (imported once)."""
    import importlib.machinery
    import importlib.util
    import sys

    name = __package__ + "._fastcall"
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path),
                                                  loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def library_path():
    """The path of the loaded libflashjit.so (loads it)."""
    lib()
    return str(_lib_path)


def check(status):
    """Raises the FlashjitError subclass for a failing status."""
    if status == OK:
        return
    message = lib().flashjit_last_error(None).decode("utf-8", "replace")
    raise _STATUS_ERRORS.get(status, FlashjitError)(message, status)


def handle(device):
    """The process-wide handle of a device (DEVICE_CPU or DEVICE_CUDA),
    created on first use. Handles are never destroyed: their compiled
    kernels live as long as the process (CUDA modules must not be unloaded
    after the context is gone at exit)."""
    h = _handles.get(device)
    if h is not None:
        return h
    with _lock:
        h = _handles.get(device)
        if h is None:
            p = ctypes.c_void_p()
            check(lib().flashjit_create(ctypes.byref(p), device))
            h = p
            _handles[device] = h
        return h
