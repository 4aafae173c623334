"""flashjit.attention_varlen on torch CUDA tensors: the forward (o, lse) and
autograd's backward (dq, dk, dv) of packed variable-length batches, each
sequence against the float64 reference of that sequence alone
(reference.varlen_attention_ref / varlen_grads_ref).

Covers bf16 and fp16, causal GQA with Nq != Nkv per sequence, sequences
without keys or without queries, lengths that do not divide the tiles,
long sequences beside short ones, decode-shaped batches (one query per
sequence against long keys), windows, a block mask over the sequences
with a causal mask_mod and full blocks, a score modifier and a captured
tensor's gradient, both dQ modes (deterministic: bit-identical twice),
explicit max_seqlen_* without any host synchronization
(torch.cuda.set_sync_debug_mode("error")), a side stream, and the
forward and backward captured in a CUDA graph (replayed with new
offsets); and, beside them, create_block_mask(..., kernel=True) on the
device (flashjit's block-classification kernel) against the default
evaluation of the mask. The outputs are allocated zeroed (o, dq, dk, dv) or -inf (lse)
before the kernels run, so a row they do not write shows as a mismatch
against the reference (whose rows are not 0) or as a wrong -inf pattern.

Fresh random inputs and lengths each run (a failure prints its seed).
Skips without torch or a GPU; FLASHJIT_TEST_DEVICE=cpu runs the same
checks in the CPU execution mode (slower; the CUDA-only tests skip).
"""

import os

import numpy as np
import pytest

import flashjit
import reference
from reference import cu_seqlens, lse_err, rel_err

torch = pytest.importorskip(
    "torch", reason="torch is not installed (test_varlen_cpu.py covers the "
    "numpy path)")
DEVICE = os.environ.get("FLASHJIT_TEST_DEVICE", "cuda")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)",
                allow_module_level=True)
cuda_only = pytest.mark.skipif(DEVICE != "cuda",
                               reason="CUDA only (FLASHJIT_TEST_DEVICE=cpu)")

# The bounds and the seed fixture (by name, for pytest) of the torch tests:
# the reference's D uses the forward's o as given.
from torch_gpu_helpers import BOUND, GRAD_BOUND, seed  # noqa: E402,F401


def make(lens_q, lens_k, H, Hkv, d, dv, dtype, grad=False):
    cq = torch.from_numpy(cu_seqlens(lens_q)).to(DEVICE)
    ck = torch.from_numpy(cu_seqlens(lens_k)).to(DEVICE)
    q = torch.randn(int(sum(lens_q)), H, d, dtype=dtype, device=DEVICE)
    k = torch.randn(int(sum(lens_k)), Hkv, d, dtype=dtype, device=DEVICE)
    v = torch.randn(int(sum(lens_k)), Hkv, dv, dtype=dtype, device=DEVICE)
    return (*(t.requires_grad_(grad) for t in (q, k, v)), cq, ck)


def host(t):
    return t.detach().cpu().double().numpy()


def check_forward(o, lse, q, k, v, cq, ck, **opts):
    ro, rl = reference.varlen_attention_ref(
        host(q), host(k), host(v), cq.cpu().numpy(), ck.cpu().numpy(),
        max_q=lse.shape[2], **opts)
    assert o.dtype == q.dtype and o.device == q.device
    assert o.shape == (q.shape[0], q.shape[1], v.shape[2])
    assert lse.dtype == torch.float32 and lse.shape == rl.shape
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    bound = BOUND[q.dtype]
    assert rel_err(host(o), ro) <= bound, rel_err(host(o), ro)
    assert lse_err(lse.cpu().numpy(), rl) <= bound
    return ro


def check_grads(got, q, k, v, o, d_o, cq, ck, **opts):
    want = reference.varlen_grads_ref(
        *(host(t) for t in (q, k, v, o, d_o)), cq.cpu().numpy(),
        ck.cpu().numpy(), **opts)
    floor = 1e-3 * max(np.linalg.norm(w) for w in want)
    for name, g, w, like in zip(("dq", "dk", "dv"), got, want, (q, k, v)):
        assert g.dtype == like.dtype and g.shape == like.shape, name
        assert torch.isfinite(g).all(), name
        err = np.linalg.norm(host(g) - w) / max(np.linalg.norm(w), floor)
        assert err <= GRAD_BOUND[q.dtype], (name, err)


