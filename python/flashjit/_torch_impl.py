"""The kernels behind flashjit's torch ops: torch CUDA tensors through the C
API on torch's current stream, torch CPU tensors through the CPU execution
mode (numpy). Imported on first use with torch tensors (it imports torch).

The CUDA forward is the per-call hot path. Everything that depends only on
the inputs' shapes, strides, dtypes, devices, the alignment class of their
pointers, the mask, scale and window (the checks, the spec, the chosen
tiling, the loaded kernel, its grid and scalar arguments) is done once per
such key by flashjit_plan_create and kept in a _ForwardPlan (the C plan and
the output shapes). A call then builds the key (a tuple of torch's own
shape / stride / dtype values), allocates o and lse (torch's caching
allocator) and makes ONE foreign call, flashjit_plan_forward, with seven
pointers and the raw current stream (through flashjit._fastcall, a CPython
extension, where it is built; else ctypes): no struct, no context switch in
Python (the C side makes the plan's context current if it is not), no
synchronization. fast_forward is that path for flashjit.attention's eager
calls (flashjit/__init__.py calls it first).

The backward keeps its own per-key _Plan of ctypes structs (the C API has
no backward plan; its kernels dominate its cost).

A score_mod or mask_mod region that captures tensors (flashjit.score_ops,
"Captured tensors") runs through a plan too (flashjit_plan_create_captured,
keyed also by the captured tensors' sizes): each call gives the captured
tensors' device pointers to flashjit_plan_forward_captured
(forward_cuda_captured); the backward passes them to
flashjit_backward_captured. The captured tensors are float32 contiguous
tensors on q's device (check_captures), held by the caller across the
call; the kernels run on the current stream, the one torch's caching
allocator orders their memory on. The backward computes
the gradients of the captured tensors it is told to (one flag per tensor,
capture_grad_flags): a zeroed float32 tensor of each one's shape, on its
device and stream, is its flashjit_captured.grad (the kernels add into
it); they are returned in order, for the flagged tensors only.
"""

import ctypes
import sys

import torch

from . import _lib

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16}
_raw_stream = torch._C._cuda_getCurrentRawStream
_current_device = torch._C._cuda_getDevice
_MAX_PLANS = 4096
_by = ctypes.byref
# Looked up once: each is a module global read per call.
_Tensor = torch.Tensor
_empty = torch.empty
_empty_like = torch.empty_like
_f32 = torch.float32
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_plan_forward = None  # flashjit_plan_forward, once the library is loaded
_plan_forward_captured = None  # and flashjit_plan_forward_captured


def check_torch_qkv(q, k, v, fn):
    """Named TypeError / ValueError unless q, k, v are torch tensors of one
    supported dtype on one CUDA (or CPU) device; the flashjit dtype."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"flashjit.{fn}: {name} is a {type(t).__name__}, the "
                "others torch tensors: pass three torch tensors")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type not in ("cuda", "cpu", "meta"):
            raise ValueError(
                f"flashjit.{fn}: torch tensors must be on a CUDA device (or "
                f"the CPU, the CPU execution mode), {name} is on {t.device}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"flashjit.{fn}: q, k, v are on different devices: "
            f"{q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"flashjit.{fn}: q, k, v dtypes differ: {q.dtype}, "
            f"{k.dtype}, {v.dtype}")
    if q.dtype not in _DTYPES:
        raise TypeError(
            f"flashjit.{fn}: torch tensors must be bfloat16 or float16, "
            f"got {q.dtype}")
    return _DTYPES[q.dtype]


def check_inputs(q, k, v, fn="attention"):
    """(flashjit dtype, gqa) of three torch tensors on one device; named
    TypeError / ValueError otherwise."""
    from . import _check_shapes

    return check_torch_qkv(q, k, v, fn), _check_shapes(q.shape, k.shape,
                                                       v.shape)


def check_captures(captures, q, fn="attention"):
    """The captured tensors as the kernels read them: float32 tensors on
    q's device, made contiguous (no copy when they are). ValueError /
    TypeError naming the one that is not (flashjit.attention converts
    them; the ops take them as given)."""
    out = []
    for n, c in enumerate(captures):
        if not isinstance(c, torch.Tensor):
            raise TypeError(f"flashjit.{fn}: captured tensor {n} is a "
                            f"{type(c).__name__}, not a torch tensor")
        if c.dtype != torch.float32:
            raise TypeError(f"flashjit.{fn}: captured tensor {n} must be "
                            f"float32 (flashjit.attention converts it), got "
                            f"{c.dtype}")
        if c.device != q.device:
            raise ValueError(f"flashjit.{fn}: captured tensor {n} is on "
                             f"{c.device}, q on {q.device}")
        if c.numel() < 1:
            raise ValueError(f"flashjit.{fn}: captured tensor {n} is empty")
        out.append(c.contiguous())
    return out


def capture_grad_flags(flags, captures, fn="attention_backward"):
    """flags (one bool per captured tensor: whether the backward computes
    its gradient) as a list of bools, checked: one per tensor."""
    flags = [bool(f) for f in flags]
    if len(flags) != len(captures):
        raise ValueError(f"flashjit.{fn}: capture_needs_grad has "
                         f"{len(flags)} flags for {len(captures)} captured "
                         "tensors (one per tensor)")
    return flags


def _captured_structs(captures, grads=None):
    """(ctypes array, count) of float32 contiguous tensors' pointers;
    grads: one float32 contiguous tensor (of the same size) or None per
    tensor, the backward's gradient buffers."""
    grads = [None] * len(captures) if grads is None else grads
    return _lib.make_captured([
        (c.data_ptr(), c.numel(), g.data_ptr() if g is not None else 0)
        for c, g in zip(captures, grads)])


