"""flashjit as a Hugging Face transformers attention backend.

    import flashjit.integrations.transformers  # registers "fjit"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                             attn_implementation="fjit")
    # or, for a loaded model: model.set_attn_implementation("fjit")

Registers attention_forward with transformers' AttentionInterface as "fjit"
(NAME), and, where transformers has one (>= 4.53), an attention mask
function with AttentionMaskInterface: FlashAttention-2's, which gives no
mask at all unless a batch row is padded. Why not "flashjit": transformers
5 takes every implementation name containing "flash" for a FlashAttention
kernel to import (transformers.utils.generic.is_flash_attention_requested)
and fails to find one; "flashjit" is registered too, for versions without
that rule.

What it does: causal (module.is_causal, bottom-right aligned, so decoding
with a KV cache is right), GQA without repeating K and V, the model's
scaling, a sliding window (a `sliding_window` keyword: keys within
sliding_window - 1 before the query), logit soft-capping (a `softcap`
keyword, Gemma 2: flashjit's softcap:C score modifier on the scaled
scores), attention sinks (an `s_aux` keyword, gpt-oss: flashjit.attention's
sinks, with their gradient), and padded batches (left or right padding),
by variable-length attention:

  * a padding mask, the 2-D [B, Nkv] mask of 1 = attend that HF's
    FlashAttention mask function passes (or a 4-D [B|1, 1|H, Nq, Nkv]
    bool / additive mask that is causal (or full) attention restricted to
    such a padding mask, as older transformers pass), is unpadded: the
    real tokens of each row are gathered into flashjit.attention_varlen's
    packed layout (offsets from the mask; the query rows are the mask's
    last Nq columns, as with a KV cache), attention runs per sequence
    (causal bottom-right aligned per sequence, the window and softcap
    likewise), and the outputs are scattered back: the padded query rows
    get zeros. The mask's ones must be one contiguous run per row (left or
    right padding, or none); a mask with holes, or any other mask that is
    more than causal attention plus padding, is refused by name
    (PaddingMaskError, a NotImplementedError), as are attention sinks
    together with padding. Reading the mask costs a host synchronization
    (torch.nonzero), as in FlashAttention's own integration. A mask
    shorter than the keys (a static cache's unused slots) keeps the first
    keys it covers.
  * packed sequences without a mask (HF's packing-aware training: a batch
    of one row whose position_ids restart, e.g. [0 1 2 0 1 0 1 2 3], or
    the cu_seq_lens_q / cu_seq_lens_k keywords of
    DataCollatorWithFlattening) run as variable-length attention over the
    sequences (each one causal on its own), as HF's FlashAttention path
    and its sdpa mask do. Reading position_ids costs one host
    synchronization per forward (cached per position_ids tensor) when a
    single row without a KV cache comes with them; under torch.compile
    they are not read (pass cu_seq_lens_* and max_length_* there).

What it refuses, by name:

  * a mask that is not padding (above): PaddingMaskError;
  * dropout > 0 in training: DropoutError (a NotImplementedError).

Needs transformers >= 4.48 (AttentionInterface) and torch.
"""

import torch

import flashjit

NAME = "fjit"
NAMES = (NAME, "flashjit")


class PaddingMaskError(NotImplementedError):
    """An attention mask that is neither causal attention nor causal
    attention plus padding (one contiguous run of ones per row) reached
    flashjit's attention, or padding together with attention sinks."""


class DropoutError(NotImplementedError):
    """Attention dropout > 0 was asked for in training."""


def _wanted(q_len, kv_len, causal, window, device):
    """[Nq, Nkv] bool: what causal (bottom-right aligned) and the window
    (left, right) let each query see without any padding."""
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(kv_len, device=device)[None, :]
    diag = i + (kv_len - q_len)
    want = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        want &= j <= diag
    if window is not None:
        left, right = window
        want &= (j >= diag - left) & (j <= diag + right)
    return want


