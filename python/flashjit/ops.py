"""flashjit's attention as torch.library custom ops.

    flashjit::attention_fwd(q, k, v, mask, scale, window_left, window_right,
                            block_counts, block_indices, block_size,
                            deterministic, score_mod) -> (o, lse)
    flashjit::attention_bwd(d_o, q, k, v, o, lse, mask, scale, window_left,
                            window_right, block_counts, block_indices,
                            block_size, deterministic, score_mod)
                            -> (dq, dk, dv)

mask is the C API's flashjit_mask (0 none, 1 causal, 2 sliding window, its
sizes window_left / window_right, -1 unbounded); scale 0 means 1/sqrt(d);
block_counts / block_indices are a BlockMask's int32 BCSR tensors on the
inputs' device (None when dense) and block_size its block. deterministic
only changes how the backward sums dQ. score_mod is a named score modifier
("softcap:C", "alibi:H"), the text of a score_mod region, or "" for none.

A region that captures tensors (flashjit.score_ops, "Captured tensors")
goes through two more ops, the same with the captured tensors last:

    flashjit::attention_fwd_captured(q, k, v, mask, ..., score_mod,
                                     Tensor[] captures) -> (o, lse)
    flashjit::attention_bwd_captured(d_o, q, ..., score_mod,
                                     Tensor[] captures,
                                     bool[] capture_needs_grad)
                                     -> (dq, dk, dv, Tensor[] capture_grads)

captures: float32 tensors on q's device, in the order of the region's
%c0, %c1, ... arguments (flashjit.attention converts what the function
indexed: torch tensors by .to(q.device, float32), differentiably, numpy
arrays by a copy). capture_needs_grad: one bool per captured tensor, whose
gradient the backward computes; capture_grads holds those gradients, in
order, for the flagged tensors only (float32, each shaped as its tensor;
[] when none is flagged); with deterministic=True they are summed in
fixed point, the same bits run to run. (Signature change: until the C
API derived these gradients, attention_bwd_captured took no
capture_needs_grad and returned (dq, dk, dv).) They are separate ops
rather than a `Tensor[] captures = []` argument of the first two because
torch.library's schema inference takes no list default (and "Tensor[]?"
is not a type it infers): the existing ops' signatures stay as they are.
They run without the forward's per-shape plans (the C API's plans refuse
capturing specs). Autograd: dq, dk and dv, and the gradient of each
captured tensor that requires grad (it reaches the tensor the function
indexed through the differentiable .to(): cast back to its dtype and
device, and summed where a broadcast view was captured).

Variable-length packing (flashjit.attention_varlen; flashjit/varlen.py)
has two ops of its own, captured tensors included:

    flashjit::attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                   max_seqlen_q, max_seqlen_k, mask, scale,
                                   window_left, window_right, deterministic,
                                   score_mod, Tensor[] captures)
                                   -> (o, lse)
    flashjit::attention_varlen_bwd(d_o, q, k, v, o, lse, cu_seqlens_q,
                                   cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   mask, ..., score_mod, Tensor[] captures,
                                   bool[] capture_needs_grad)
                                   -> (dq, dk, dv, Tensor[] capture_grads)

q (total_q, H, d), k and v (total_k, Hkv, d|dv) packed, the offsets int32
[B + 1] on q's device (read on the host on the CPU only), max_seqlen_*
ints >= 1 (at least the longest sequence); o (total_q, H, dv) and lse
float32 [B, H, max_seqlen_q] (-inf in its padding rows); o and the
gradients are 0 in rows that belong to no sequence. Their fakes give
those shapes; autograd reaches q, k, v and the captured tensors that
require grad, as attention_fwd_captured's.

Both ops have fake (meta) implementations, so torch.compile, torch.export
and FakeTensor tracing see o as q's shape with v's head dim and lse as
float32 [B, H, Nq]; attention_fwd has an autograd formula (register_autograd)
that calls attention_bwd, whose own derivative is refused (no double
backward). flashjit.attention() goes through them whenever torch traces;
an eager call that needs no gradient takes the same kernel without the
dispatcher (the per-call path, about 2x cheaper), and an eager call that
needs one takes _eager.py's autograd.Function with the same formula (the
op's autograd dispatch cost 3.5x its host time).

Importing this module imports torch; `import flashjit` does not import it.
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _eager, _lib, _torch_impl, _torch_varlen, block_mask


class _TensorLayout:
    """An op's block_counts / block_indices as the layout the kernels take
    (a BlockMask's _device_layout / _host_layout), without copying them."""

    def __init__(self, counts, indices, block_size):
        for name, t in (("block_counts", counts), ("block_indices", indices)):
            if t.dtype != torch.int32 or not t.is_contiguous():
                raise ValueError(f"flashjit::attention: {name} must be a "
                                 "contiguous int32 tensor (a BlockMask's)")
        if counts.dim() != 3 or indices.dim() != 4:
            raise ValueError("flashjit::attention: block_counts must be "
                             "[B, H, Qb] and block_indices [B, H, Qb, KVb]")
        self.counts, self.indices, self.block_size = counts, indices, block_size

    def _layout(self):
        return (_lib.make_layout(self.counts.data_ptr(),
                                 self.indices.data_ptr(),
                                 (*self.counts.shape, self.indices.shape[3])),
                (self.counts, self.indices))

    def _device_layout(self, device):
        return self._layout()

    def _host_layout(self):
        return self._layout()

    def _kv_device_layout(self, device):
        """The KV-major transpose of the BlockMask these tensors are the
        device copies of (block_mask.owner_of), or None: the C API then
        makes it on the host."""
        bm = block_mask.owner_of(self.counts, self.indices)
        return bm._kv_device_layout(device) if bm is not None else None

    def _kv_host_layout(self):
        bm = block_mask.owner_of(self.counts, self.indices)
        return bm._kv_host_layout() if bm is not None else None


def _block_mask(counts, indices, block_size):
    """The layout of an op's block tensors (None when dense)."""
    if counts is None:
        return None
    return _TensorLayout(counts, indices, block_size)


@torch.library.custom_op("flashjit::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, mask: int, scale: float,
                  window_left: int, window_right: int,
                  block_counts: Optional[Tensor],
                  block_indices: Optional[Tensor], block_size: int,
                  deterministic: bool,
                  score_mod: str = "") -> Tuple[Tensor, Tensor]:
    bm = _block_mask(block_counts, block_indices, block_size)
    if q.device.type == "cuda":
        return _torch_impl.forward_cuda(q, k, v, mask, scale, window_left,
                                        window_right, bm, score_mod)
    return _torch_impl.forward_cpu(q, k, v, mask, scale, window_left,
                                   window_right, bm, score_mod)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, mask, scale, window_left, window_right,
                        block_counts, block_indices, block_size,
                        deterministic, score_mod=""):
    _torch_impl.check_inputs(q, k, v)
    B, H, Nq, _ = q.shape
    o = q.new_empty((B, H, Nq, v.shape[3]))
    lse = q.new_empty((B, H, Nq), dtype=torch.float32)
    return o, lse