def c_tensor(name, shape, strides, fn="attention"):
    """A flashjit_tensor (data 0) of a shape and element strides."""
    strides = list(strides)
    if shape[3] > 1 and strides[3] != 1:
        raise ValueError(
            f"flashjit.{fn}: {name}'s innermost (head-dim) stride must "
            f"be 1, got {strides[3]} (strides {tuple(strides)})")
    if shape[3] == 1:
        strides[3] = 1
    if any(s < 0 for s in strides):
        raise ValueError(f"flashjit.{fn}: {name} has negative strides")
    return _lib.make_tensor(0, shape, strides)


# -- the CUDA handle ---------------------------------------------------------

_ordinal = [None]


def cuda_handle(index):
    """The process's CUDA handle, told the device ordinal to use when a
    thread has no current context."""
    h = _lib.handle(_lib.DEVICE_CUDA)
    if _ordinal[0] != index:
        _lib.check(_lib.lib().flashjit_set_cuda_device(h, index))
        _ordinal[0] = index
    return h


class _Plan:
    """What a forward or backward call of one key needs besides pointers."""

    __slots__ = ("spec", "structs", "refs", "spec_ref", "o_shape",
                 "lse_shape", "grad_strides", "workspace", "index", "device",
                 "dtype", "batch", "heads", "nq", "nkv")


_fwd_plans = {}
_bwd_plans = {}


def _layout_ref(bm, device):
    if bm is None:
        return None, None
    layout, keep = bm._device_layout(device)
    return _by(layout), (layout, keep)


def _base_plan(q, k, v, mask, bm, deterministic, names, tensors, fn,
               score_mod=""):
    dtype, gqa = check_inputs(q, k, v, fn)
    B, H, Nq, D = q.shape
    p = _Plan()
    p.spec = _lib.make_spec(D, v.shape[3], dtype, mask, gqa,
                            bm.block_size if bm else 0,
                            deterministic=deterministic, score_mod=score_mod)
    p.spec_ref = _by(p.spec)
    p.structs = [c_tensor(n, s, st, fn) for n, (s, st) in zip(names, tensors)]
    p.refs = [_by(t) for t in p.structs]
    p.device = q.device
    p.index = q.device.index if q.device.index is not None else 0
    p.dtype = q.dtype
    p.batch, p.heads, p.nq, p.nkv = B, H, Nq, k.shape[2]
    return p


def _forward_structs(q, k, v, o, dtype, mask, gqa, bm, score_mod):
    """The forward's flashjit_spec and q, k, v, o tensor structs (their data
    pointers set): what a plan and a captured call both describe."""
    spec = _lib.make_spec(q.shape[3], v.shape[3], dtype, mask, gqa,
                          bm.block_size if bm is not None else 0,
                          score_mod=score_mod)
    structs = [c_tensor(n, t.shape, t.stride()) for n, t in
               (("q", q), ("k", k), ("v", v), ("o", o))]
    for t, x in zip(structs, (q, k, v, o)):
        t.data = x.data_ptr()
    return spec, structs


