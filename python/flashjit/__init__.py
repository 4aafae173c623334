"""flashjit: JIT-compiled FlashAttention kernels, from Python.

A ctypes binding of libflashjit.so's C API: no compiled extension, any
Python >= 3.9, any recent torch. torch is imported only when torch tensors
are passed in; numpy only for numpy inputs and BlockMask.

    import torch, flashjit
    q = torch.randn(2, 8, 1024, 96, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 1024, 96, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 1024, 96, device="cuda", dtype=torch.bfloat16)
    o = flashjit.attention(q, k, v, causal=True)      # GQA: 8 / 2 heads

Variable-length batches (sequences of different lengths packed one after
another, FlashAttention's varlen layout): flashjit.attention_varlen(q, k,
v, cu_seqlens_q, cu_seqlens_k, ...) (flashjit/varlen.py).

Devices:
  * torch CUDA tensors (bfloat16 or float16) run on the GPU, on torch's
    current stream of the tensors' device, without synchronizing; autograd
    runs the backward there too.
  * numpy arrays run in the CPU execution mode (MLIR's JIT on host
    threads): float16 computes in fp16 and returns float16; float32 is
    rounded to bf16 for the kernel (the kernel's inputs are 16-bit) and the
    bf16 result is returned as float32.
"""

from . import _lib
from ._lib import (
    CompileError,
    CudaError,
    FlashjitError,
    InvalidArgumentError,
    LibraryNotFoundError,
    NoDriverError,
    NotImplementedFlashjitError,
    library_path,
)
from .block_mask import BlockMask
from . import mask_mods  # noqa: F401  (flashjit.mask_mods)
from . import score_ops
from . import sinks as sinks_mod
from . import variants
from .varlen import attention_backward_varlen, attention_varlen

# The helpers below the entry points live in their own modules: argument
# handling (_arguments), the numpy CPU path (_numpy_cpu) and compile() /
# Kernel (_kernel). They are imported here, so every name stays
# importable from the package (flashjit._block, from . import
# _backward_numpy, ...), as flashjit.varlen, flashjit.ops,
# flashjit.mask_blocks, flashjit._torch_impl and the tests use them.
from ._arguments import (  # noqa: F401  (re-exported)
    _F32_EXACT_INT, _block, _captured_args, _check_shapes, _host_captures,
    _is_torch, _kv_group, _mask_and_window, _scale, _score_mod,
    _score_mod_and_captures, _score_text_and_captures, check_exact_integers)
from ._kernel import _DTYPE_NAMES, Kernel, compile  # noqa: F401
from ._numpy_cpu import (  # noqa: F401  (re-exported)
    _attention_numpy, _backward_numpy, _bf16_bits_to_f32,
    _differentiable_capture, _f32_to_bf16_bits, _grad_like, _numpy_kind,
    _numpy_tensor)

__all__ = [
    "attention",
    "compile",
    "Kernel",
    "BlockMask",
    "version",
    "library_path",
    "FlashjitError",
    "InvalidArgumentError",
    "NoDriverError",
    "CompileError",
    "CudaError",
    "NotImplementedFlashjitError",
    "attention_backward",
    "attention_varlen",
    "attention_backward_varlen",
    "LibraryNotFoundError",
    "score_ops",
    "variants",
    "create_block_mask",
]

__version__ = "0.1.0"


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None,
                      BLOCK_SIZE=128, *, kernel=False, like=None,
                      cu_seqlens_q=None, cu_seqlens_k=None):
    """FlexAttention's create_block_mask, for flashjit: the BlockMask of
    the blocks where mask_mod(b, h, i, j) keeps any element
    (BlockMask.from_mask_mod; B or H None broadcasts). Pass it with the
    same mask_mod: attention(q, k, v, mask_mod=fn, block_mask=bm).

    kernel=True: the layout comes from flashjit's own block-classification
    kernel (the C API's flashjit_mask_blocks) rather than from evaluating
    mask_mod in Python: mask_mod (a function, traced as attention's, or a
    mask_mod region's text starting with "{") is compiled with a
    block-sparse forward spec (sparse_block = BLOCK_SIZE, the mask_mod
    region, gqa 1, head dims and dtype of like=q, a numpy array or torch
    tensor shaped (B, H, N, d); without like head dim 64 and bf16) and
    evaluated per block pair, never N x N, on the CPU (device None or
    "cpu") or on a CUDA device (torch's current stream). The result equals
    from_mask_mod's (the same blocks and full marks). That kernel is
    compiled once per spec and cached in the process; with like=q, a later
    attention(q, k, v, mask_mod=fn, block_mask=bm) on the same device (k
    and v with q's heads and head dim, no other mask or score_mod) finds
    it compiled. With cu_seqlens_q and cu_seqlens_k (kernel=True only):
    the layout of a varlen batch for attention_varlen, a row per sequence
    (B None or their count; Q_LEN, KV_LEN the longest), each sequence
    classified on its own lengths and positions. What the C API refuses
    (no mask_mod, a bad BLOCK_SIZE or size) is its InvalidArgumentError
    with its message."""
    if kernel:
        from .mask_blocks import kernel_block_mask

        return kernel_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device,
                                 BLOCK_SIZE, like, cu_seqlens_q, cu_seqlens_k)
    if like is not None or cu_seqlens_q is not None or \
            cu_seqlens_k is not None:
        raise ValueError("flashjit.create_block_mask: like= and "
                         "cu_seqlens_* are the classification kernel's: "
                         "each needs kernel=True")
    return BlockMask.from_mask_mod(mask_mod, B, H, Q_LEN, KV_LEN,
                                   block_size=BLOCK_SIZE, device=device)