# (lens_q, lens_k, H, Hkv, d, dv, options)
CASES = {
    "causal-gqa4-mixed": ([300, 1, 77, 513, 0, 129], [300, 64, 0, 1000, 5,
                                                       129], 8, 2, 128, 128,
                          dict(causal=True)),
    "full-mha-d64": ([1000, 17, 256], [700, 17, 257], 4, 4, 64, 64, {}),
    "window": ([400, 90], [500, 90], 4, 2, 64, 64, dict(window=(37, 5))),
    "causal-dv": ([130, 33, 1], [77, 200, 1], 2, 1, 96, 48,
                  dict(causal=True)),
    "decode": ([1, 1, 1, 1, 1], [1500, 3, 2048, 700, 1], 8, 2, 128, 128,
               dict(causal=True)),
    "softcap": ([200, 50], [260, 50], 4, 2, 64, 64,
                dict(causal=True, score_mod="softcap:20")),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_backward(case, dtype, seed):
    lq, lk, H, Hkv, d, dv, opts = CASES[case]
    q, k, v, cq, ck = make(lq, lk, H, Hkv, d, dv, dtype, grad=True)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, return_lse=True,
                                       **opts)
    check_forward(o, lse, q, k, v, cq, ck, **opts)
    d_o = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), d_o)
    check_grads(got, q, k, v, o, d_o, cq, ck, **opts)