class _ForwardPlan:
    """A flashjit_plan (its address) and the outputs' shapes of one key;
    lse_scratch: where calls that do not return lse let the kernel write it
    (never read: concurrent calls may overwrite each other's values)."""

    __slots__ = ("ptr", "o_shape", "lse_shape", "dtype", "device", "index",
                 "lse_scratch", "o_like_q")

    def __init__(self):
        self.ptr = None
        self.lse_scratch = None
        # o is laid out as torch.empty_like(q) lays out a contiguous q of
        # o's shape: fast_forward allocates it so (no shape and keyword
        # arguments to parse on every call).
        self.o_like_q = False

    def __del__(self):
        try:
            if self.ptr:
                _lib.lib().flashjit_plan_destroy(self.ptr)
                self.ptr = None
        except Exception:  # interpreter shutdown: the module may be gone
            pass


def _new_forward_plan(key, q, k, v, mask, scale, wl, wr, bm, layout,
                      score_mod="", captured=None):
    """(o, lse, plan) of a call whose key has no plan: checks the inputs,
    allocates the call's outputs, makes the C plan (which may compile, or
    tune on these very tensors) and caches it under key, unless the stream
    is being captured into a CUDA graph (whose plan gets the heuristic
    tiling: the next call outside the capture makes the lasting one).
    captured: (array, count) of the captured tensors (_captured_structs)
    for a region that captures them (flashjit_plan_create_captured)."""
    if q.device.type != "cuda":
        check_inputs(q, k, v)  # names a mix of devices first
        raise ValueError(
            f"flashjit.attention: forward_cuda needs CUDA tensors, got "
            f"{q.device}")
    dtype, gqa = check_inputs(q, k, v)
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    p = _ForwardPlan()
    p.o_shape, p.lse_shape = (B, H, Nq, Dv), (B, H, Nq)
    p.dtype, p.device = q.dtype, q.device
    p.index = q.device.index if q.device.index is not None else 0
    p.o_like_q = Dv == D and q.is_contiguous()
    o = torch.empty(p.o_shape, dtype=p.dtype, device=p.device)
    lse = torch.empty(p.lse_shape, dtype=torch.float32, device=p.device)
    spec, structs = _forward_structs(q, k, v, o, dtype, mask, gqa, bm,
                                     score_mod)
    made = ctypes.c_void_p()
    global _plan_forward, _plan_forward_captured
    _plan_forward = _lib.plan_forward_function()
    _plan_forward_captured = _lib.lib().flashjit_plan_forward_captured

    array, count = captured if captured is not None else (None, 0)

    def create(index):
        _lib.check(_lib.lib().flashjit_plan_create_captured(
            cuda_handle(index), _by(spec), *(_by(t) for t in structs),
            lse.data_ptr(), scale, wl, wr,
            _by(layout) if layout is not None else None, array, count,
            _raw_stream(index), _by(made)))
        p.ptr = made.value
        return torch.cuda.is_current_stream_capturing()

    if not _on_device(p.index, create):
        if len(_fwd_plans) >= _MAX_PLANS:
            _fwd_plans.clear()
        _fwd_plans[key] = p
    return o, lse, p


def _plan_key(q, k, v, mask, scale, wl, wr, bm, score_mod, qp, kp, vp):
    """(key, layout, keep) of a planned call: the key of its plan (a tuple
    of torch's own shape / stride / dtype values, the mask, scale, window,
    the pointers' alignment class, the region text and, with bm, the
    layout's dimensions); layout, bm's device layout (None without) and
    keep, what must stay referenced across the call."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
           v.get_device(), mask, scale, wl, wr, (qp | kp | vp) & 15,
           score_mod)
    if bm is None:
        return key, None, None
    layout, keep = bm._device_layout(q.device)
    return (key + (bm.block_size, layout.batch, layout.heads,
                   layout.q_blocks, layout.kv_blocks), layout, keep)


def _planned(key, q, k, v, mask, scale, wl, wr, bm, layout, score_mod,
             captured=None):
    """(o, lse, plan, counts, indices) of a planned call: key's plan (made
    now if it has none, _new_forward_plan), o and lse allocated for it,
    and the layout's device arrays (None without)."""
    p = _fwd_plans.get(key)
    if p is None:
        o, lse, p = _new_forward_plan(key, q, k, v, mask, scale, wl, wr, bm,
                                      layout, score_mod, captured)
    else:
        o = _empty(p.o_shape, dtype=p.dtype, device=p.device)
        lse = _empty(p.lse_shape, dtype=_f32, device=p.device)
    if layout is None:
        return o, lse, p, None, None
    return o, lse, p, layout.counts, layout.indices


