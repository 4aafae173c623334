"""The Hugging Face backend's padded batches and packed sequences
(flashjit/integrations/transformers.py: a padding mask or restarting
position_ids mapped to flashjit.attention_varlen), on the CPU execution
mode with torch CPU tensors, called the way transformers calls an
attention function: attention_forward(module, query [B, H, Nq, D], key,
value [B, Hkv, Nkv, D], attention_mask, scaling, **kwargs).

No model: against a float64 reference of the masked attention written out
(causal by positions, the padding mask on keys, the real query rows; what
sdpa computes with HF's 4-D mask), forward and autograd. Padded query rows
must be exactly 0. Masks that are not padding are refused by name.

transformers itself is not needed: when it is not installed, the
integration module is imported with a stand-in `transformers` module that
has the one name it registers with (removed again right after), so the
registration is a no-op and attention_forward runs as it does under
transformers. Skips without torch.
"""

import os
import sys
import types

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (test_varlen_cpu.py covers the "
    "numpy path)")

import flashjit  # noqa: E402


def _import_integration():
    try:
        import transformers  # noqa: F401
    except ImportError:
        class _Interface:
            registered = {}

            @classmethod
            def register(cls, name, fn):
                cls.registered[name] = fn

        stub = types.ModuleType("transformers")
        stub.AttentionInterface = _Interface
        sys.modules["transformers"] = stub
        try:
            sys.modules.pop("flashjit.integrations.transformers", None)
            from flashjit.integrations import transformers as fj_hf
        finally:
            del sys.modules["transformers"]
        assert _Interface.registered["fjit"] is fj_hf.attention_forward
        return fj_hf
    from flashjit.integrations import transformers as fj_hf

    return fj_hf


fj_hf = _import_integration()

BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
GRAD_BOUND = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


class Module:
    def __init__(self, causal=True):
        self.is_causal = causal
        self.training = False


@pytest.fixture
def seed():
    s = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    print(f"seed {s}")
    return s


def make(B, H, Hkv, Nq, Nkv, D=32, dtype=torch.float16):
    return tuple(torch.randn(B, h, n, D, dtype=dtype).requires_grad_()
                 for h, n in ((H, Nq), (Hkv, Nkv), (Hkv, Nkv)))


def reference(q, k, v, pad, causal, scale, window=None, softcap=None):
    """[B, Nq, H, Dv] float64: softmax over the keys a query may see
    (causal by position, bottom-right aligned over the full [Nq, Nkv]
    grid, the window, the padding mask pad [B, Nkv'] on keys, the keys
    past Nkv' dropped); padded query rows (pad's last Nq columns) 0.
    Differentiable (float64 leaves of its own)."""
    kv_len = pad.shape[1]
    q, k, v = q.double(), k[:, :, :kv_len].double(), v[:, :, :kv_len].double()
    B, H, Nq, _ = q.shape
    g = H // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Nq)[:, None] + kv_len - Nq
    j = torch.arange(kv_len)[None, :]
    vis = torch.ones(Nq, kv_len, dtype=torch.bool)
    if causal:
        vis &= j <= i
    if window is not None:
        vis &= j >= i - window
    vis = vis[None, None] & pad[:, None, None, :]
    qreal = pad[:, kv_len - Nq:]
    vis = vis | ~qreal[:, None, :, None]  # padded rows: anything, zeroed
    p = torch.softmax(s.masked_fill(~vis, float("-inf")), dim=-1)
    out = (p @ v).transpose(1, 2)
    return out * qreal[:, :, None, None]


def check(out, ref, bound):
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= bound, err
    return err


