"""flashjit as a Hugging Face transformers attention backend
(flashjit/integrations/transformers.py), on small randomly initialised
models built from their configs (no download): Llama (GQA), Qwen2 (GQA,
qkv bias) and Mistral (GQA, a sliding window shorter than the sequence).

For each: the bf16 logits with attn_implementation="fjit" (flashjit) against a
float32 eager run of the same weights must be no further off than 1.2x the
bf16 "sdpa" run's error against that float32 run; the same for the
gradients of one training step (cross-entropy). Forward times are printed.
Padded batches (left and right padding: flashjit.attention_varlen over the
real tokens) and packed sequences (position_ids that restart) are held to
the same 1.2x bound on their real tokens, and left-padded greedy decoding
gives sdpa's tokens. A mask with holes and dropout in training are refused
by name.

GPU only: skips without transformers, torch or a CUDA GPU (with the reason).
FLASHJIT_TEST_DEVICE=cpu runs it on the CPU execution mode instead (slow;
for machines without a GPU).
"""

import copy
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed")
DEVICE = os.environ.get("FLASHJIT_TEST_DEVICE", "cuda")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)",
                allow_module_level=True)

from flashjit.integrations import transformers as fj_hf  # noqa: E402


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


SEQ, BATCH = 256, 2
COMMON = dict(vocab_size=1024, hidden_size=256, intermediate_size=512,
              num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024,
              attention_dropout=0.0, tie_word_embeddings=False)


def configs():
    return {
        "llama": transformers.LlamaConfig(**COMMON),
        "qwen2": transformers.Qwen2Config(**COMMON),
        "mistral": transformers.MistralConfig(**COMMON, sliding_window=96),
        # Logit soft-capping (flashjit's softcap:C), a query scale of its
        # own; its window wider than SEQ.
        "gemma2": transformers.Gemma2Config(
            **COMMON, head_dim=64, attn_logit_softcapping=20.0,
            query_pre_attn_scalar=64, sliding_window=512),
    }