def forward_cuda(q, k, v, mask, scale, wl, wr, bm, score_mod=""):
    """(o, lse) of torch CUDA tensors on torch's current stream of their
    device: one flashjit_plan_forward call on a cached plan."""
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    key, layout, keep = _plan_key(q, k, v, mask, scale, wl, wr, bm, score_mod,
                                  qp, kp, vp)
    o, lse, p, counts, indices = _planned(key, q, k, v, mask, scale, wl, wr,
                                          bm, layout, score_mod)
    status = _plan_forward(p.ptr, qp, kp, vp, o.data_ptr(), lse.data_ptr(),
                           counts, indices, _raw_stream(p.index))
    del keep
    if status:
        _lib.check(status)
    return o, lse


def forward_cuda_captured(q, k, v, mask, scale, wl, wr, bm, score_mod,
                          captures):
    """(o, lse) of torch CUDA tensors whose score_mod / mask_mod regions
    capture tensors: one flashjit_plan_forward_captured call on a cached
    plan (made by flashjit_plan_create_captured; the key is forward_cuda's
    and the captured tensors' sizes), on torch's current stream of q's
    device. captures: float32 tensors on q's device, in the regions' order;
    they (and any contiguous copies made here) stay referenced until the
    launch has been queued, and their memory is ordered on that stream by
    torch's caching allocator. Their data is read by the kernel at each
    call (a plan keeps no copy)."""
    if q.device.type != "cuda":
        check_inputs(q, k, v)
        raise ValueError(
            f"flashjit.attention: forward_cuda needs CUDA tensors, got "
            f"{q.device}")
    caps = check_captures(captures, q)
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    key, layout, keep = _plan_key(q, k, v, mask, scale, wl, wr, bm, score_mod,
                                  qp, kp, vp)
    key += (tuple(c.numel() for c in caps),)
    array, count = _captured_structs(caps)
    o, lse, p, counts, indices = _planned(key, q, k, v, mask, scale, wl, wr,
                                          bm, layout, score_mod,
                                          (array, count))
    status = _plan_forward_captured(
        p.ptr, qp, kp, vp, o.data_ptr(), lse.data_ptr(), counts, indices,
        array, count, _raw_stream(p.index))
    del keep, caps, array
    if status:
        _lib.check(status)
    return o, lse


def fast_forward(q, k, v, causal, scale, need_lse=True):
    """flashjit.attention's eager CUDA forward without a mask object:
    (o, lse), or None when the call needs the general path (not three plain
    torch CUDA tensors, autograd recording, torch.compile tracing, a scale
    that is not None or a float > 0). Without need_lse, lse is the plan's
    scratch (one allocation less per call; the caller drops it)."""
    if (type(q) is not _Tensor or type(k) is not _Tensor
            or type(v) is not _Tensor or not q.is_cuda):
        return None
    if _grad_enabled() and (q.requires_grad or k.requires_grad
                            or v.requires_grad):
        return None
    if _is_compiling():
        return None
    if scale is None:
        scale = 0.0
    elif type(scale) is not float or not scale > 0:
        return None
    # forward_cuda's dense path, inlined (one Python call less); the key
    # must be forward_cuda's, so that both find the same plan.
    mask = 1 if causal else 0
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
           v.get_device(), mask, scale, -1, -1, (qp | kp | vp) & 15, "")
    p = _fwd_plans.get(key)
    if p is None:
        o, lse, p = _new_forward_plan(key, q, k, v, mask, scale, -1, -1, None,
                                      None)
    else:
        o = (_empty_like(q) if p.o_like_q else
             _empty(p.o_shape, dtype=p.dtype, device=p.device))
        lse = None if need_lse else p.lse_scratch
        if lse is None:
            lse = _empty(p.lse_shape, dtype=_f32, device=p.device)
            # Kept outside a capture only: a graph's pool is its own.
            if not need_lse and not torch.cuda.is_current_stream_capturing():
                p.lse_scratch = lse
    status = _plan_forward(p.ptr, qp, kp, vp, o.data_ptr(), lse.data_ptr(),
                           None, None, _raw_stream(p.index))
    if status:
        _lib.check(status)
    return o, lse