@torch.library.custom_op("flashjit::attention_bwd", mutates_args=())
def attention_bwd(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor,
                  lse: Tensor, mask: int, scale: float, window_left: int,
                  window_right: int, block_counts: Optional[Tensor],
                  block_indices: Optional[Tensor], block_size: int,
                  deterministic: bool,
                  score_mod: str = "") -> Tuple[Tensor, Tensor, Tensor]:
    bm = _block_mask(block_counts, block_indices, block_size)
    run = (_torch_impl.backward_cuda if q.device.type == "cuda" else
           _torch_impl.backward_cpu)
    return run(q, k, v, o, lse, d_o, mask, scale, window_left, window_right,
               bm, deterministic, score_mod)[:3]


@attention_bwd.register_fake
def _attention_bwd_fake(d_o, q, k, v, o, lse, mask, scale, window_left,
                        window_right, block_counts, block_indices, block_size,
                        deterministic, score_mod=""):
    _torch_impl.check_inputs(q, k, v, "attention_backward")
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, mask, scale, wl, wr, counts, indices, block, det, mod = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, counts, indices)
    ctx.options = (mask, scale, wl, wr, block, det, mod)
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, d_o, d_lse):
    # lse is non-differentiable: d_lse is ignored.
    q, k, v, o, lse, counts, indices = ctx.saved_tensors
    mask, scale, wl, wr, block, det, mod = ctx.options
    if d_o is None:
        d_o = torch.zeros_like(o)
    dq, dk, dv = torch.ops.flashjit.attention_bwd(
        d_o, q, k, v, o, lse, mask, scale, wl, wr, counts, indices, block,
        det, mod)
    need = ctx.needs_input_grad
    return ((dq if need[0] else None), (dk if need[1] else None),
            (dv if need[2] else None)) + (None,) * 9