def set_attn(model, name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # older transformers: the config is read at every forward
        model.config._attn_implementation = name
    return model


def build(arch):
    """(float32 eager model, bf16 flashjit copy, bf16 sdpa copy)."""
    torch.manual_seed(0)
    cfg = configs()[arch]
    ref = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", dtype=torch.float32).to(DEVICE)
    fj = set_attn(copy.deepcopy(ref).to(torch.bfloat16), fj_hf.NAME)
    sdpa = set_attn(copy.deepcopy(ref).to(torch.bfloat16), "sdpa")
    return ref, fj, sdpa


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def step(model, ids):
    """(logits, gradients of every parameter) of one training step."""
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = torch.cat([p.grad.double().flatten()
                       for p in model.parameters() if p.grad is not None])
    return out.logits.detach(), grads


def forward_ms(model, ids, repeats=10):
    model.eval()
    with torch.no_grad():
        for _ in range(3):
            model(input_ids=ids)
        sync()
        t = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(input_ids=ids)
            sync()
            t.append((time.perf_counter() - t0) * 1e3)
    return sorted(t)[len(t) // 2]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma2"])
def test_matches_float32_as_well_as_sdpa(arch):
    ref, fj, sdpa = build(arch)
    ids = torch.randint(0, COMMON["vocab_size"], (BATCH, SEQ), device=DEVICE)
    logits32, grads32 = step(ref, ids)
    logits_fj, grads_fj = step(fj, ids)
    logits_sd, grads_sd = step(sdpa, ids)
    errs = {"logits": (rel(logits_fj, logits32), rel(logits_sd, logits32)),
            "grads": (rel(grads_fj, grads32), rel(grads_sd, grads32))}
    times = (forward_ms(fj, ids), forward_ms(sdpa, ids), forward_ms(ref, ids))
    print(f"\n[hf] {arch}: logits rel err flashjit {errs['logits'][0]:.3e} "
          f"sdpa {errs['logits'][1]:.3e}; grads flashjit "
          f"{errs['grads'][0]:.3e} sdpa {errs['grads'][1]:.3e}; forward "
          f"ms flashjit {times[0]:.2f} sdpa-bf16 {times[1]:.2f} "
          f"eager-fp32 {times[2]:.2f}")
    for what, (e_fj, e_sd) in errs.items():
        assert e_fj <= 1.2 * e_sd, (arch, what, e_fj, e_sd)
    # The backend really ran: flashjit compiled kernels for this model.
    from flashjit import _torch_impl

    if DEVICE == "cuda":
        assert _torch_impl._fwd_plans and _torch_impl._bwd_plans


def test_kv_cache_generation_matches_sdpa():
    """Greedy decoding with a KV cache (Nq = 1 against the cache:
    bottom-right aligned causal) gives sdpa's tokens."""
    _, fj, sdpa = build("llama")
    ids = torch.randint(0, COMMON["vocab_size"], (1, 40), device=DEVICE)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        a = fj.eval().generate(ids, **kw)
        b = sdpa.eval().generate(ids, **kw)
    # bf16 noise may flip a near-tie late; the first tokens must agree.
    assert torch.equal(a[:, :44], b[:, :44]), (a, b)


def padded_batch(batch=3, seq=128):
    """(ids, mask): row 0 unpadded, row 1 left-padded by 17, row 2
    right-padded by 29; longer than Mistral's window (96), so the window
    and the padding meet."""
    ids = torch.randint(0, COMMON["vocab_size"], (batch, seq), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :17] = 0
    mask[2, seq - 29:] = 0
    return ids, mask


def padded_step(model, ids, mask):
    """(logits at the real tokens, gradients of every parameter) of one
    training step on a padded batch: the loss over the predictions a real
    token makes of a real token. (transformers shifts the labels: position
    t predicts label t + 1, so the last left pad would predict the first
    real token; a padded row's output is 0 here, as transformers'
    FlashAttention-2 path gives it, and the eager and sdpa paths' is their
    softmax over masked keys: not a difference of the attention.)"""
    model.train()
    model.zero_grad(set_to_none=True)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = torch.cat([p.grad.double().flatten()
                       for p in model.parameters() if p.grad is not None])
    return out.logits.detach()[mask.bool()], grads


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_padded_batch_matches_float32_as_well_as_sdpa(arch):
    """A batch with left and right padding (the mask reaches flashjit as
    HF's FlashAttention mask function passes it, and runs as
    variable-length attention): the logits at the real tokens and one
    training step's gradients against a float32 eager run with the same
    mask, no further off than 1.2x bf16 sdpa's."""
    ref, fj, sdpa = build(arch)
    ids, mask = padded_batch()
    logits32, grads32 = padded_step(ref, ids, mask)
    logits_fj, grads_fj = padded_step(fj, ids, mask)
    logits_sd, grads_sd = padded_step(sdpa, ids, mask)
    errs = {"logits": (rel(logits_fj, logits32), rel(logits_sd, logits32)),
            "grads": (rel(grads_fj, grads32), rel(grads_sd, grads32))}
    print(f"\n[hf] padded {arch}: logits rel err flashjit "
          f"{errs['logits'][0]:.3e} sdpa {errs['logits'][1]:.3e}; grads "
          f"flashjit {errs['grads'][0]:.3e} sdpa {errs['grads'][1]:.3e}")
    for what, (e_fj, e_sd) in errs.items():
        assert e_fj <= 1.2 * e_sd, (arch, what, e_fj, e_sd)
    # Not the same as ignoring the mask: the unpadded run's logits at
    # those tokens are far off.
    fj.eval()
    with torch.no_grad():
        unmasked = fj(input_ids=ids).logits[mask.bool()]
    assert rel(unmasked, logits32) > 10 * errs["logits"][1]


def test_left_padded_generation_matches_sdpa():
    """Greedy decoding of a left-padded batch with a KV cache: the mask
    grows by one column per step, the queries are its last column."""
    _, fj, sdpa = build("llama")
    ids = torch.randint(1, COMMON["vocab_size"], (2, 40), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :11] = 0
    ids[1, :11] = 0
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False,
              pad_token_id=0)
    with torch.no_grad():
        a = fj.eval().generate(ids, **kw)
        b = sdpa.eval().generate(ids, **kw)
    # bf16 noise may flip a near-tie late; the first tokens must agree.
    assert torch.equal(a[:, :44], b[:, :44]), (a, b)


def test_packed_sequences_match_float32_as_well_as_sdpa():
    """One row of four sequences packed one after another, marked by
    position_ids that restart (no mask): each attends within itself (as
    HF's sdpa and eager masks do since transformers detects packing)."""
    masking = pytest.importorskip("transformers.masking_utils")
    if not hasattr(masking, "find_packed_sequence_indices"):
        pytest.skip("this transformers does not detect packed sequences")
    ref, fj, sdpa = build("llama")
    lens = [50, 13, 100, 29]
    ids = torch.randint(0, COMMON["vocab_size"], (1, sum(lens)),
                        device=DEVICE)
    pos = torch.cat([torch.arange(n, device=DEVICE) for n in lens])[None]

    def logits(model):
        model.eval()
        with torch.no_grad():
            # No cache: transformers' eager and sdpa masks detect the
            # packing only without one.
            return model(input_ids=ids, position_ids=pos,
                         use_cache=False).logits

    l32, l_fj, l_sd = logits(ref), logits(fj), logits(sdpa)
    e_fj, e_sd = rel(l_fj, l32), rel(l_sd, l32)
    print(f"\n[hf] packed llama: logits rel err flashjit {e_fj:.3e} sdpa "
          f"{e_sd:.3e}")
    assert e_fj <= 1.2 * e_sd, (e_fj, e_sd)


def test_mask_with_holes_is_refused():
    _, fj, _ = build("llama")
    ids = torch.randint(0, COMMON["vocab_size"], (2, 64), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, 20:25] = 0  # a hole inside the second row: not padding
    with torch.no_grad(), pytest.raises(fj_hf.PaddingMaskError,
                                        match="runs of ones"):
        fj.eval()(input_ids=ids, attention_mask=mask)
    # An all-ones mask is no padding: accepted.
    with torch.no_grad():
        fj(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_dropout_in_training_is_refused():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{**COMMON, "attention_dropout": 0.1})
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16).to(DEVICE)
    set_attn(model, fj_hf.NAME)
    ids = torch.randint(0, COMMON["vocab_size"], (1, 32), device=DEVICE)
    with pytest.raises(fj_hf.DropoutError, match="dropout 0.1"):
        model.train()(input_ids=ids)
    with torch.no_grad():  # eval: dropout is off, accepted
        model.eval()(input_ids=ids)