def _padding_mask(attention_mask, batch, q_len, kv_len, causal, window):
    """None when attention_mask masks nothing beyond causal attention and
    the window (a host synchronization to find out); else the [B, Nkv']
    bool padding mask (True = a real token) it is, Nkv' <= Nkv (a 2-D mask
    shorter than the keys covers the first Nkv' of them). PaddingMaskError
    for any other mask."""
    if attention_mask is None:
        return None
    m = attention_mask
    if m.dim() == 2:  # [B, Nkv] padding mask, 1 = attend
        pad = m.bool()
        if pad.shape[0] not in (1, batch) or pad.shape[1] > kv_len:
            raise PaddingMaskError(
                f"flashjit: a 2-D attention mask must be [batch, kv_len] = "
                f"[{batch}, <= {kv_len}], got {tuple(m.shape)}")
        if bool(pad.all()):
            return None if pad.shape[1] == kv_len else pad.expand(batch, -1)
        return pad.expand(batch, -1)
    if m.dim() == 4:  # [B|1, 1|H, Nq, Nkv]: bool (True = attend) or additive
        visible = m if m.dtype == torch.bool else m == 0
        want = _wanted(q_len, kv_len, causal, window, m.device)
        if visible.shape[-2:] != want.shape or visible.shape[0] not in (
                1, batch):
            raise PaddingMaskError(
                f"flashjit: a 4-D attention mask must be [batch or 1, heads "
                f"or 1, {q_len}, {kv_len}], got {tuple(m.shape)}")
        if bool((visible == want).all()):
            return None
        # Causal (or full) attention plus padding: the last query row sees
        # every real key (the bottom-right diagonal is the last key); with
        # a window, the keys some row sees. The mask is then checked to be
        # exactly that on every real query row and head (the padded rows
        # are free: HF may unmask them); a wrong guess fails the check.
        pad = visible[:, 0, -1, :]
        if window is not None:
            pad = visible[:, 0].any(dim=-2)
        qpad = pad[:, -q_len:] if q_len <= kv_len else None
        expected = want[None, None] & pad[:, None, None, :]
        ok = qpad is not None and bool(
            ((visible == expected) | ~qpad[:, None, :, None]).all())
        if not ok:
            raise PaddingMaskError(
                "flashjit: this attention mask masks more than causal "
                f"attention plus padding (shape {tuple(m.shape)}), which "
                "flashjit's attention cannot express; use "
                "attn_implementation='sdpa' for it")
        return pad.expand(batch, -1)
    raise PaddingMaskError(
        f"flashjit: an attention mask of {m.dim()} dimensions "
        f"(shape {tuple(m.shape)}) is neither a 2-D padding mask nor a 4-D "
        "mask")


def _attention_padded(query, key, value, pad, causal, scaling, window,
                      score_mod):
    """flashjit.attention_varlen over the real tokens of a padded batch:
    query [B, H, Nq, D], key and value [B, Hkv, Nkv, D], pad [B, Nkv'] bool
    (one contiguous run per row, checked here; the query rows are its last
    Nq columns). Returns [B, Nq, H, Dv], zeros in the padded query rows."""
    B, H, q_len, _ = query.shape
    kv_len = pad.shape[1]
    if q_len > kv_len:
        raise PaddingMaskError(
            f"flashjit: {q_len} queries but a padding mask of {kv_len} keys")
    key, value = key[:, :, :kv_len], value[:, :, :kv_len]
    qpad = pad[:, kv_len - q_len:]
    lens_k = pad.sum(1, dtype=torch.int32)
    lens_q = qpad.sum(1, dtype=torch.int32)
    # Runs: a row's ones start once at most (left or right padding).
    starts = pad[:, :1].sum(1) + (pad[:, 1:] & ~pad[:, :-1]).sum(1)
    runs, max_q, max_k = torch.stack(
        [starts.max(), lens_q.max(), lens_k.max()]).tolist()  # host sync
    if runs > 1:
        row = int(torch.nonzero(starts > 1)[0, 0])
        raise PaddingMaskError(
            f"flashjit: row {row} of the attention mask has {runs} runs of "
            "ones: not padding (left or right), which flashjit maps to "
            "variable-length attention; a mask with holes is not supported "
            "(use attn_implementation='sdpa')")
    zero = torch.zeros(1, dtype=torch.int32, device=pad.device)
    cu_q = torch.cat([zero, lens_q.cumsum(0, dtype=torch.int32)])
    cu_k = torch.cat([zero, lens_k.cumsum(0, dtype=torch.int32)])
    bq, tq = torch.nonzero(qpad, as_tuple=True)
    bk, tk = torch.nonzero(pad, as_tuple=True)
    # [B, H, N, D] -> the real tokens, packed (total, H, D): one gather each.
    q = query.transpose(1, 2)[bq, tq]
    k = key.transpose(1, 2)[bk, tk]
    v = value.transpose(1, 2)[bk, tk]
    o = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max(max_q, 1),
                                  max(max_k, 1), causal=causal, scale=scaling,
                                  window=window, score_mod=score_mod)
    out = o.new_zeros((B, q_len, H, o.shape[-1]))
    return out.index_put((bq, tq), o)


# position_ids tensor -> (its _version, _packed_offsets' answer): every
# layer of one forward gets the same position_ids, so one synchronization
# per forward finds the packing (torch.utils.weak.WeakIdKeyDictionary, made
# on first use).
_PACKED = None


