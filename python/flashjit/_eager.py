"""flashjit.attention's eager autograd path (torch tensors that need a
gradient, outside torch.compile): one torch.autograd.Function around the
planned forward and backward kernels, with the formula of the
flashjit::attention_fwd op's register_autograd (ops.py).

Why not the op: an eager call of a torch.library custom op with an autograd
formula goes through the dispatcher twice and fills the schema's defaults
(torch._library.utils.fill_defaults) on every call; with q, k, v requiring
grad that took ~90 us of host time a call here and 172 us on the H200
machine (T34-2), against 15-18 us without grad: as long as a short
kernel's time (a 1024-key window at N 8192 runs in ~0.15 ms), which a
benchmark with grad then partly timed. This path costs one
Function.apply (26 us with the call's checks here). torch.compile still traces the op (ops.attention takes
this path only when not compiling), and opcheck checks the op.

The same for calls whose regions capture tensors (flashjit::
attention_fwd_captured's formula: the captured tensors' gradients where
they require one and belong to the score_mod). A backward under
create_graph=True calls the backward op (flashjit::attention_bwd or
attention_bwd_captured), whose own formula refuses a second derivative
with flashjit's error, as the op path does.
"""

import torch

from . import _torch_impl, _torch_varlen


def _keep(ctx, q, k, v, o, lse, captures, options):
    """What a forward leaves its backward: q, k, v, o, lse and the captured
    tensors saved, the options; lse takes no gradient."""
    ctx.save_for_backward(q, k, v, o, lse, *captures)
    ctx.options = options
    ctx.mark_non_differentiable(lse)
    return o, lse


def _start_backward(ctx, d_o, mod):
    """(q, k, v, o, lse, captures, d_o, flags) of a backward: the saved
    tensors, d_o (zeros where autograd gives none; lse's gradient is
    ignored) and, per captured tensor (the inputs after q, k, v and the
    options), whether its gradient is computed (ops._score_mod_flags: not
    for the mask_mod's)."""
    from .ops import _score_mod_flags

    q, k, v, o, lse, *captures = ctx.saved_tensors
    flags = _score_mod_flags([bool(f) for f in ctx.needs_input_grad[4:]],
                             mod)
    if d_o is None:
        d_o = torch.zeros_like(o)
    return q, k, v, o, lse, captures, d_o, flags


def _gradients(ctx, dq, dk, dv, grads, flags):
    """backward's result: dq, dk, dv where their inputs need them, none for
    the options, then the flagged captured tensors' gradients (grads, in
    order)."""
    need = ctx.needs_input_grad
    grads = iter(grads)
    return ((dq if need[0] else None), (dk if need[1] else None),
            (dv if need[2] else None), None) + tuple(
                next(grads) if f else None for f in flags)


class _Attention(torch.autograd.Function):
    """(o, lse) of q, k, v; options = (mask, scale, window_left,
    window_right, block_counts, block_indices, block_size, deterministic,
    score_mod, bm): the op's arguments after v, and bm, their layout; the
    tensors the regions capture, if any, after options (their gradients
    as attention_fwd_captured's formula gives them)."""

    @staticmethod
    def forward(ctx, q, k, v, options, *captures):
        mask, scale, wl, wr, _, _, _, _, mod, bm = options
        if captures:
            run = (_torch_impl.forward_cuda_captured if q.is_cuda else
                   _torch_impl.forward_cpu)
            o, lse = run(q, k, v, mask, scale, wl, wr, bm, mod,
                         list(captures))
        else:
            run = (_torch_impl.forward_cuda if q.is_cuda else
                   _torch_impl.forward_cpu)
            o, lse = run(q, k, v, mask, scale, wl, wr, bm, mod)
        return _keep(ctx, q, k, v, o, lse, captures, options)

    @staticmethod
    def backward(ctx, d_o, d_lse):
        mask, scale, wl, wr, counts, indices, block, det, mod, bm = ctx.options
        q, k, v, o, lse, captures, d_o, flags = _start_backward(ctx, d_o, mod)
        grads = []
        if torch.is_grad_enabled():  # create_graph: the op refuses twice
            if captures:
                dq, dk, dv, grads = torch.ops.flashjit.attention_bwd_captured(
                    d_o, q, k, v, o, lse, mask, scale, wl, wr, counts,
                    indices, block, det, mod, captures, flags)
            else:
                dq, dk, dv = torch.ops.flashjit.attention_bwd(
                    d_o, q, k, v, o, lse, mask, scale, wl, wr, counts,
                    indices, block, det, mod)
        else:
            run = (_torch_impl.backward_cuda if q.is_cuda else
                   _torch_impl.backward_cpu)
            dq, dk, dv, grads = run(q, k, v, o, lse, d_o, mask, scale, wl, wr,
                                    bm, det, mod, captures, flags)
        return _gradients(ctx, dq, dk, dv, grads, flags)


class _Varlen(torch.autograd.Function):
    """attention_varlen_fwd's formula: packed q, k, v; options = (cu_q,
    cu_k, max_q, max_k, mask, scale, window_left, window_right,
    block_counts, block_indices, block_size, deterministic, score_mod,
    bm: the BlockMask of the block tensors), the captured tensors after
    them."""

    @staticmethod
    def forward(ctx, q, k, v, options, *captures):
        cu_q, cu_k, max_q, max_k, mask, scale, wl, wr = options[:8]
        mod, bm = options[12:]
        o, lse = _torch_varlen.forward_varlen(q, k, v, cu_q, cu_k, max_q,
                                              max_k, mask, scale, wl, wr, mod,
                                              list(captures), bm)
        return _keep(ctx, q, k, v, o, lse, captures, options)

    @staticmethod
    def backward(ctx, d_o, d_lse):
        (cu_q, cu_k, max_q, max_k, mask, scale, wl, wr, counts, indices,
         block, det, mod, bm) = ctx.options
        q, k, v, o, lse, captures, d_o, flags = _start_backward(ctx, d_o, mod)
        if torch.is_grad_enabled():  # create_graph: the op refuses twice
            dq, dk, dv, grads = torch.ops.flashjit.attention_varlen_bwd(
                d_o, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, mask, scale,
                wl, wr, counts, indices, block, det, mod, captures, flags)
        else:
            dq, dk, dv, grads = _torch_varlen.backward_varlen(
                q, k, v, o, lse, d_o, cu_q, cu_k, max_q, max_k, mask, scale,
                wl, wr, det, mod, captures, flags, bm)
        return _gradients(ctx, dq, dk, dv, grads, flags)


def varlen(q, k, v, options, captures):
    """(o, lse) with autograd, as torch.ops.flashjit.attention_varlen_fwd
    gives them (options: _Varlen's)."""
    return _Varlen.apply(q, k, v, options, *captures)


def attention(q, k, v, mask, scale, wl, wr, counts, indices, block,
              deterministic, score_mod, bm, captures=()):
    """(o, lse) with autograd, as torch.ops.flashjit.attention_fwd (or,
    with captures, attention_fwd_captured) gives them (bm: the BlockMask
    whose device copies counts / indices are, or None)."""
    return _Attention.apply(q, k, v, (mask, scale, wl, wr, counts, indices,
                                      block, deterministic, score_mod, bm),
                            *captures)