def version():
    """libflashjit.so's version string."""
    return _lib.lib().flashjit_version().decode()


# ---------------------------------------------------------------------------
# attention()
# ---------------------------------------------------------------------------

# The eager torch CUDA forward's short path (flashjit._torch_impl's
# fast_forward: a cached plan, one foreign call), set when that module is
# first imported (by the first call with torch tensors); None until then.
# It returns None for every call it does not take (autograd, tracing,
# masks other than causal, CPU tensors, ...), which then go the general way.
_torch_forward = None



def attention(q, k, v, causal=False, scale=None, window=None, block_mask=None,
              return_lse=False, deterministic=False, score_mod=None,
              mask_mod=None, sinks=None):
    """softmax(scale * q k^T + mask) v.

    q: (B, H, Nq, d); k: (B, Hkv, Nkv, d); v: (B, Hkv, Nkv, dv), with H a
    multiple of Hkv (GQA; Hkv = H is multi-head attention). Outer strides are
    arbitrary; the innermost (head-dim) stride must be 1.

    causal: bottom-right aligned (query i sees keys j <= i + Nkv - Nq).
    scale: default 1/sqrt(d).
    window: (left, right): query i sees keys j with
        i + (Nkv - Nq) - left <= j <= i + (Nkv - Nq) + right; None on a side
        is unbounded. Exclusive with causal (causal is (None, 0)).
    block_mask: a flashjit.BlockMask (or FlexAttention's BlockMask) whose
        blocks cover ceil(Nq / block) x ceil(Nkv / block).
    return_lse: also return lse (B, H, Nq) float32, the natural-log
        logsumexp of each row's scaled scores (-inf where a row sees no key;
        its output row is 0).
    deterministic: how autograd's backward sums dq: False (default), by
        atomic adds into an fp32 buffer from the dk/dv loop (faster; dq's
        last bits may vary run to run); True, by a separate pass over query
        blocks, bit-identical run to run. The forward is the same either way.
    score_mod: a score modifier on s = scale * q.k, forward and backward:
        a function fn(s, b, h, i, j) of the score and its batch, query head,
        query row and key row, e.g. lambda s, b, h, i, j: s - 0.1 * abs(i -
        j), traced into the kernel (flashjit.score_ops lists what it may
        use; the backward's derivative is the compiler's); a named one,
        "softcap:C" (C tanh(s / C)) or "alibi:H" (s + 2^(-8 (h + 1) / H) (j
        - i), H the query heads); None (default) for none. A function may
        read tensors indexed by the positions (captured tensors, as
        FlexAttention's): lambda s, b, h, i, j: s + bias[h, i, j] with a
        torch tensor bias, or score_ops.captured(array)[h, i, j] for a
        numpy array; they are passed to the kernel as float32 copies on q's
        device at each call (flashjit.score_ops, "Captured tensors").
        Autograd reaches a captured torch tensor that requires grad (a
        learned bias or slopes; summed by atomic adds, or with
        deterministic=True in 64-bit fixed point, the same bits run to
        run); numpy:
        attention_backward(..., capture_grads=True). flashjit.variants
        makes the common ones (softcap, alibi, relative_position_bias,
        bias; masks causal, sliding_window, document, and_masks,
        or_masks).
    mask_mod: a function fn(b, h, i, j) -> predicate (comparisons of the
        positions combined with & | ~), e.g. lambda b, h, i, j: (i - j <
        256) & (j <= i): keys where it does not hold are masked (on top of
        causal / window / block_mask). Traced into the description's
        mask_mod region (flashjit.mask_mods), which the kernel evaluates
        after the score_mod; blocks it masks whole are skipped only where
        a block_mask says so. It may index captured tensors too (a document
        mask: seg[i] == seg[j]); they take no gradient.
    sinks: attention sinks, one learnable logit per query head (shape (H,),
        any float dtype; gpt-oss): each row's softmax denominator gains
        exp(sinks[h]), as a key whose value is 0; lse includes it. Autograd
        reaches sinks (torch); numpy: attention_backward(..., sinks=)
        returns its gradient too (flashjit.sinks).

    torch CUDA tensors (bfloat16/float16) run on the GPU, with autograd: the
    backward recomputes from the saved q, k, v, o and lse (dk and dv summed
    over each GQA group; no double backward); numpy arrays (float16, or
    float32 via bf16) run on the CPU (their backward: attention_backward).
    """
    fast = _torch_forward
    if (fast is not None and score_mod is None and mask_mod is None
            and window is None and block_mask is None and sinks is None):
        out = fast(q, k, v, causal, scale, return_lse)
        if out is not None:
            return out if return_lse else out[0]
    score_mod, captures = _score_mod_and_captures(score_mod, mask_mod)
    mask, wl, wr = _mask_and_window(causal, window)
    scale = _scale(scale)
    bm = _block(block_mask)
    if sinks is not None:
        sinks_mod.check_sinks(sinks, q.shape[1])
    if _is_torch(q) or _is_torch(k) or _is_torch(v):
        return _attention_torch(q, k, v, mask, scale, wl, wr, bm, return_lse,
                                bool(deterministic), score_mod, sinks,
                                captures)
    if sinks is not None:
        o, lse = _attention_numpy(q, k, v, mask, scale, wl, wr, bm, True,
                                  score_mod, captures)
        o, lse = sinks_mod.apply_numpy(o, lse, sinks)
        return (o, lse) if return_lse else o
    return _attention_numpy(q, k, v, mask, scale, wl, wr, bm, return_lse,
                            score_mod, captures)