def padding(B, N, left, right):
    """[B, N] long mask: row b has left[b] zeros first, right[b] last."""
    m = torch.ones(B, N, dtype=torch.long)
    for b in range(B):
        m[b, :left[b]] = 0
        if right[b]:
            m[b, N - right[b]:] = 0
    return m


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_left_and_right_padding_forward_and_gradients(dtype, seed):
    """Rows with no padding, left padding, right padding, both, and a row
    of one real token; GQA 2; a scale; forward and the gradients of q, k,
    v (the padded tokens' gradients 0) against the float64 reference."""
    B, H, Hkv, N = 5, 4, 2, 45
    q, k, v = make(B, H, Hkv, N, N, dtype=dtype)
    mask = padding(B, N, [0, 10, 0, 3, 44], [0, 0, 7, 5, 0])
    out, weights = fj_hf.attention_forward(Module(), q, k, v, mask,
                                           scaling=0.2)
    assert weights is None
    assert out.shape == (B, N, H, 32) and out.dtype == dtype
    pad = mask.bool()
    assert (out[~pad] == 0).all()  # the padded query rows: exactly 0
    ref = reference(q, k, v, pad, True, 0.2)
    check(out, ref, BOUND[dtype])
    # The mask read as right padding where it is left padding misses.
    flipped = reference(q, k, v, pad.flip(1), True, 0.2)
    assert ((out.double() - flipped).norm() / flipped.norm()) > 10 * BOUND[
        dtype]
    d_o = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), d_o)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(reference(*leaves, pad, True, 0.2), leaves,
                               d_o.double())
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == dtype, name
        err = ((g.double() - w).norm() / w.norm()).item()
        assert err <= GRAD_BOUND[dtype], (name, err)
    for g in got:  # padded tokens (their queries, keys and values): 0
        assert (g.transpose(1, 2)[~pad] == 0).all()


def test_gqa_without_repeating_kv(seed, monkeypatch):
    """attention_varlen gets K and V with their own Hkv heads, packed."""
    seen = []
    real = flashjit.attention_varlen

    def spy(q, k, v, *args, **kwargs):
        seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(flashjit, "attention_varlen", spy)
    q, k, v = make(2, 8, 2, 20, 20)
    mask = padding(2, 20, [4, 0], [0, 0])
    fj_hf.attention_forward(Module(), q, k, v, mask)
    assert seen == [((36, 8, 32), (36, 2, 32), (36, 2, 32))]


@pytest.mark.parametrize("q_len", [1, 5])
def test_decoding_with_a_cache_and_left_padding(q_len, seed):
    """Nq < Nkv (a KV cache): the queries are the mask's last Nq columns;
    causal is bottom-right aligned per row."""
    B, N = 3, 40
    q, k, v = make(B, 4, 2, q_len, N)
    mask = padding(B, N, [0, 12, 30], [0, 0, 0])
    out, _ = fj_hf.attention_forward(Module(), q, k, v, mask, scaling=0.15)
    check(out, reference(q, k, v, mask.bool(), True, 0.15),
          BOUND[torch.float16])


def test_sliding_window_softcap_and_non_causal(seed):
    B, N = 3, 50
    q, k, v = make(B, 2, 1, N, N)
    mask = padding(B, N, [0, 17, 0], [0, 0, 9])
    pad = mask.bool()
    out, _ = fj_hf.attention_forward(Module(), q, k, v, mask, scaling=0.25,
                                     sliding_window=8, softcap=3.0)
    check(out, reference(q, k, v, pad, True, 0.25, window=7, softcap=3.0),
          BOUND[torch.float16])
    out, _ = fj_hf.attention_forward(Module(causal=False), q, k, v, mask,
                                     scaling=0.25)
    check(out, reference(q, k, v, pad, False, 0.25), BOUND[torch.float16])


def test_four_d_masks_of_padding(seed):
    """The 4-D forms older transformers pass (bool, and additive with the
    dtype's minimum, the fully masked padded rows unmasked as HF's sdpa
    path does) give the 2-D mask's result bit for bit; a 4-D mask that is
    just causal runs unpadded."""
    B, N = 3, 33
    q, k, v = make(B, 4, 2, N, N)
    mask = padding(B, N, [0, 8, 0], [0, 0, 6])
    pad = mask.bool()
    want, _ = fj_hf.attention_forward(Module(), q, k, v, mask)
    i = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    vis = ((j <= i)[None, None] & pad[:, None, None, :])
    vis = vis | ~vis.any(-1, keepdim=True)  # HF unmasks fully masked rows
    got, _ = fj_hf.attention_forward(Module(), q, k, v, vis)
    assert torch.equal(got, want)
    additive = torch.zeros(vis.shape).masked_fill(
        ~vis, torch.finfo(torch.float32).min)
    got, _ = fj_hf.attention_forward(Module(), q, k, v, additive)
    assert torch.equal(got, want)
    causal = (j <= i)[None, None].expand(B, 1, N, N)
    got, _ = fj_hf.attention_forward(Module(), q, k, v, causal)
    dense = flashjit.attention(q, k, v, causal=True).transpose(1, 2)
    assert torch.equal(got, dense)