attention_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


def _bwd_setup_context(ctx, inputs, output):
    pass


def _bwd_backward(ctx, *grads):
    raise RuntimeError(
        "flashjit: attention's backward has no derivative: cannot "
        "differentiate twice (no double backward through flashjit.attention)")


attention_bwd.register_autograd(_bwd_backward, setup_context=_bwd_setup_context)


# -- captured tensors ---------------------------------------------------------


@torch.library.custom_op("flashjit::attention_fwd_captured", mutates_args=())
def attention_fwd_captured(q: Tensor, k: Tensor, v: Tensor, mask: int,
                           scale: float, window_left: int, window_right: int,
                           block_counts: Optional[Tensor],
                           block_indices: Optional[Tensor], block_size: int,
                           deterministic: bool, score_mod: str,
                           captures: List[Tensor]) -> Tuple[Tensor, Tensor]:
    """attention_fwd with the tensors score_mod's region captures."""
    bm = _block_mask(block_counts, block_indices, block_size)
    run = (_torch_impl.forward_cuda_captured if q.device.type == "cuda" else
           _torch_impl.forward_cpu)
    return run(q, k, v, mask, scale, window_left, window_right, bm,
               score_mod, captures)


@attention_fwd_captured.register_fake
def _attention_fwd_captured_fake(q, k, v, mask, scale, window_left,
                                 window_right, block_counts, block_indices,
                                 block_size, deterministic, score_mod,
                                 captures):
    _torch_impl.check_inputs(q, k, v)
    _torch_impl.check_captures(captures, q)
    B, H, Nq, _ = q.shape
    o = q.new_empty((B, H, Nq, v.shape[3]))
    lse = q.new_empty((B, H, Nq), dtype=torch.float32)
    return o, lse


@torch.library.custom_op("flashjit::attention_bwd_captured", mutates_args=())
def attention_bwd_captured(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor,
                           o: Tensor, lse: Tensor, mask: int, scale: float,
                           window_left: int, window_right: int,
                           block_counts: Optional[Tensor],
                           block_indices: Optional[Tensor], block_size: int,
                           deterministic: bool, score_mod: str,
                           captures: List[Tensor],
                           capture_needs_grad: List[bool]
                           ) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    """attention_bwd with the forward's captured tensors: (dq, dk, dv,
    the gradients of the captured tensors flagged in capture_needs_grad,
    in order)."""
    bm = _block_mask(block_counts, block_indices, block_size)
    run = (_torch_impl.backward_cuda if q.device.type == "cuda" else
           _torch_impl.backward_cpu)
    dq, dk, dv, grads = run(q, k, v, o, lse, d_o, mask, scale, window_left,
                            window_right, bm, deterministic, score_mod,
                            captures, capture_needs_grad)
    return dq, dk, dv, grads


@attention_bwd_captured.register_fake
def _attention_bwd_captured_fake(d_o, q, k, v, o, lse, mask, scale,
                                 window_left, window_right, block_counts,
                                 block_indices, block_size, deterministic,
                                 score_mod, captures, capture_needs_grad):
    _torch_impl.check_inputs(q, k, v, "attention_backward")
    return _fake_backward(q, k, v, captures, capture_needs_grad,
                          deterministic, "attention_backward")


def _fake_backward(q, k, v, captures, capture_needs_grad, deterministic, fn):
    """A captured backward op's fake result: dq, dk, dv shaped as q, k, v
    and a gradient per captured tensor flagged (captures and flags checked
    as the op checks them)."""
    _torch_impl.check_captures(captures, q, fn)
    flags = _torch_impl.capture_grad_flags(capture_needs_grad, captures, fn)
    grads = [c.new_empty(c.shape) for c, f in zip(captures, flags) if f]
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            grads)