def _on_device(index, launch, *args):
    """launch(*args, index) with CUDA device index current (switched only
    when it is not, as the common call is on the current device)."""
    if _current_device() != index:
        with torch.cuda.device(index):
            return launch(*args, index)
    return launch(*args, index)


def backward_cuda(q, k, v, o, lse, d_o, mask, scale, wl, wr, bm,
                  deterministic, score_mod="", captures=(), capture_grads=None):
    """(dq, dk, dv, capture_grads) by flashjit_backward on torch's current
    stream of q's device. Its workspace is a torch tensor of the size the
    C API asks for, so torch's caching allocator keeps it stream-ordered.
    With captures (the forward's captured tensors, float32 on q's device),
    flashjit_backward_captured; capture_grads: one flag per captured tensor
    (None: none), whose gradient is computed (float32, shaped as the
    tensor) and returned in the list, in order, for the flagged ones only
    ([] without flags)."""
    flags = (capture_grad_flags(
        [False] * len(captures) if capture_grads is None else capture_grads,
        captures) if captures or capture_grads else [])
    if d_o.dtype != o.dtype:
        d_o = d_o.to(o.dtype)
    if d_o.stride(-1) != 1:  # e.g. autograd's expanded grad of o.sum()
        d_o = d_o.contiguous()
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
           o.shape, o.stride(), d_o.shape, d_o.stride(), q.dtype, k.dtype,
           v.dtype, o.dtype, q.device, k.device, v.device, mask,
           bm.block_size if bm is not None else 0, bool(deterministic),
           score_mod)
    p = _bwd_plans.get(key)
    if p is None:
        p = _backward_plan(key, q, k, v, o, d_o, mask, bm, deterministic,
                           score_mod)
    dq = torch.empty_strided(q.shape, p.grad_strides[0], dtype=p.dtype,
                             device=p.device)
    dk = torch.empty_strided(k.shape, p.grad_strides[1], dtype=p.dtype,
                             device=p.device)
    dv = torch.empty_strided(v.shape, p.grad_strides[2], dtype=p.dtype,
                             device=p.device)
    for t, x in zip(p.structs, (q, k, v, o, d_o, dq, dk, dv)):
        t.data = x.data_ptr()
    caps = check_captures(captures, q, "attention_backward")
    # Zeroed on the current stream (the kernels add into them).
    grads = [torch.zeros(c.shape, dtype=torch.float32, device=c.device)
             if f else None for c, f in zip(caps, flags)]
    _on_device(p.index, _launch_backward, p, lse, scale, wl, wr, bm, caps,
               grads)
    return dq, dk, dv, [g for g in grads if g is not None]


def _backward_plan(key, q, k, v, o, d_o, mask, bm, deterministic,
                   score_mod=""):
    if q.device.type != "cuda":
        check_inputs(q, k, v)
        raise ValueError("flashjit.attention: backward_cuda needs CUDA "
                         f"tensors, got {q.device}")
    check_inputs(q, k, v, "attention_backward")
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    if tuple(o.shape) != (B, H, Nq, Dv) or tuple(d_o.shape) != tuple(o.shape):
        raise ValueError(f"flashjit.attention_backward: o and d_o must be "
                         f"{(B, H, Nq, Dv)}, got {tuple(o.shape)} and "
                         f"{tuple(d_o.shape)}")
    # dq, dk, dv laid out as torch.empty_like lays them out.
    grad_strides = tuple(torch.empty_like(t, device="meta").stride()
                         for t in (q, k, v))
    shapes = [(t.shape, t.stride()) for t in (q, k, v, o, d_o)]
    shapes += [(t.shape, s) for t, s in zip((q, k, v), grad_strides)]
    p = _base_plan(q, k, v, mask, bm, deterministic,
                   ("q", "k", "v", "o", "d_o", "dq", "dk", "dv"), shapes,
                   "attention_backward", score_mod)
    p.grad_strides = grad_strides
    size = ctypes.c_size_t()
    _lib.check(_lib.lib().flashjit_backward_workspace_size(
        cuda_handle(p.index), p.spec_ref, B, H, Nq, k.shape[2], _by(size)))
    p.workspace = size.value
    if len(_bwd_plans) >= _MAX_PLANS:
        _bwd_plans.clear()
    _bwd_plans[key] = p
    return p


