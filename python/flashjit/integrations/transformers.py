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
sinks, with their gradient). What it refuses, by name:

  * a padding mask (a row of the batch with padded tokens): flashjit has
    no variable-length attention yet. PaddingMaskError (a
    NotImplementedError); an all-ones or purely causal mask is accepted.
  * dropout > 0 in training: DropoutError (a NotImplementedError).

Needs transformers >= 4.48 (AttentionInterface) and torch.
"""

import torch

import flashjit

NAME = "fjit"
NAMES = (NAME, "flashjit")


class PaddingMaskError(NotImplementedError):
    """A padding mask reached flashjit's attention (no varlen yet)."""


class DropoutError(NotImplementedError):
    """Attention dropout > 0 was asked for in training."""


def _check_mask(attention_mask, q_len, kv_len, causal):
    """Raises PaddingMaskError unless attention_mask is None or masks
    nothing beyond what `causal` does. A 4-D mask is compared on the
    device (one host sync); HF's flash-attention mask function, which this
    module registers, passes None instead whenever nothing is padded."""
    if attention_mask is None:
        return
    m = attention_mask
    if m.dim() == 2:  # [B, Nkv] padding mask, 1 = attend
        trivial = bool(m.bool().all())
    elif m.dim() == 4:  # [B|1, 1|H, Nq, Nkv]: bool (True = attend) or additive
        visible = m if m.dtype == torch.bool else m == 0
        if causal:
            i = torch.arange(q_len, device=m.device)[:, None]
            j = torch.arange(kv_len, device=m.device)[None, :]
            want = j <= i + (kv_len - q_len)
        else:
            want = torch.ones(q_len, kv_len, dtype=torch.bool, device=m.device)
        trivial = (visible.shape[-2:] == want.shape
                   and bool((visible == want).all()))
    else:
        trivial = False
    if not trivial:
        raise PaddingMaskError(
            "flashjit: this attention mask masks more than the causal "
            f"pattern (shape {tuple(m.shape)}): padded batches need "
            "variable-length attention, which flashjit does not have yet; "
            "run unpadded (batch of one, or equal lengths) or use "
            "attn_implementation='sdpa'")


def attention_forward(module, query, key, value, attention_mask, scaling=None,
                      dropout=0.0, **kwargs):
    """transformers' attention signature: query [B, H, Nq, D], key and
    value [B, Hkv, Nkv, D]; returns (attn_output [B, Nq, H, Dv], None)."""
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
    _check_mask(attention_mask, q_len, kv_len, causal)
    window = None
    sliding = kwargs.get("sliding_window")
    if sliding is not None and sliding < kv_len:
        if not causal:
            raise NotImplementedError(
                "flashjit: a non-causal sliding window is not supported here")
        window = (int(sliding) - 1, 0)
        causal = False  # the window's right side 0 is the causal bound
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
