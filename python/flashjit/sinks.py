"""Attention sinks: a learnable logit per query head in each row's softmax
denominator (gpt-oss), forward and backward, numpy and torch.

With sink logit t_h of query head h, row i of head h is

    o'_i = sum_j exp(s_ij - lse'_i) v_j,   lse'_i = log(exp(lse_i) + exp(t_h))

where lse_i is the row's logsumexp without the sink: the sink is a key
whose value is 0. So o' = o * exp(lse - lse') of the kernel's (o, lse),
and the backward is the kernel's backward given (o', lse'): it recomputes
P' = exp(s - lse') and D' = rowsum(dO o'), which are the sink attention's.
The sink's own gradient is

    d t_h = -sum over batches and rows of exp(t_h - lse'_i) D'_i

(its probability times d(score) of a key whose value is 0). A row that
sees no key gives o' = 0 and lse' = t_h. These are a few elementwise
passes over o and lse around the kernels (not yet folded into the
kernels' epilogue).
"""

__all__ = ["check_sinks", "apply_numpy", "sink_grad_numpy", "attention_torch"]


def check_sinks(sinks, heads, fn="attention"):
    """sinks must have one value per query head."""
    shape = tuple(getattr(sinks, "shape", ()))
    if shape != (heads,):
        raise ValueError(f"flashjit.{fn}: sinks must hold one logit per "
                         f"query head, shape ({heads},), got {shape}")


def apply_numpy(o, lse, sinks):
    """(o', lse') of numpy (o, lse) with the sink logits: o' in o's dtype,
    lse' float32."""
    import numpy as np

    t = np.asarray(sinks, dtype=np.float64)[None, :, None]
    with np.errstate(divide="ignore"):
        lse2 = np.logaddexp(lse.astype(np.float64), t)
    factor = np.exp(lse.astype(np.float64) - lse2)[..., None]
    o2 = (o.astype(np.float64) * factor).astype(o.dtype)
    return o2, lse2.astype(np.float32)


def sink_grad_numpy(o, d_o, lse, sinks):
    """d t_h of the sink attention's (o', lse') for upstream d_o."""
    import numpy as np

    t = np.asarray(sinks, dtype=np.float64)
    delta = (d_o.astype(np.float64) * o.astype(np.float64)).sum(-1)
    p = np.exp(t[None, :, None] - lse.astype(np.float64))
    return (-(p * delta).sum(axis=(0, 2))).astype(np.asarray(sinks).dtype)


def attention_torch(q, k, v, sinks, options, captures=()):
    """(o', lse') of flashjit.attention's torch tensors with sinks;
    options are flashjit::attention_fwd's arguments after q, k, v;
    captures, the tensors its score_mod region captures (float32 on q's
    device; then the *_captured ops run). Autograd reaches q, k, v, sinks
    and each captured tensor that requires grad (the kernel's backward
    given (o', lse') recomputes the sink attention's P' and D', so its
    capture gradients are the sink attention's)."""
    return _function().apply(q, k, v, sinks, options, *captures)


_FUNCTION = None


def _function():
    """The autograd.Function, defined on first use (importing this module
    does not import torch)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    def apply(o, lse, sinks):
        t = sinks.to(torch.float32)[None, :, None]
        lse2 = torch.logaddexp(lse, t)
        o2 = (o.to(torch.float32) * torch.exp(lse - lse2)[..., None])
        return o2.to(o.dtype), lse2

    class WithSinks(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, sinks, options, *captures):
            if captures:
                o, lse = torch.ops.flashjit.attention_fwd_captured(
                    q, k, v, *options, list(captures))
            else:
                o, lse = torch.ops.flashjit.attention_fwd(q, k, v, *options)
            o2, lse2 = apply(o, lse, sinks)
            ctx.save_for_backward(q, k, v, o2, lse2, sinks, *captures)
            ctx.options = options
            ctx.mark_non_differentiable(lse2)
            return o2, lse2

        @staticmethod
        def backward(ctx, d_o, d_lse):
            q, k, v, o2, lse2, sinks = ctx.saved_tensors[:6]
            captures = list(ctx.saved_tensors[6:])
            flags = [bool(f) for f in ctx.needs_input_grad[5:]]
            (mask, scale, wl, wr, counts, indices, block, det,
             mod) = ctx.options
            if d_o is None:
                d_o = torch.zeros_like(o2)
            cgrads = [None] * len(captures)
            if captures:
                dq, dk, dv, grads = torch.ops.flashjit.attention_bwd_captured(
                    d_o.contiguous(), q, k, v, o2, lse2, mask, scale, wl,
                    wr, counts, indices, block, det, mod, captures, flags)
                grads = iter(grads)
                cgrads = [next(grads) if f else None for f in flags]
            else:
                dq, dk, dv = torch.ops.flashjit.attention_bwd(
                    d_o.contiguous(), q, k, v, o2, lse2, mask, scale, wl,
                    wr, counts, indices, block, det, mod)
            delta = (d_o.to(torch.float32) * o2.to(torch.float32)).sum(-1)
            p = torch.exp(sinks.to(torch.float32)[None, :, None] - lse2)
            dsinks = -(p * delta).sum(dim=(0, 2))
            return (dq, dk, dv, dsinks.to(sinks.dtype), None) + tuple(cgrads)

    _FUNCTION = WithSinks
    return _FUNCTION