def _needed(flag, n):
    """needs_input_grad's entry of a Tensor[] input as n bools: torch
    gives a list of bools (it flattens tensor lists for autograd), or one
    bool."""
    if isinstance(flag, (list, tuple)):
        return [bool(f) for f in flag]
    return [bool(flag)] * n


def _fwd_captured_setup_context(ctx, inputs, output):
    (q, k, v, mask, scale, wl, wr, counts, indices, block, det, mod,
     captures) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, counts, indices, *captures)
    ctx.options = (mask, scale, wl, wr, block, det, mod)
    ctx.num_captures = len(captures)
    ctx.mark_non_differentiable(lse)


def _score_mod_flags(flags, mod):
    """flags without the mask_mod's captured tensors (the last ones of
    mod's, _lib.mask_capture_count): a predicate's inputs take no gradient
    (None), even where they require one."""
    keep = len(flags) - _lib.mask_capture_count(mod)
    return [f and n < keep for n, f in enumerate(flags)]


def _fwd_captured_backward(ctx, d_o, d_lse):
    need = ctx.needs_input_grad
    saved = ctx.saved_tensors
    q, k, v, o, lse, counts, indices = saved[:7]
    captures = list(saved[7:])
    mask, scale, wl, wr, block, det, mod = ctx.options
    flags = _score_mod_flags(_needed(need[12], ctx.num_captures), mod)
    if d_o is None:
        d_o = torch.zeros_like(o)
    dq, dk, dv, grads = torch.ops.flashjit.attention_bwd_captured(
        d_o, q, k, v, o, lse, mask, scale, wl, wr, counts, indices, block,
        det, mod, captures, flags)
    grads = iter(grads)
    return ((dq if need[0] else None), (dk if need[1] else None),
            (dv if need[2] else None)) + (None,) * 9 + (
                [next(grads) if f else None for f in flags],)


attention_fwd_captured.register_autograd(
    _fwd_captured_backward, setup_context=_fwd_captured_setup_context)
attention_bwd_captured.register_autograd(_bwd_backward,
                                         setup_context=_bwd_setup_context)


def device_captures(captures, q):
    """What flashjit.attention's score_mod captured, as the captured ops
    take it: float32 tensors on q's device. torch tensors by .to()
    (differentiable: a tensor that requires grad keeps it, and autograd
    carries its gradient back through the cast and the copy); numpy
    arrays (and other array-likes) by a float32 copy (constants). Integer data past 2^24 (not
    exact in float32) is a ValueError where it is on the host."""
    from . import _host_captures, check_exact_integers

    out = []
    for n, c in enumerate(captures):
        if isinstance(c, Tensor):
            if (c.device.type == "cpu" and not c.dtype.is_floating_point
                    and c.dtype != torch.bool
                    and not torch.compiler.is_compiling()):
                check_exact_integers(c.detach().to(torch.int64).numpy(), n)
            out.append(c.to(device=q.device, dtype=torch.float32))
        else:
            host = _host_captures([c])[0]
            out.append(torch.from_numpy(host).to(q.device))
    return out


