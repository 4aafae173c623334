"""A BlockMask classified by flashjit's own kernel.

``flashjit.create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN,
kernel=True)`` does not evaluate the mask function in Python (as
BlockMask.from_mask_mod does): it traces it (flashjit.mask_mods) into the
description's mask_mod region and runs the block-classification kernel
that flashjit compiles beside the forward of a block-sparse spec with that
region (the C API's flashjit_mask_blocks, C API version 10), on the CPU
handle or on a CUDA device. The kernel evaluates the region on every
BLOCK_SIZE x BLOCK_SIZE block pair, never an N x N mask, and writes the
layout in BCSR form: per (batch, head, query block) the key blocks with an
element the mask keeps, ascending, ~k for a block it keeps whole (full).
The result is the BlockMask that from_mask_mod gives for the same mask
(the same blocks and full marks).
"""

import ctypes
import sys

from . import _lib
from .block_mask import BlockMask, _need_numpy, np

_FN = "create_block_mask"


def _spec_dims(like):
    """(head_dim, flashjit dtype) of like: None (64, bf16), a numpy array
    (float16, or float32 as bf16, as attention's numpy path) or a torch
    tensor (bfloat16 or float16), shaped (B, H, N, d)."""
    if like is None:
        return 64, _lib.DTYPE_BF16
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        dtypes = {torch.bfloat16: _lib.DTYPE_BF16,
                  torch.float16: _lib.DTYPE_FP16}
        dtype = dtypes.get(like.dtype)
        if dtype is None:
            raise TypeError(f"flashjit.{_FN}: like must be a bfloat16 or "
                            f"float16 torch tensor, got {like.dtype}")
    elif isinstance(like, np.ndarray):
        dtypes = {np.dtype(np.float16): _lib.DTYPE_FP16,
                  np.dtype(np.float32): _lib.DTYPE_BF16}
        dtype = dtypes.get(like.dtype)
        if dtype is None:
            raise TypeError(f"flashjit.{_FN}: like must be a float16 or "
                            "float32 (rounded to bf16) numpy array, got "
                            f"{like.dtype}")
    else:
        raise TypeError(f"flashjit.{_FN}: like must be a numpy array or a "
                        f"torch tensor (the attention's q), got "
                        f"{type(like).__name__}")
    if len(like.shape) != 4:
        raise ValueError(f"flashjit.{_FN}: like must be 4-D (batch, heads, "
                         f"seq_len, head_dim) as q, got shape "
                         f"{tuple(like.shape)}")
    return int(like.shape[3]), dtype