def test_masks_that_are_not_padding_are_refused():
    q, k, v = make(2, 2, 2, 16, 16)
    holes = torch.ones(2, 16, dtype=torch.long)
    holes[1, 5] = 0  # a hole in the middle: not padding
    with pytest.raises(fj_hf.PaddingMaskError, match="row 1 .* 2 runs"):
        fj_hf.attention_forward(Module(), q, k, v, holes)
    random4d = torch.rand(2, 1, 16, 16) > 0.5
    with pytest.raises(fj_hf.PaddingMaskError,
                       match="more than causal attention plus padding"):
        fj_hf.attention_forward(Module(), q, k, v, random4d)
    with pytest.raises(fj_hf.PaddingMaskError, match="must be \\[batch"):
        fj_hf.attention_forward(Module(), q, k, v,
                                torch.ones(2, 17, dtype=torch.long))
    with pytest.raises(fj_hf.PaddingMaskError, match="3 dimensions"):
        fj_hf.attention_forward(Module(), q, k, v,
                                torch.ones(2, 16, 16, dtype=torch.bool))
    pad = torch.ones(2, 16, dtype=torch.long)
    pad[0, :3] = 0
    with pytest.raises(fj_hf.PaddingMaskError, match="sinks"):
        fj_hf.attention_forward(Module(), q, k, v, pad,
                                s_aux=torch.zeros(2))
    # PaddingMaskError is a NotImplementedError, as before.
    assert issubclass(fj_hf.PaddingMaskError, NotImplementedError)


def test_all_ones_and_short_masks(seed):
    """An all-ones mask runs unpadded (attention()'s bits); a mask shorter
    than the keys (a static cache's unused slots) covers the first keys."""
    q, k, v = make(2, 2, 1, 20, 20)
    ones = torch.ones(2, 20, dtype=torch.long)
    got, _ = fj_hf.attention_forward(Module(), q, k, v, ones)
    assert torch.equal(got, flashjit.attention(q, k, v, causal=True)
                       .transpose(1, 2))
    q, k, v = make(2, 2, 1, 4, 64)  # 64 cache slots, 30 used
    short = torch.ones(2, 30, dtype=torch.long)
    short[1, :7] = 0
    out, _ = fj_hf.attention_forward(Module(), q, k, v, short, scaling=0.3)
    check(out, reference(q, k, v, short.bool(), True, 0.3),
          BOUND[torch.float16])


def test_packed_sequences_by_position_ids(seed):
    """One row holding sequences packed one after another, marked by
    position_ids that restart (no mask), or by cu_seq_lens_* keywords:
    each sequence attends within itself."""
    lens = [7, 20, 1, 12]
    N = sum(lens)
    q, k, v = make(1, 4, 2, N, N)
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    out, _ = fj_hf.attention_forward(Module(), q, k, v, None, scaling=0.2,
                                     position_ids=pos)
    # The reference: each sequence alone.
    parts, start = [], 0
    for n in lens:
        sl = slice(start, start + n)
        parts.append(reference(q[:, :, sl], k[:, :, sl], v[:, :, sl],
                               torch.ones(1, n, dtype=torch.bool), True, 0.2))
        start += n
    ref = torch.cat(parts, dim=1)
    check(out, ref, BOUND[torch.float16])
    # Plain causal attention over the row (the positions ignored) misses.
    whole = reference(q, k, v, torch.ones(1, N, dtype=torch.bool), True, 0.2)
    assert ((whole - ref).norm() / ref.norm()) > 10 * BOUND[torch.float16]
    cu = torch.tensor([0, 7, 27, 28, 40], dtype=torch.int32)
    out2, _ = fj_hf.attention_forward(Module(), q, k, v, None, scaling=0.2,
                                      cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                      max_length_q=20, max_length_k=20)
    assert torch.equal(out2, out)
    # Positions without a restart: unpacked, attention()'s bits.
    arange = torch.arange(N)[None]
    got, _ = fj_hf.attention_forward(Module(), q, k, v, None,
                                     position_ids=arange)
    assert torch.equal(got, flashjit.attention(q, k, v, causal=True)
                       .transpose(1, 2))