def attention(q, k, v, mask, scale, wl, wr, bm, deterministic, score_mod="",
              sinks=None, captures=()):
    """(o, lse) for flashjit.attention's torch tensors (checked arguments:
    mask, scale, window and bm come from its argument handling); with
    sinks, through flashjit.sinks' autograd function. captures: the
    tensors score_mod's region captures (score_ops.trace_with_captures):
    through the *_captured ops, or eagerly without autograd their kernels
    directly."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor)
            and isinstance(v, Tensor)):
        _torch_impl.check_inputs(q, k, v)  # names the one that is not
    if bm is not None:
        counts, indices = bm._device_tensors(q.device)
        block = bm.block_size
    else:
        counts = indices = None
        block = 0
    if captures:
        captures = device_captures(captures, q)
    if sinks is not None:
        from . import sinks as sinks_mod

        return sinks_mod.attention_torch(
            q, k, v, sinks, (mask, scale, wl, wr, counts, indices, block,
                             bool(deterministic), score_mod), captures)
    if (not torch.compiler.is_compiling() and type(q) is Tensor
            and type(k) is Tensor and type(v) is Tensor
            and q.device.type in ("cuda", "cpu")):
        if torch.is_grad_enabled() and any(
                t.requires_grad for t in (q, k, v, *captures)):
            # Eager with a gradient: the op's formula without the
            # dispatcher (_eager.py).
            return _eager.attention(q, k, v, mask, scale, wl, wr, counts,
                                    indices, block, bool(deterministic),
                                    score_mod, bm, captures)
        # Eager, no gradient: the op's kernel without the dispatcher.
        if q.device.type == "cpu":
            return _torch_impl.forward_cpu(q, k, v, mask, scale, wl, wr, bm,
                                           score_mod, captures)
        if captures:
            return _torch_impl.forward_cuda_captured(
                q, k, v, mask, scale, wl, wr, bm, score_mod, captures)
        return _torch_impl.forward_cuda(q, k, v, mask, scale, wl, wr, bm,
                                        score_mod)
    if captures:
        return torch.ops.flashjit.attention_fwd_captured(
            q, k, v, mask, scale, wl, wr, counts, indices, block,
            bool(deterministic), score_mod, captures)
    return torch.ops.flashjit.attention_fwd(q, k, v, mask, scale, wl, wr,
                                            counts, indices, block,
                                            bool(deterministic), score_mod)


# -- variable-length packing ----------------------------------------------------


@torch.library.custom_op("flashjit::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(q: Tensor, k: Tensor, v: Tensor,
                         cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         max_seqlen_q: int, max_seqlen_k: int, mask: int,
                         scale: float, window_left: int, window_right: int,
                         block_counts: Optional[Tensor],
                         block_indices: Optional[Tensor], block_size: int,
                         deterministic: bool, score_mod: str,
                         captures: List[Tensor]) -> Tuple[Tensor, Tensor]:
    """flashjit.attention_varlen's forward: (o (total_q, H, dv), lse
    float32 [B, H, max_seqlen_q]); block_counts / block_indices: a block
    mask over the sequences (None: dense)."""
    return _torch_varlen.forward_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask,
        scale, window_left, window_right, score_mod, captures,
        _block_mask(block_counts, block_indices, block_size))


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, mask, scale,
                               window_left, window_right, block_counts,
                               block_indices, block_size, deterministic,
                               score_mod, captures):
    _, _, B = _torch_varlen.check_varlen_inputs(q, k, v, cu_seqlens_q,
                                              cu_seqlens_k)
    _torch_impl.check_captures(captures, q, "attention_varlen")
    o = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    lse = q.new_empty((B, q.shape[1], max_seqlen_q), dtype=torch.float32)
    return o, lse


@torch.library.custom_op("flashjit::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor,
                         o: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                         cu_seqlens_k: Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, mask: int, scale: float,
                         window_left: int, window_right: int,
                         block_counts: Optional[Tensor],
                         block_indices: Optional[Tensor], block_size: int,
                         deterministic: bool, score_mod: str,
                         captures: List[Tensor],
                         capture_needs_grad: List[bool]
                         ) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    """attention_varlen_fwd's backward: (dq, dk, dv packed as q, k, v,
    the gradients of the captured tensors flagged in capture_needs_grad,
    in order)."""
    dq, dk, dv, grads = _torch_varlen.backward_varlen(
        q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, mask, scale, window_left, window_right, deterministic,
        score_mod, captures, capture_needs_grad,
        _block_mask(block_counts, block_indices, block_size))
    return dq, dk, dv, grads


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(d_o, q, k, v, o, lse, cu_seqlens_q,
                               cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask,
                               scale, window_left, window_right,
                               block_counts, block_indices, block_size,
                               deterministic, score_mod, captures,
                               capture_needs_grad):
    fn = "attention_backward_varlen"
    _torch_varlen.check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, fn)
    return _fake_backward(q, k, v, captures, capture_needs_grad,
                          deterministic, fn)


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, mask, scale, wl, wr, counts, indices,
     block, det, mod, captures) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, counts, indices,
                          *captures)
    ctx.options = (max_q, max_k, mask, scale, wl, wr, block, det, mod)
    ctx.num_captures = len(captures)
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, d_o, d_lse):
    # lse is non-differentiable: d_lse is ignored.
    need = ctx.needs_input_grad
    saved = ctx.saved_tensors
    q, k, v, o, lse, cu_q, cu_k, counts, indices = saved[:9]
    captures = list(saved[9:])
    max_q, max_k, mask, scale, wl, wr, block, det, mod = ctx.options
    flags = _score_mod_flags(_needed(need[16], ctx.num_captures), mod)
    if d_o is None:
        d_o = torch.zeros_like(o)
    dq, dk, dv, grads = torch.ops.flashjit.attention_varlen_bwd(
        d_o, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, mask, scale, wl, wr,
        counts, indices, block, det, mod, captures, flags)
    grads = iter(grads)
    return ((dq if need[0] else None), (dk if need[1] else None),
            (dv if need[2] else None)) + (None,) * 13 + (
                [next(grads) if f else None for f in flags],)


attention_varlen_fwd.register_autograd(_varlen_backward,
                                       setup_context=_varlen_setup_context)
attention_varlen_bwd.register_autograd(_bwd_backward,
                                       setup_context=_bwd_setup_context)


def attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, mask, scale, wl, wr,
                     deterministic, score_mod="", captures=(), bm=None):
    """(o, lse) for flashjit.attention_varlen's torch tensors (mask,
    scale and window checked there): the inputs checked, max_q / max_k
    computed from the offsets when None (on the host: a synchronization
    for CUDA offsets, refused while torch.compile traces), the offsets
    checked wherever they are read on the host; then the op, or eagerly
    without autograd its kernel directly."""
    from . import varlen

    fn = "attention_varlen"
    _torch_varlen.check_varlen_inputs(q, k, v, cu_q, cu_k, fn)
    compiling = torch.compiler.is_compiling()
    host = (max_q is None or max_k is None
            or (q.device.type == "cpu" and not compiling))
    if host:
        if compiling:
            raise ValueError(
                f"flashjit.{fn}: pass max_seqlen_q and max_seqlen_k (ints) "
                "under torch.compile: computing them reads the offsets on "
                "the host, which a traced graph cannot")
        # One copy to the host (CUDA: one synchronization of the stream).
        both = torch.cat([cu_q.detach(), cu_k.detach()]).cpu().numpy()
        hq, hk = both[:cu_q.shape[0]], both[cu_q.shape[0]:]
        lq = varlen.check_offsets(hq, q.shape[0], "cu_seqlens_q", fn)
        lk = varlen.check_offsets(hk, k.shape[0], "cu_seqlens_k", fn)
    else:
        lq = lk = None
    max_q = varlen.max_seqlen(max_q, lq, "max_seqlen_q", fn)
    max_k = varlen.max_seqlen(max_k, lk, "max_seqlen_k", fn)
    if captures:
        captures = device_captures(captures, q)
    captures = list(captures)
    eager = (not compiling and type(q) is Tensor and type(k) is Tensor
             and type(v) is Tensor)
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, *captures))
    if eager and not grad:
        # Eager, no gradient: the op's kernel without the dispatcher.
        return _torch_varlen.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k,
                                          mask, scale, wl, wr, score_mod,
                                          captures, bm)
    counts = indices = None
    if bm is not None:
        counts, indices = bm._device_tensors(q.device)
    block = bm.block_size if bm is not None else 0
    if eager and q.device.type in ("cuda", "cpu"):
        # Eager with a gradient: the op's formula (_eager.py).
        return _eager.varlen(q, k, v, (
            cu_q, cu_k, max_q, max_k, mask, scale, wl, wr, counts, indices,
            block, bool(deterministic), score_mod, bm), captures)
    return torch.ops.flashjit.attention_varlen_fwd(
        q, k, v, cu_q, cu_k, max_q, max_k, mask, scale, wl, wr, counts,
        indices, block, bool(deterministic), score_mod, captures)


__all__ = ["attention_fwd", "attention_bwd", "attention_fwd_captured",
           "attention_bwd_captured", "attention", "attention_varlen_fwd",
           "attention_varlen_bwd", "attention_varlen"]