@pytest.mark.parametrize("lens", [[128, 128], [1, 4096], [2000, 3, 64, 1]])
def test_random_lengths_deterministic(lens, seed):
    """Random per-sequence key lengths around the given query lengths;
    deterministic=True: the gradients bit-identical twice; the reference
    with the first boundary moved misses: it fails the bound, and it is 10x
    further from the kernel's O than the right reference is (moving one
    key into a long sequence changes its rows by about 1 / sqrt(keys), so
    a fixed 10x the bound would be a coin toss at 128 keys)."""
    rng = np.random.default_rng(seed)
    lk = [max(0, int(n + rng.integers(-n // 2 - 1, n // 2 + 2)))
          for n in lens]
    q, k, v, cq, ck = make(lens, lk, 8, 2, 64, 64, torch.bfloat16, True)
    o = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                  deterministic=True)
    d_o = torch.randn_like(o)
    g1 = torch.autograd.grad(o, (q, k, v), d_o)
    o2 = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                   deterministic=True)
    g2 = torch.autograd.grad(o2, (q, k, v), d_o)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    check_grads(g1, q, k, v, o, d_o, cq, ck, causal=True)
    if lens[0] > 1 and lk[0] > 1:
        shifted_q, shifted_k = cq.cpu().numpy().copy(), ck.cpu().numpy().copy()
        shifted_q[1] -= 1
        shifted_k[1] -= 1
        wrong, _ = reference.varlen_attention_ref(
            host(q), host(k), host(v), shifted_q, shifted_k, causal=True)
        right, _ = reference.varlen_attention_ref(
            host(q), host(k), host(v), cq.cpu().numpy(), ck.cpu().numpy(),
            causal=True)
        rows = int(cq[2])
        own = rel_err(host(o)[:rows], right[:rows])
        missed = rel_err(host(o)[:rows], wrong[:rows])
        assert own <= BOUND[torch.bfloat16]
        assert missed > max(BOUND[torch.bfloat16], 10 * own)


def test_empty_sequences_and_rows_of_no_sequence(seed):
    """A sequence without keys: o = 0, lse = -inf, zero gradients for its
    queries; q rows past the last offset: o and dq 0; no keys at all: o =
    0 without a kernel."""
    lq, lk = [50, 20, 30], [60, 0, 45]
    q, k, v, cq, ck = make(lq, lk, 4, 2, 64, 64, torch.bfloat16, True)
    extra = torch.randn(7, 4, 64, dtype=torch.bfloat16, device=DEVICE)
    q2 = torch.cat([q.detach(), extra]).requires_grad_()
    o, lse = flashjit.attention_varlen(q2, k, v, cq, ck, causal=True,
                                       return_lse=True)
    assert (o[50:70] == 0).all() and (o[100:] == 0).all()
    assert torch.isneginf(lse[1]).all()
    check_forward(o[:100], lse, q, k, v, cq, ck, causal=True)
    d_o = torch.randn_like(o)
    dq, dk = torch.autograd.grad(o, (q2, k), d_o)
    assert (dq[50:70] == 0).all() and (dq[100:] == 0).all()
    assert torch.isfinite(dk).all()
    z = k[:0].detach()
    o, lse = flashjit.attention_varlen(q2, z, z, cq,
                                       torch.zeros_like(ck), return_lse=True)
    assert (o == 0).all() and torch.isneginf(lse).all()


@cuda_only
def test_explicit_max_seqlen_never_synchronizes(seed):
    """With max_seqlen_q and max_seqlen_k given, forward and backward run
    without a host synchronization (torch's sync debug mode raises on
    one); without them the offsets are read on the host (one sync) and
    give the same bits."""
    q, k, v, cq, ck = make([300, 45, 2], [310, 45, 90], 4, 2, 64, 64,
                           torch.bfloat16, True)
    want = flashjit.attention_varlen(q, k, v, cq, ck, causal=True)
    d_o = torch.randn_like(want)
    want_g = torch.autograd.grad(want, (q, k, v), d_o)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = flashjit.attention_varlen(q, k, v, cq, ck, 300, 310, causal=True)
        got_g = torch.autograd.grad(o, (q, k, v), d_o)
        with pytest.raises(RuntimeError, match="synchroniz"):
            flashjit.attention_varlen(q, k, v, cq, ck, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(o, want)
    # The gradients: dk and dv bit-identical; dq by atomic adds (its last
    # bits may vary).
    assert torch.equal(got_g[1], want_g[1]) and torch.equal(got_g[2],
                                                            want_g[2])
    torch.testing.assert_close(got_g[0], want_g[0], rtol=1e-2, atol=1e-2)


@cuda_only
def test_captured_bias_gradient(seed):
    lq, lk = [120, 33, 64], [150, 33, 80]
    H = 4
    q, k, v, cq, ck = make(lq, lk, H, 2, 64, 64, torch.float16, True)
    bias = torch.randn(H, max(lq), max(lk), device=DEVICE,
                       requires_grad=True)
    o = flashjit.attention_varlen(
        q, k, v, cq, ck, causal=True,
        score_mod=lambda s, b, h, i, j: s + bias[h, i, j])
    d_o = torch.randn_like(o)
    gq, gb = torch.autograd.grad(o, (q, bias), d_o)
    bias_n = host(bias)

    def fn_ref(s, b, h, i, j):
        return s + bias_n[h, i, j]

    G = reference.varlen_score_grads_ref(
        *(host(t) for t in (q, k, v, o, d_o)), cq.cpu().numpy(),
        ck.cpu().numpy(), causal=True, score_mod=fn_ref)
    want = np.zeros(bias.shape)
    for g in G:
        want[:, :g.shape[1], :g.shape[2]] += g
    assert rel_err(host(gb), want) <= 5e-3
    wq = reference.varlen_grads_ref(
        *(host(t) for t in (q, k, v, o, d_o)), cq.cpu().numpy(),
        ck.cpu().numpy(), causal=True, score_mod=fn_ref)[0]
    assert rel_err(host(gq), wq) <= GRAD_BOUND[torch.float16]


@cuda_only
def test_side_stream(seed):
    q, k, v, cq, ck = make([257, 31], [257, 90], 4, 4, 64, 64,
                           torch.bfloat16)
    want = flashjit.attention_varlen(q, k, v, cq, ck, 257, 257, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o = flashjit.attention_varlen(q, k, v, cq, ck, 257, 257, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(o, want)


@cuda_only
def test_forward_and_backward_in_a_cuda_graph(seed):
    """attention_varlen with max_seqlen_* given, forward and autograd's
    backward captured in one CUDA graph and replayed on new inputs and
    new offsets (the same total): the bits of uncaptured runs."""
    lq, lk = [200, 56], [230, 100]
    q, k, v, cq, ck = make(lq, lk, 4, 2, 64, 64, torch.bfloat16, True)
    d_o = torch.randn(256, 4, 64, dtype=torch.bfloat16, device=DEVICE)

    def step():  # max_seqlen_* cover both replays' lengths
        o = flashjit.attention_varlen(q, k, v, cq, ck, 256, 300, causal=True,
                                      deterministic=True)
        return (o,) + torch.autograd.grad(o, (q, k, v), d_o)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles, loads the kernels
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    for new_q, new_k in (([200, 56], [230, 100]), ([100, 156], [30, 300])):
        # (the totals stay 256 and 330)
        with torch.no_grad():
            for t in (q, k, v, d_o):
                t.copy_(torch.randn_like(t))
            cq.copy_(torch.from_numpy(cu_seqlens(new_q)).to(DEVICE))
            ck.copy_(torch.from_numpy(cu_seqlens(new_k)).to(DEVICE))
        g.replay()
        torch.cuda.synchronize()
        want = step()
        for a, b in zip(static, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    check_forward(static[0], flashjit.attention_varlen(
        q, k, v, cq, ck, causal=True, return_lse=True)[1], q, k, v, cq, ck,
        causal=True)


@cuda_only
def test_compile_fullgraph(seed):
    torch._dynamo.reset()
    q, k, v, cq, ck = make([300, 45, 2], [310, 45, 90], 4, 2, 64, 64,
                           torch.bfloat16)

    def f(q, k, v):
        return flashjit.attention_varlen(q, k, v, cq, ck, 300, 310,
                                         causal=True).float().square().sum()

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    want = f(*leaves)
    want_g = torch.autograd.grad(want, leaves)
    leaves2 = [t.detach().requires_grad_() for t in (q, k, v)]
    got = torch.compile(f, fullgraph=True)(*leaves2)
    got_g = torch.autograd.grad(got, leaves2)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2,
                                   atol=2e-2 * b.float().abs().max().item())


@cuda_only
def test_offsets_on_another_device_are_refused():
    q, k, v, cq, ck = make([10], [10], 1, 1, 64, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="cu_seqlens_q is on cpu"):
        flashjit.attention_varlen(q, k, v, cq.cpu(), ck)


def test_block_mask_over_the_sequences(seed):
    """block_mask= over a varlen batch ([B, H, ceil(max_q / S),
    ceil(max_k / S)], each sequence's blocks from its start), with a causal
    mask_mod whose full blocks are marked: each sequence against its float64
    reference under its part of the mask, forward and gradients."""
    lq, lk, H, d, S = [300, 1, 0, 700], [200, 40, 7, 1000], 4, 64, 128
    q, k, v, cq, ck = make(lq, lk, H, H, d, d, torch.bfloat16, grad=True)
    rng = np.random.default_rng(seed)
    B, qb, kb = len(lq), -(-max(lq) // S), -(-max(lk) // S)
    dense = rng.random((B, H, qb, kb)) < 0.6
    bm = flashjit.BlockMask.from_dense(dense, S, full=dense & (
        np.arange(qb)[:, None] > np.arange(kb)[None, :]))

    def causal(b, h, i, j):
        return j <= i

    o = flashjit.attention_varlen(q, k, v, cq, ck, mask_mod=causal,
                                  block_mask=bm)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    hq, hk = cq.cpu().numpy(), ck.cpu().numpy()
    for b in range(B):
        if lq[b] == 0 or lk[b] == 0:
            continue
        rows, keys = slice(hq[b], hq[b + 1]), slice(hk[b], hk[b + 1])
        seq = [x.detach()[s].float().cpu().numpy().transpose(1, 0, 2)[None]
               for x, s in ((q, rows), (k, keys), (v, keys))]
        i = np.arange(lq[b])[:, None]
        j = np.arange(lk[b])[None, :]
        blocks = np.repeat(np.repeat(dense[b], S, 1), S, 2)
        vis = ((j <= i)[None] & blocks[:, :lq[b], :lk[b]])[None]
        ro, _ = reference.attention_ref(*seq, None, vis)
        got = o.detach()[rows].float().cpu().numpy().transpose(1, 0, 2)[None]
        assert rel_err(got, ro) <= BOUND[torch.bfloat16]
        want = reference.attention_grads_ref(
            *seq, got, d_o[rows].float().cpu().numpy().transpose(1, 0, 2)[None],
            None, vis)
        for g, w, s in ((q.grad, want[0], rows), (k.grad, want[1], keys),
                        (v.grad, want[2], keys)):
            assert rel_err(g[s].float().cpu().numpy().transpose(1, 0, 2)[None],
                           w) <= GRAD_BOUND[torch.bfloat16]


def test_create_block_mask_by_the_kernel(seed):
    """create_block_mask(..., kernel=True) on DEVICE (flashjit_mask_blocks
    queued on torch's current stream) equals the default evaluation of the
    mask function by torch on DEVICE: the same blocks and full marks, for
    a mask over captured segment ids, an offset, the batch and the head,
    lengths that are no multiple of the block; the copy the mask keeps on
    the device lists the same blocks, and attention runs alike with either
    mask."""
    rng = np.random.default_rng(seed)
    B, H, Nq, Nkv, d = 2, 3, 1000, 777, 64
    cuts = torch.from_numpy(np.sort(rng.choice(np.arange(1, 700), 5, False)))
    sq = torch.bucketize(torch.arange(Nq), cuts, right=True).to(DEVICE)
    skv = torch.bucketize(torch.arange(Nkv), cuts, right=True).to(DEVICE)

    def fn(b, h, i, j):
        return ((sq[i] == skv[j]) & (j <= i + 50 * h - 30 * b)) | (
            j < 24 * (h + b))

    q, k, v = (torch.randn(B, H, n, d, dtype=torch.bfloat16, device=DEVICE)
               for n in (Nq, Nkv, Nkv))
    for S in (64, 128):
        got = flashjit.create_block_mask(fn, B, H, Nq, Nkv, device=DEVICE,
                                         BLOCK_SIZE=S, kernel=True, like=q)
        want = flashjit.create_block_mask(fn, B, H, Nq, Nkv, device=DEVICE,
                                          BLOCK_SIZE=S)
        assert got.shape == want.shape == (B, H, -(-Nq // S), -(-Nkv // S))
        assert np.array_equal(got.counts, want.counts)
        assert np.array_equal(got.indices, want.indices)  # full marks too
        assert (got.indices < 0).any() and 0.1 < got.density() < 0.9
        counts, indices = got._device_tensors(q.device)
        assert counts.device == q.device
        assert torch.equal(counts.cpu(), torch.from_numpy(want.counts))
        # The entries past a count are unspecified (on CUDA the kernel's
        # block classes stay there): the listed ones must agree.
        listed = np.arange(indices.shape[-1]) < want.counts[..., None]
        assert np.array_equal(indices.cpu().numpy()[listed],
                              want.indices[listed])
        o = flashjit.attention(q, k, v, mask_mod=fn, block_mask=got)
        assert torch.equal(o, flashjit.attention(q, k, v, mask_mod=fn,
                                                 block_mask=want))
    b, h, i, j = reference.positions((B, H, Nq, Nkv))
    hq, hkv = sq.cpu().numpy(), skv.cpu().numpy()
    vis = ((hq[i] == hkv[j]) & (j <= i + 50 * h - 30 * b)) | (j < 24 * (h + b))
    ro, _ = reference.attention_ref(host(q), host(k), host(v), None, vis)
    assert rel_err(host(o), ro) <= BOUND[torch.bfloat16]


def test_create_block_mask_varlen_by_the_kernel(seed):
    """create_block_mask(..., kernel=True, cu_seqlens_q=, cu_seqlens_k=)
    on DEVICE (flashjit_mask_blocks_varlen, the offsets on the device): a
    row per sequence, each equal to the mask's blocks for that sequence
    alone (b its index, its own positions), count 0 past its Q blocks;
    attention_varlen with it equals attention_varlen with the mask and no
    layout."""
    rng = np.random.default_rng(seed)
    H, d, S = 3, 64, 64
    lq = [int(x) for x in rng.integers(1, 600, 4)]
    lk = [int(x) for x in rng.integers(1, 600, 4)]
    cu_q = torch.tensor([0] + list(np.cumsum(lq)), dtype=torch.int32,
                        device=DEVICE)
    cu_k = torch.tensor([0] + list(np.cumsum(lk)), dtype=torch.int32,
                        device=DEVICE)

    def fn(b, h, i, j):
        return ((j <= i + 50 * h - 30 * b) & (i < j + 300)) | (
            j < 24 * (h + b))

    bm = flashjit.create_block_mask(fn, None, H, max(lq), max(lk),
                                    device=DEVICE, BLOCK_SIZE=S, kernel=True,
                                    cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert bm.shape == (4, H, -(-max(lq) // S), -(-max(lk) // S))
    for b in range(4):
        want = flashjit.create_block_mask(
            lambda _, h, i, j, b=b: fn(b, h, i, j), 1, H, lq[b], lk[b],
            device=DEVICE, BLOCK_SIZE=S)
        qb = want.shape[2]
        assert np.array_equal(bm.counts[b, :, :qb], want.counts[0]), b
        assert not bm.counts[b, :, qb:].any(), b
        listed = np.arange(want.shape[3]) < want.counts[0][..., None]
        assert np.array_equal(bm.indices[b, :, :qb, :want.shape[3]][listed],
                              want.indices[0][listed]), b
    q, k, v = (torch.randn(sum(n), H, d, dtype=torch.bfloat16, device=DEVICE)
               for n in (lq, lk, lk))
    plain = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                      mask_mod=fn)
    got = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                    mask_mod=fn, block_mask=bm)
    assert rel_err(host(got), host(plain)) <= BOUND[torch.bfloat16]
    with pytest.raises(TypeError, match="int32"):  # as attention_varlen
        flashjit.create_block_mask(fn, None, H, max(lq), max(lk),
                                   device=DEVICE, BLOCK_SIZE=S, kernel=True,
                                   cu_seqlens_q=cu_q.long(), cu_seqlens_k=cu_k)