def _packed_offsets(position_ids, batch, q_len, kv_len):
    """(cu_seqlens int32 on position_ids' device, longest sequence) of a
    batch of one row holding several sequences packed one after another,
    as HF marks them without a mask: position_ids restart (a step other
    than +1 starts a new sequence, as HF's find_packed_sequence_indices);
    None when there is no such packing (a batch of more than one row, a KV
    cache, positions without a restart, or torch.compile tracing, which
    cannot read them). One host synchronization per position_ids tensor
    (cached)."""
    global _PACKED
    if (position_ids is None or not isinstance(position_ids, torch.Tensor)
            or batch != 1 or q_len != kv_len or q_len < 2
            or torch.compiler.is_compiling()):
        return None
    if _PACKED is None:
        from torch.utils.weak import WeakIdKeyDictionary

        _PACKED = WeakIdKeyDictionary()
    hit = _PACKED.get(position_ids)
    if hit is not None and hit[0] == position_ids._version:
        return hit[1]
    # Only [1, N] positions: multimodal RoPE's [3, B, N] repeat positions
    # within an image, which are no sequence boundaries.
    p = position_ids
    found = None
    if p.dim() == 2 and p.shape[-1] == q_len and p.shape[0] == 1:
        p = p[0]
        starts = torch.nonzero(p[1:] - p[:-1] != 1).flatten() + 1  # sync
        if starts.numel():
            bounds = torch.cat([starts.new_zeros(1), starts,
                                starts.new_full((1,), q_len)])
            longest = int((bounds[1:] - bounds[:-1]).max())
            found = (bounds.to(torch.int32), longest)
    _PACKED[position_ids] = (position_ids._version, found)
    return found


def _packed_sequences(kwargs, attention_mask, batch, q_len, kv_len):
    """(cu_q, cu_k, max_q, max_k) of one batch row of packed sequences:
    given (FlashAttentionKwargs: cu_seq_lens_q / _k, max_length_q / _k,
    as HF's DataCollatorWithFlattening passes them) or found in
    position_ids (_packed_offsets); None when the batch is not packed."""
    if attention_mask is not None or batch != 1:
        return None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        return (cu_q.to(torch.int32), cu_k.to(torch.int32),
                kwargs.get("max_length_q"), kwargs.get("max_length_k"))
    found = _packed_offsets(kwargs.get("position_ids"), batch, q_len, kv_len)
    if found is None:
        return None
    cu, longest = found
    return cu, cu, longest, longest


def attention_forward(module, query, key, value, attention_mask, scaling=None,
                      dropout=0.0, **kwargs):
    """transformers' attention signature: query [B, H, Nq, D], key and
    value [B, Hkv, Nkv, D]; returns (attn_output [B, Nq, H, Dv], None).
    A padding mask runs as variable-length attention (the module's
    docstring)."""
    if dropout and dropout > 0 and getattr(module, "training", False):
        raise DropoutError(
            f"flashjit: attention dropout {dropout} in training is not "
            "supported (set config.attention_dropout = 0, or model.eval())")
    sinks = kwargs.get("s_aux")  # gpt-oss: a sink logit per query head
    score_mod = None
    softcap = kwargs.get("softcap")
    if softcap is not None:  # C tanh(s / C) on s = scaling * q.k
        score_mod = f"softcap:{float(softcap)!r}"
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    causal = bool(causal)
    q_len, kv_len = query.shape[2], key.shape[2]
    window = None
    sliding = kwargs.get("sliding_window")
    if sliding is not None and sliding < kv_len:
        if not causal:
            raise NotImplementedError(
                "flashjit: a non-causal sliding window is not supported here")
        window = (int(sliding) - 1, 0)
    pad = _padding_mask(attention_mask, query.shape[0], q_len, kv_len, causal,
                        window)
    if window is not None:
        causal = False  # the window's right side 0 is the causal bound
    if pad is not None:
        if sinks is not None:
            raise PaddingMaskError(
                "flashjit: attention sinks (s_aux) with a padding mask are "
                "not supported (variable-length attention has no sinks "
                "yet); run unpadded or use attn_implementation='eager'")
        out = _attention_padded(query, key, value, pad, causal, scaling,
                                window, score_mod)
        return out, None
    packed = _packed_sequences(kwargs, attention_mask, query.shape[0], q_len,
                               kv_len)
    if packed is not None:  # one row of sequences packed: varlen over them
        if sinks is not None:
            raise PaddingMaskError(
                "flashjit: attention sinks (s_aux) with packed sequences "
                "are not supported (variable-length attention has no sinks "
                "yet)")
        cu_q, cu_k, max_q, max_k = packed
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
        out = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k,
                                        causal=causal, scale=scaling,
                                        window=window, score_mod=score_mod)
        return out[None], None
    out = flashjit.attention(query, key, value, causal=causal, scale=scaling,
                             window=window, score_mod=score_mod, sinks=sinks)
    return out.transpose(1, 2).contiguous(), None


def _register_mask():
    try:
        from transformers.masking_utils import (AttentionMaskInterface,
                                                flash_attention_mask)
    except ImportError:  # transformers < 4.53: 4-D masks, checked above
        return False
    for name in NAMES:
        AttentionMaskInterface.register(name, flash_attention_mask)
    return True


def register():
    """Registers NAMES with transformers (idempotent); returns NAME."""
    from transformers import AttentionInterface

    for name in NAMES:
        AttentionInterface.register(name, attention_forward)
    _register_mask()
    return NAME


register()