def _cuda_device(device):
    """None for the CPU handle (device None, "cpu" or a torch CPU device),
    else the torch CUDA device with its index (the current one when not
    given); ValueError for another kind."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return None
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(f"flashjit.{_FN}: kernel=True runs on the CPU or a "
                         f"CUDA device, got device {device!r}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _size(name, value, default):
    return default if value is None else _lib.int64(name, value)


def kernel_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None,
                      BLOCK_SIZE=128, like=None, cu_seqlens_q=None,
                      cu_seqlens_k=None):
    """create_block_mask(..., kernel=True): the BlockMask that
    flashjit_mask_blocks writes for mask_mod (a function of (b, h, i, j),
    traced, or a mask_mod region's text starting with "{"), B x H (None:
    1, the mask evaluated at 0; the layout broadcasts) by Q_LEN x KV_LEN
    positions in BLOCK_SIZE blocks, on the CPU handle (device None or
    "cpu") or on a CUDA device (queued on torch's current stream there,
    then copied to the host for the BlockMask, whose copy on that device
    is kept). The spec: block_sparse, sparse_block = BLOCK_SIZE, the
    mask_mod region, no other mask, gqa 1, head dims and dtype of like
    (None: 64 and bf16). With cu_seqlens_q and cu_seqlens_k (a varlen
    batch's int32 offsets, on the classification's device; Q_LEN, KV_LEN
    the longest sequences, B None or the sequences' count): a row per
    sequence, each classified on its own lengths and positions
    (flashjit_mask_blocks_varlen), for attention_varlen; the offsets are
    checked as attention_varlen checks them (_offsets). What the C API
    refuses is its InvalidArgumentError with its message."""
    _need_numpy()
    from . import _host_captures, _score_mod_and_captures

    text, captures = _score_mod_and_captures(None, mask_mod)
    head_dim, dtype = _spec_dims(like)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError(f"flashjit.{_FN}: a varlen batch takes both "
                         "cu_seqlens_q and cu_seqlens_k")
    dev = _cuda_device(device)
    offsets = ()
    if varlen:
        offsets, sequences = _offsets(cu_seqlens_q, cu_seqlens_k, dev)
        if B is not None and B != sequences:
            raise ValueError(f"flashjit.{_FN}: B is {B}, the offsets give "
                             f"{sequences} sequences (a row each)")
        B = sequences
    batch, heads = _size("B", B, 1), _size("H", H, 1)
    nq, nkv = _lib.int64("Q_LEN", Q_LEN), _lib.int64("KV_LEN", KV_LEN)
    bs = _lib.int64("BLOCK_SIZE", BLOCK_SIZE)
    spec = _lib.make_spec(head_dim, head_dim, dtype, _lib.MASK_NONE, 1, 1,
                          score_mod=text, varlen=varlen)
    # BLOCK_SIZE as given (0 and negatives too): the C API names a bad one.
    spec.block_sparse, spec.sparse_block = 1, bs
    # The layout's shape; out-of-range sizes give an empty one, which the
    # C API does not reach (it refuses the sizes first).
    qb = max(0, -(-nq // bs)) if bs >= 1 else 0
    kvb = max(0, -(-nkv // bs)) if bs >= 1 else 0
    shape = (max(0, batch), max(0, heads), qb, kvb)
    layout = _lib.Layout()
    layout.batch, layout.heads, layout.q_blocks, layout.kv_blocks = (
        batch, heads, qb, kvb)

    def call(handle, offsets, array, count, stream):
        """flashjit_mask_blocks(_varlen) of layout; offsets: the two
        offset pointers (varlen)."""
        if not varlen:
            return _lib.lib().flashjit_mask_blocks(
                handle, ctypes.byref(spec), batch, heads, nq, nkv,
                ctypes.byref(layout), array, count, stream)
        vl = _lib.make_varlen(*offsets, batch, nq, nkv)
        vl.layout = ctypes.addressof(layout)
        return _lib.lib().flashjit_mask_blocks_varlen(
            handle, ctypes.byref(spec), heads, ctypes.byref(vl), array, count,
            stream)

    if dev is None:
        counts = np.zeros(shape[:3], np.int32)
        indices = np.zeros(shape, np.int32)
        layout.counts = counts.ctypes.data
        layout.indices = indices.ctypes.data
        host = _host_captures(captures, _FN)
        caps, count = _lib.make_captured([(a.ctypes.data, a.size)
                                          for a in host])
        _lib.check(call(_lib.handle(_lib.DEVICE_CPU),
                        [c.ctypes.data for c in offsets], caps, count, None))
        return BlockMask(counts, indices, bs)
    return _cuda_block_mask(dev, call, layout, shape, captures, bs, offsets)


def _offsets(cu_q, cu_k, dev):
    """(offsets, sequences) of a varlen batch, checked as attention_varlen
    checks them: a torch tensor must be int32 and on the classification's
    device (dev; None: the CPU); numpy arrays and int sequences go through
    varlen.host_offsets (int32, nothing narrowed silently); both 1-D of one
    length (varlen.check_offset_shapes). The offsets as the call takes
    them: int32 numpy arrays for the CPU, int32 torch tensors on dev."""
    from . import varlen

    torch = sys.modules.get("torch")
    out = []
    for name, c in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if torch is not None and isinstance(c, torch.Tensor):
            if c.dtype != torch.int32:
                raise TypeError(f"flashjit.{_FN}: {name} must be int32 "
                                f"offsets, got {c.dtype}")
            where = dev if dev is not None else torch.device("cpu")
            if c.device != where:
                raise ValueError(f"flashjit.{_FN}: {name} is on {c.device}, "
                                 f"the classification runs on {where}")
            c = c.detach().contiguous()
            out.append(c if dev is not None else c.numpy())
        else:
            a = varlen.host_offsets(c, name, _FN)
            out.append(a if dev is None else torch.from_numpy(a).to(dev))
    return out, varlen.check_offset_shapes(tuple(out[0].shape),
                                           tuple(out[1].shape), _FN)


def _cuda_block_mask(dev, call, layout, shape, captures, bs, offsets):
    """kernel_block_mask on CUDA device dev: counts and indices zeroed on
    it, the captured tensors as float32 copies on it (a varlen batch's
    offsets already are: _offsets), the kernel queued on torch's current
    stream of dev."""
    import torch

    from . import _torch_impl
    from .ops import device_captures

    class _On:  # device_captures reads q.device only
        device = dev

    caps = [c.contiguous() for c in device_captures(captures, _On)]
    with torch.cuda.device(dev):
        counts = torch.zeros(shape[:3], dtype=torch.int32, device=dev)
        indices = torch.zeros(shape, dtype=torch.int32, device=dev)
        layout.counts = counts.data_ptr() or None
        layout.indices = indices.data_ptr() or None
        array, count = _lib.make_captured([(c.data_ptr(), c.numel())
                                           for c in caps])
        status = call(_torch_impl.cuda_handle(dev.index),
                      [c.data_ptr() for c in offsets], array, count,
                      _torch_impl._raw_stream(dev.index))
        _lib.check(status)
        bm = BlockMask(counts.cpu().numpy(), indices.cpu().numpy(), bs)
    # The device copies are the mask's own (attention finds them there):
    # their entries past a count hold the kernel's block classes, which no
    # kernel reads (the host copy's are 0, as BlockMask keeps them).
    bm._device_cache[str(dev)] = (counts, indices)
    del caps, array
    return bm
