"""The kernels behind flashjit's varlen torch ops (flashjit.varlen,
flashjit::attention_varlen_fwd / _bwd): packed torch tensors, their
sequences' int32 offsets on the tensors' device. No plans (the C API's
plans refuse varlen specs): each call builds its structs and calls
flashjit_forward_varlen / flashjit_backward_varlen, on torch's current
stream on CUDA (the offsets are device pointers there, not read on the
host), through the numpy path on the CPU (the offsets read and checked on
the host). The tensor checks, captured tensors and the CUDA handles are
flashjit._torch_impl's.
"""

import ctypes

import torch

from . import _lib
from ._torch_impl import (_by, _captured_structs, _from_numpy, _on_device,
                          _raw_stream, _to_numpy, capture_grad_flags,
                          captured_workspace_size, check_captures,
                          check_torch_qkv, cuda_handle)


def check_varlen_inputs(q, k, v, cu_q, cu_k, fn="attention_varlen"):
    """(flashjit dtype, gqa, batch) of packed torch q, k, v and their
    offsets: named TypeError / ValueError for tensors of the wrong kind,
    dtype, device or shape (no offset is read)."""
    from . import varlen

    dtype = check_torch_qkv(q, k, v, fn)
    gqa = varlen.check_shapes(q.shape, k.shape, v.shape, fn)
    for name, c in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(c, torch.Tensor):
            raise TypeError(
                f"flashjit.{fn}: {name} must be an int32 torch tensor on "
                f"q's device ({q.device}), got a {type(c).__name__}")
        if c.dtype != torch.int32:
            raise TypeError(f"flashjit.{fn}: {name} must be int32 offsets, "
                            f"got {c.dtype}")
        if c.device != q.device:
            raise ValueError(f"flashjit.{fn}: {name} is on {c.device}, q on "
                             f"{q.device}: the offsets must be on q's device")
    B = varlen.check_offset_shapes(cu_q.shape, cu_k.shape, fn)
    return dtype, gqa, B


def _varlen_struct(name, t, fn):
    """flashjit_tensor {1, H, T, d} of a packed (T, H, d) torch tensor."""
    if t.shape[2] > 1 and t.stride(2) != 1:
        raise ValueError(
            f"flashjit.{fn}: {name}'s innermost (head-dim) stride must be 1, "
            f"got {t.stride(2)} (strides {tuple(t.stride())})")
    return _lib.make_tensor(t.data_ptr(), (1, t.shape[1], t.shape[0],
                                           t.shape[2]),
                            (0, t.stride(1), t.stride(0), 1))


def _host_offsets(cu_q, cu_k, q, k, fn):
    """The CPU tensors' offsets as numpy int32, checked on the host."""
    from . import varlen

    hq, hk = cu_q.detach().contiguous().numpy(), cu_k.detach().contiguous().numpy()
    varlen.check_offsets(hq, q.shape[0], "cu_seqlens_q", fn)
    varlen.check_offsets(hk, k.shape[0], "cu_seqlens_k", fn)
    return hq, hk


def forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, mask, scale, wl, wr,
                   score_mod="", captures=(), bm=None):
    """(o, lse) of packed torch tensors: o (total_q, H, dv), zero in the
    rows of no sequence; lse float32 [B, H, max_q], -inf in the padding
    rows. CUDA: flashjit_forward_varlen on torch's current stream (the
    offsets not read on the host); CPU: the CPU execution mode. bm: a
    block mask (a BlockMask or the op's block tensors) or None."""
    fn = "attention_varlen"
    dtype, gqa, B = check_varlen_inputs(q, k, v, cu_q, cu_k, fn)
    caps = check_captures(captures, q, fn)
    T, H, D = q.shape
    Dv = v.shape[2]
    if q.device.type == "cpu":
        from . import varlen

        hq, hk = _host_offsets(cu_q, cu_k, q, k, fn)
        o, lse = varlen.forward_numpy(
            _to_numpy(q), _to_numpy(k), _to_numpy(v), hq, hk, max_q, max_k,
            mask, scale, wl, wr, score_mod, [c.detach() for c in caps], fn,
            bm=bm)
        return _from_numpy(o, q.dtype), torch.from_numpy(lse)
    if q.device.type != "cuda":
        raise ValueError(f"flashjit.{fn}: needs CUDA or CPU tensors, got "
                         f"{q.device}")
    o = torch.zeros((T, H, Dv), dtype=q.dtype, device=q.device)
    lse = torch.full((B, H, max_q), float("-inf"), dtype=torch.float32,
                     device=q.device)
    if T == 0 or k.shape[0] == 0:  # nothing to compute: no query or no key
        return o, lse
    structs = [_varlen_struct(n, t, fn) for n, t in
               (("q", q), ("k", k), ("v", v), ("o", o))]
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    vl = _lib.make_varlen(cu_q.data_ptr(), cu_k.data_ptr(), B, max_q, max_k)
    sparse, layout = _device_layout(vl, bm, q.device)
    spec = _lib.make_spec(D, Dv, dtype, mask, gqa, sparse,
                          score_mod=score_mod, varlen=True)
    array, count = _captured_structs(caps)
    run = _lib.lib().flashjit_forward_varlen

    def launch(index):
        status = run(cuda_handle(index), _by(spec), *(_by(t) for t in structs),
                     lse.data_ptr(), scale, wl, wr, _by(vl), array, count,
                     _raw_stream(index))
        if status:
            _lib.check(status)

    _on_device(q.device.index if q.device.index is not None else 0, launch)
    del caps, array, layout
    return o, lse