def captured_workspace_size(handle, spec_ref, shape, array, count):
    """flashjit_backward_captured_workspace_size's bytes for (B, H, Nq,
    Nkv) = shape and the captured structs (their sizes and grads)."""
    size = ctypes.c_size_t()
    _lib.check(_lib.lib().flashjit_backward_captured_workspace_size(
        handle, spec_ref, *shape, array, count, _by(size)))
    return size.value


def _launch_backward(p, lse, scale, wl, wr, bm, captures, grads, index):
    array, count = None, 0
    size = p.workspace
    if captures:
        array, count = _captured_structs(captures, grads)
        if p.spec.deterministic and any(g is not None for g in grads or ()):
            # The gradients' fixed-point words live in the workspace too.
            size = captured_workspace_size(
                cuda_handle(index), p.spec_ref,
                (p.batch, p.heads, p.nq, p.nkv), array, count)
    workspace = torch.empty(size, dtype=torch.uint8, device=p.device)
    layout_ref, keep = _layout_ref(bm, p.device)
    r = p.refs
    args = (cuda_handle(index), p.spec_ref, r[0], r[1], r[2], r[3], r[4],
            lse.data_ptr(), r[5], r[6], r[7], scale, wl, wr, layout_ref)
    # A BlockMask's KV-major transpose (made once on the host and kept on
    # the device; the ops' block tensors find their mask's): the call
    # neither copies nor synchronizes. Without one the C API makes it.
    kv = bm._kv_device_layout(p.device) if bm is not None else None
    if kv is not None:
        status = _lib.lib().flashjit_backward_kv_major(
            *args, _by(kv[0]), workspace.data_ptr(), size, array, count,
            _raw_stream(index))
    else:  # with no captured tensors, flashjit_backward
        status = _lib.lib().flashjit_backward_captured(
            *args, workspace.data_ptr(), size, array, count,
            _raw_stream(index))
    del keep, workspace, array, kv
    if status:
        _lib.check(status)


# -- torch CPU tensors: the CPU execution mode ---------------------------------


def _to_numpy(t):
    """A 16-bit CPU tensor as a numpy array the CPU path takes: float16
    as is, bfloat16 as float32 (exact; the CPU path rounds it back to bf16
    without loss)."""
    t = t.detach()
    if t.shape[-1] > 1 and t.stride(-1) != 1:  # e.g. an expanded d_o
        t = t.contiguous()
    return t.numpy() if t.dtype == torch.float16 else t.float().numpy()


def _from_numpy(a, dtype):
    return torch.from_numpy(a).to(dtype)


def forward_cpu(q, k, v, mask, scale, wl, wr, bm, score_mod="",
                captures=()):
    """(o, lse) of torch CPU tensors, by the CPU execution mode (captures:
    float32 CPU tensors the score_mod region captures)."""
    from . import _attention_numpy

    check_inputs(q, k, v)
    caps = [c.detach() for c in check_captures(captures, q)]
    o, lse = _attention_numpy(_to_numpy(q), _to_numpy(k), _to_numpy(v), mask,
                              scale, wl, wr, bm, True, score_mod, caps)
    return _from_numpy(o, q.dtype), torch.from_numpy(lse)


def backward_cpu(q, k, v, o, lse, d_o, mask, scale, wl, wr, bm,
                 deterministic, score_mod="", captures=(), capture_grads=None):
    """backward_cuda's (dq, dk, dv, capture_grads) for torch CPU tensors,
    by the CPU execution mode."""
    from . import _backward_numpy

    check_inputs(q, k, v, "attention_backward")
    caps = [c.detach() for c in
            check_captures(captures, q, "attention_backward")]
    flags = capture_grad_flags(
        [False] * len(caps) if capture_grads is None else capture_grads,
        caps)
    *grads, cgrads = _backward_numpy(
        *(_to_numpy(t) for t in (q, k, v, o, d_o)), lse.detach().numpy(),
        mask, scale, wl, wr, bm, deterministic, score_mod, caps, flags)
    # Laid out as torch.empty_like(q / k / v), as on CUDA and in the fake.
    return tuple(torch.empty_like(t).copy_(_from_numpy(g, q.dtype))
                 for t, g in zip((q, k, v), grads)) + (
                     [torch.from_numpy(g) for g in cgrads if g is not None],)


# flashjit.attention tries fast_forward first from now on.
sys.modules[__package__]._torch_forward = fast_forward