def test_sinks_keyword_matches_eager_sinks():
    """The s_aux keyword (gpt-oss's sinks) against transformers' eager
    formulation, written out: the sink logits concatenated to the scores,
    softmax, the sink column dropped; the sinks' gradient too."""
    torch.manual_seed(0)
    B, H, Hkv, N, D = 2, 4, 2, 200, 64
    q = torch.randn(B, H, N, D, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=DEVICE, dtype=torch.bfloat16)
    sinks = (torch.randn(H, device=DEVICE) + 3).requires_grad_()

    class Module:
        is_causal = True
        training = False

    out, _ = fj_hf.attention_forward(Module(), q, k, v, None, scaling=0.125,
                                     s_aux=sinks)
    out.float().square().sum().backward()
    got = sinks.grad.clone()
    sinks.grad = None
    kr, vr = (t.float().repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    s = q.float() @ kr.transpose(-1, -2) * 0.125
    s = s.masked_fill(torch.ones(N, N, device=DEVICE).triu(1).bool(),
                      float("-inf"))
    combined = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(B, -1, N, 1)],
                         dim=-1)
    p = torch.softmax(combined, dim=-1)[..., :-1]
    want = (p @ vr).transpose(1, 2)
    want.square().sum().backward()
    assert rel(out.float(), want) < 1e-2
    assert rel(got, sinks.grad) < 2e-2