def _device_layout(vl, bm, device, backward=False):
    """(sparse_block, objects to keep alive): bm's layout on device set
    into Varlen vl, and for the backward its KV-major transpose where bm
    has one; (0, ()) without a layout."""
    if bm is None:
        return 0, ()
    layout, keep = bm._device_layout(device)
    vl.layout = ctypes.addressof(layout)
    kv = bm._kv_device_layout(device) if backward else None
    if kv is not None:
        vl.kv_layout = ctypes.addressof(kv[0])
    return bm.block_size, (layout, keep, kv)


def backward_varlen(q, k, v, o, lse, d_o, cu_q, cu_k, max_q, max_k, mask,
                    scale, wl, wr, deterministic, score_mod="", captures=(),
                    capture_grads=None, bm=None):
    """(dq, dk, dv, capture_grads) of packed torch tensors: the gradients
    packed as q, k, v (zero in the rows of no sequence), and the flagged
    captured tensors' gradients (backward_cuda's convention). CUDA:
    flashjit_backward_varlen on torch's current stream, its workspace a
    torch tensor; CPU: the CPU execution mode."""
    fn = "attention_backward_varlen"
    dtype, gqa, B = check_varlen_inputs(q, k, v, cu_q, cu_k, fn)
    caps = check_captures(captures, q, fn)
    flags = capture_grad_flags(
        [False] * len(caps) if capture_grads is None else capture_grads,
        caps, fn)
    T, H, D = q.shape
    Dv = v.shape[2]
    if tuple(o.shape) != (T, H, Dv) or tuple(d_o.shape) != (T, H, Dv):
        raise ValueError(f"flashjit.{fn}: o and d_o must be {(T, H, Dv)}, "
                         f"got {tuple(o.shape)} and {tuple(d_o.shape)}")
    if tuple(lse.shape) != (B, H, max_q) or lse.dtype != torch.float32:
        raise ValueError(f"flashjit.{fn}: lse must be float32 "
                         f"{(B, H, max_q)} (the forward's), got "
                         f"{lse.dtype} {tuple(lse.shape)}")
    if q.device.type == "cpu":
        from . import varlen

        hq, hk = _host_offsets(cu_q, cu_k, q, k, fn)
        *grads, cgrads = varlen.backward_numpy(
            *(_to_numpy(t) for t in (q, k, v, o, d_o)),
            lse.detach().numpy(), hq, hk, max_q, max_k, mask, scale, wl, wr,
            deterministic, score_mod, [c.detach() for c in caps], flags, fn,
            bm=bm)
        return tuple(torch.empty_like(t).copy_(_from_numpy(g, q.dtype))
                     for t, g in zip((q, k, v), grads)) + (
                         [torch.from_numpy(g) for g in cgrads
                          if g is not None],)
    if q.device.type != "cuda":
        raise ValueError(f"flashjit.{fn}: needs CUDA or CPU tensors, got "
                         f"{q.device}")
    if d_o.dtype != o.dtype:
        d_o = d_o.to(o.dtype)
    if d_o.shape[2] > 1 and d_o.stride(2) != 1:  # e.g. an expanded grad
        d_o = d_o.contiguous()
    # Zeroed: the rows of no sequence keep 0 (the kernels write the rest).
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    grads = [torch.zeros(c.shape, dtype=torch.float32, device=c.device)
             if f else None for c, f in zip(caps, flags)]
    out = [g for g in grads if g is not None]
    if T == 0 or k.shape[0] == 0:  # no query or no key: all gradients 0
        return dq, dk, dv, out
    structs = [_varlen_struct(n, t, fn) for n, t in
               (("q", q), ("k", k), ("v", v), ("o", o), ("d_o", d_o),
                ("dq", dq), ("dk", dk), ("dv", dv))]
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    lse = lse.contiguous()
    vl = _lib.make_varlen(cu_q.data_ptr(), cu_k.data_ptr(), B, max_q, max_k)
    sparse, layout = _device_layout(vl, bm, q.device, backward=True)
    spec = _lib.make_spec(D, Dv, dtype, mask, gqa, sparse,
                          deterministic=deterministic, score_mod=score_mod,
                          varlen=True)
    index = q.device.index if q.device.index is not None else 0

    def launch(index):
        h = cuda_handle(index)
        array, count = _captured_structs(caps, grads)
        # With deterministic captured gradients, their words too.
        size = captured_workspace_size(h, _by(spec), (B, H, max_q, max_k),
                                       array, count)
        workspace = torch.empty(size, dtype=torch.uint8, device=q.device)
        status = _lib.lib().flashjit_backward_varlen(
            h, _by(spec), *(_by(t) for t in structs[:5]), lse.data_ptr(),
            *(_by(t) for t in structs[5:]), scale, wl, wr, _by(vl),
            workspace.data_ptr(), size, array, count,
            _raw_stream(index))
        del workspace, array
        if status:
            _lib.check(status)

    _on_device(index, launch)
    return dq, dk, dv, out