def attention_backward(q, k, v, o, d_o, lse, causal=False, scale=None,
                       window=None, block_mask=None, deterministic=False,
                       score_mod=None, mask_mod=None, sinks=None,
                       capture_grads=False):
    """dq, dk, dv of attention(q, k, v, ...) for the upstream gradient d_o,
    recomputed from the forward's o and lse (return_lse=True), on the CPU
    for numpy arrays (the same dtypes as attention's numpy path). dk and dv
    are summed over each GQA group. dq: by atomic adds into an fp32 buffer
    (default; its last bits may vary run to run), or with deterministic=True
    by a separate pass over Q blocks, bit-identical run to run. (torch CUDA
    tensors get their backward from autograd: attention(...).backward().)
    With sinks (o and lse then attention(..., sinks=)'s): (dq, dk, dv,
    dsinks). A score_mod or mask_mod that captures tensors reads the same
    data as the forward did (pass the same function and tensors).

    capture_grads: False (default): the captured tensors are constants.
    True: one more element at the end, a list with one entry per captured
    tensor in the region's order (first use while tracing;
    score_ops.trace_with_captures lists them): d loss / d tensor, shaped as
    the tensor and of its dtype (a numpy array; a torch tensor for a
    captured torch tensor), computed by the compiler's derivative of the
    region at each read and summed by atomic adds (float32; with
    deterministic=True in 64-bit fixed point, two words 2^-56 apart from
    2^38, so the same bits run to run); None for an integer or bool tensor
    (segment ids: no gradient). So (dq, dk, dv[, dsinks], [d_capture,
    ...]); [] when nothing is captured."""
    mask, wl, wr = _mask_and_window(causal, window)
    if sinks is not None:
        sinks_mod.check_sinks(sinks, q.shape[1], "attention_backward")
    text, captures = _score_mod_and_captures(score_mod, mask_mod)
    # A mask_mod's captured tensors (the last ones) take no gradient.
    masked = _lib.mask_capture_count(text)
    wanted = ([_differentiable_capture(c) and n < len(captures) - masked
               for n, c in enumerate(captures)]
              if capture_grads else None)
    dq, dk, dv, cgrads = _backward_numpy(
        q, k, v, o, d_o, lse, mask, _scale(scale), wl, wr, _block(block_mask),
        deterministic, text, captures, wanted)
    grads = (dq, dk, dv)
    if sinks is not None:
        grads += (sinks_mod.sink_grad_numpy(o, d_o, lse, sinks),)
    if capture_grads:
        grads += ([None if g is None else _grad_like(g, c)
                   for g, c in zip(cgrads, captures)],)
    return grads


# -- torch: the ops of flashjit.ops ---------------------------------------
# (flashjit/_torch_impl.py runs them; both modules import torch.)


def _forward_cuda(torch, q, k, v, mask, scale, wl, wr, bm):
    """(o, lse) of torch CUDA tensors (tests call it directly)."""
    from . import _torch_impl

    return _torch_impl.forward_cuda(q, k, v, mask, scale, wl, wr, bm)


def _backward_cuda(torch, q, k, v, o, lse, d_o, mask, scale, wl, wr, bm,
                   deterministic):
    """(dq, dk, dv) of torch CUDA tensors (tests call it directly)."""
    from . import _torch_impl

    return _torch_impl.backward_cuda(q, k, v, o, lse, d_o, mask, scale, wl,
                                     wr, bm, deterministic)[:3]


def _cuda_handle(device):
    from . import _torch_impl

    return _torch_impl.cuda_handle(
        device.index if device.index is not None else 0)


def _attention_torch(q, k, v, mask, scale, wl, wr, bm, return_lse,
                     deterministic, score_mod="", sinks=None, captures=()):
    from . import ops

    o, lse = ops.attention(q, k, v, mask, scale, wl, wr, bm, deterministic,
                           score_mod, sinks, captures)
    return (o, lse) if return_lse else o
