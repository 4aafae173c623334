"""Variable-length packing (flashjit.attention_varlen,
attention_backward_varlen, flashjit::attention_varlen_fwd / _bwd) on the CPU
execution mode: numpy arrays and torch CPU tensors.

Every output is checked sequence by sequence against the float64 reference
of that sequence alone (reference.varlen_attention_ref /
varlen_grads_ref), on fresh random inputs and lengths each run (a failure
prints its seed): lengths that do not divide the tiles, sequences without
keys or without queries, causal with Nq != Nkv per sequence (bottom-right
aligned per sequence), windows, GQA, score modifiers that read the
sequence index and positions within the sequence, captured tensors and
their gradients, both dQ modes. lse's padding must be -inf, the rows of no
sequence 0, nothing NaN; the reference with shifted offsets or positions
counted across sequences must miss (the checks can fail).

The numpy tests need numpy only; the torch tests skip without torch.
"""

import numpy as np
import pytest

import flashjit
import reference
from reference import cu_seqlens, lse_err, rel_err
from varlen_cases import (BOUND, CASES, GRAD_BOUND, as64, check_forward,
                          fresh_rng, kernel_view, needs_torch, packed, torch,
                          torch_packed)


@pytest.fixture
def rng():
    return fresh_rng()



@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_numpy(case, dtype, rng):
    lq, lk, H, Hkv, d, dv, opts = CASES[case]
    q, k, v, cq, ck = packed(rng, lq, lk, H, Hkv, d, dv, dtype)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, return_lse=True,
                                       **opts)
    assert o.dtype == q.dtype and o.shape == (cq[-1], H, dv)
    assert lse.dtype == np.float32
    assert lse.shape == (len(lq), H, max(lq))
    check_forward(o, lse, q, k, v, cq, ck, BOUND[dtype], **opts)
    # Without return_lse: o alone, the same values.
    np.testing.assert_array_equal(
        flashjit.attention_varlen(q, k, v, cq, ck, **opts), o)


def test_random_lengths_and_the_check_can_fail(rng):
    """Random lengths (0 included) and a random causal / window choice;
    the reference with the first boundary moved, or one batch row of
    dense attention over all tokens, misses by far."""
    B = int(rng.integers(3, 7))
    lq = rng.integers(0, 90, B)
    lk = rng.integers(0, 90, B)
    lq[0], lk[0] = max(lq[0], 8), max(lk[0], 8)
    lq[1], lk[1] = max(lq[1], 8), max(lk[1], 8)
    causal = bool(rng.integers(2))
    q, k, v, cq, ck = packed(rng, lq, lk, 4, 2, 32, 32)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, causal=causal,
                                       return_lse=True)
    check_forward(o, lse, q, k, v, cq, ck, BOUND[np.float16], causal=causal)
    shifted_q, shifted_k = cq.copy(), ck.copy()
    shifted_q[1] -= 3
    shifted_k[1] -= 3
    wrong, _ = reference.varlen_attention_ref(
        kernel_view(q), kernel_view(k), kernel_view(v), shifted_q, shifted_k,
        causal=causal)
    assert rel_err(o, wrong) > 10 * BOUND[np.float16]
    one, _ = reference.varlen_attention_ref(
        kernel_view(q), kernel_view(k), kernel_view(v),
        np.array([0, cq[-1]]), np.array([0, ck[-1]]), causal=causal)
    assert rel_err(o, one) > 10 * BOUND[np.float16]


def test_score_mod_sees_the_sequence_and_its_positions(rng):
    """A function of (b, i, j) and flashjit.variants' softcap: b is the
    sequence's index and i, j positions within the sequence; the
    reference with positions counted from the start of the packed tensors
    (the offsets ignored) misses."""
    from flashjit import variants as V

    def decay(s, b, h, i, j):
        return s - 0.05 * (b + 1) * (h + 1) * abs(i - j)

    lq, lk = [33, 20, 47], [40, 20, 47]
    q, k, v, cq, ck = packed(rng, lq, lk, 4, 2, 32, 32)
    for mod in (decay, V.softcap(2.0)):
        o, lse = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                           score_mod=mod, return_lse=True)
        check_forward(o, lse, q, k, v, cq, ck, BOUND[np.float16],
                      causal=True, score_mod=mod)
    # The reference with b always 0, or with positions counted from the
    # start of the packed tensors, misses.
    o = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                  score_mod=decay)
    for wrong_mod in (lambda s, b, h, i, j: decay(s, 0, h, i, j),
                      lambda s, b, h, i, j: decay(s, b, h, i + cq[b],
                                                  j + ck[b])):
        wrong, _ = reference.varlen_attention_ref(
            kernel_view(q), kernel_view(k), kernel_view(v), cq, ck,
            causal=True, score_mod=wrong_mod)
        assert rel_err(o, wrong) > 10 * BOUND[np.float16]


def test_mask_mod_and_window_per_sequence(rng):
    """A mask_mod (positions within the sequence) on top of causal."""
    lq, lk = [50, 13], [50, 29]
    q, k, v, cq, ck = packed(rng, lq, lk, 2, 2, 32, 32)
    o, lse = flashjit.attention_varlen(
        q, k, v, cq, ck, causal=True, return_lse=True,
        mask_mod=lambda b, h, i, j: (j % 3) != 1)

    def masked(s, b, h, i, j):
        return np.where((j % 3) != 1, s, -np.inf)

    check_forward(o, lse, q, k, v, cq, ck, BOUND[np.float16], causal=True,
                  score_mod=masked)


def test_rows_of_no_sequence_and_empty_totals(rng):
    """q, k, v rows past the last offsets belong to no sequence: o and the
    gradients are 0 there. No keys at all: o = 0, lse = -inf; no queries
    at all: empty outputs (no C call: the C API refuses tensors without
    rows)."""
    q, k, v, cq, ck = packed(rng, [20, 11], [20, 14], 2, 1, 16, 16)
    cq2, ck2 = cu_seqlens([20, 6]), cu_seqlens([20, 9])  # 5 rows unused
    o, lse = flashjit.attention_varlen(q, k, v, cq2, ck2, causal=True,
                                       return_lse=True)
    assert (o[26:] == 0).all()
    check_forward(o, lse, q, k, v, cq2, ck2, BOUND[np.float16], causal=True)
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    dq, dk, dv = flashjit.attention_backward_varlen(
        q, k, v, o, d_o, lse, cq2, ck2, causal=True)
    assert (dq[26:] == 0).all() and (dk[29:] == 0).all()
    assert (dv[29:] == 0).all()
    assert np.abs(dk[:29]).max() > 0

    z = np.zeros((0, 1, 16), np.float16)
    o, lse = flashjit.attention_varlen(q, z, z, cq, [0, 0, 0],
                                       return_lse=True)
    assert o.shape == q.shape and (o == 0).all()
    assert lse.shape == (2, 2, 20) and np.isneginf(lse).all()
    grads = flashjit.attention_backward_varlen(q, z, z, o, o, lse, cq,
                                               [0, 0, 0])
    assert all((g == 0).all() for g in grads)
    assert [g.shape for g in grads] == [q.shape, z.shape, z.shape]
    o, lse = flashjit.attention_varlen(q[:0], k, v, [0, 0, 0], ck,
                                       return_lse=True)
    assert o.shape == (0, 2, 16) and lse.shape == (2, 2, 1)
    assert np.isneginf(lse).all()


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", ["causal-mixed", "full-gqa4", "window-mqa",
                                  "no-queries"])
def test_backward_numpy(case, deterministic, rng):
    lq, lk, H, Hkv, d, dv, opts = CASES[case]
    q, k, v, cq, ck = packed(rng, lq, lk, H, Hkv, d, dv)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, return_lse=True,
                                       **opts)
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    got = flashjit.attention_backward_varlen(
        q, k, v, o, d_o, lse, cq, ck, deterministic=deterministic, **opts)
    want = reference.varlen_grads_ref(
        *(kernel_view(x) for x in (q, k, v, o, d_o)), cq, ck, **opts)
    floor = 1e-3 * max(np.linalg.norm(w) for w in want)
    for name, g, w, like in zip(("dq", "dk", "dv"), got, want, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, name
        assert not np.isnan(g).any(), name
        err = np.linalg.norm(g.astype(np.float64) - w) / max(
            np.linalg.norm(w), floor)
        assert err <= GRAD_BOUND[np.float16], (name, err)
    if deterministic:  # bit-identical run to run
        again = flashjit.attention_backward_varlen(
            q, k, v, o, d_o, lse, cq, ck, deterministic=True, **opts)
        for a, b in zip(got, again):
            np.testing.assert_array_equal(a, b)
    # The gradients with the first boundary moved miss (measured on the
    # first two sequences, the ones it changes).
    cq2, ck2 = cq.copy(), ck.copy()
    cq2[1] += 1 if lq[0] == 0 else -1
    ck2[1] -= 1
    wrong = reference.varlen_grads_ref(
        *(kernel_view(x) for x in (q, k, v, o, d_o)), cq2, ck2, **opts)
    rows = (cq[2], ck[2], ck[2])
    assert max(rel_err(g[:n], w[:n]) for g, w, n in zip(got, wrong, rows)) \
        > 10 * GRAD_BOUND[np.float16]


def test_backward_float32_bf16(rng):
    q, k, v, cq, ck = packed(rng, [45, 70], [60, 70], 4, 2, 32, 32,
                             np.float32)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                       return_lse=True)
    d_o = rng.standard_normal(o.shape).astype(np.float32)
    got = flashjit.attention_backward_varlen(q, k, v, o, d_o, lse, cq, ck,
                                             causal=True)
    want = reference.varlen_grads_ref(
        *(kernel_view(x) for x in (q, k, v, o, d_o)), cq, ck, causal=True)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        assert rel_err(g, w) <= GRAD_BOUND[np.float32], rel_err(g, w)


def test_captured_bias_and_its_gradient_numpy(rng):
    """A captured bias[h, i, j] (positions within the sequence) read by
    every sequence; its gradient (capture_grads=True) is the sum over
    sequences of d loss / d s' at each (h, i, j)."""
    F = flashjit.score_ops
    lq, lk = [12, 30, 7], [20, 30, 16]
    H = 2
    q, k, v, cq, ck = packed(rng, lq, lk, H, 1, 16, 16)
    bias = rng.standard_normal((H, max(lq), max(lk))).astype(np.float32)
    cap = F.captured(bias)

    def fn(s, b, h, i, j):
        return s + cap[h, i, j]

    def fn_ref(s, b, h, i, j):
        return s + bias[h, i, j]

    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                       score_mod=fn, return_lse=True)
    check_forward(o, lse, q, k, v, cq, ck, BOUND[np.float16], causal=True,
                  score_mod=fn_ref)
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    dq, dk, dv, (dbias,) = flashjit.attention_backward_varlen(
        q, k, v, o, d_o, lse, cq, ck, causal=True, score_mod=fn,
        capture_grads=True)
    assert dbias.shape == bias.shape and dbias.dtype == np.float32
    G = reference.varlen_score_grads_ref(
        *(kernel_view(x) for x in (q, k, v, o, d_o)), cq, ck, causal=True,
        score_mod=fn_ref)
    want = np.zeros(bias.shape)
    for g in G:
        want[:, :g.shape[1], :g.shape[2]] += g
    assert rel_err(dbias, want) <= 5e-3, rel_err(dbias, want)
    # Every sequence's share counts: without the first one's, it misses.
    first = np.zeros(bias.shape)
    first[:, :12, :20] = G[0]
    assert rel_err(dbias, want - first) > 5e-2
    want_q = reference.varlen_grads_ref(
        *(kernel_view(x) for x in (q, k, v, o, d_o)), cq, ck, causal=True,
        score_mod=fn_ref)
    for g, w in zip((dq, dk, dv), want_q):
        assert rel_err(g, w) <= GRAD_BOUND[np.float16]


def test_max_seqlen_given(rng):
    """max_seqlen_q / _k larger than the longest sequence: the same o, lse
    padded to it; smaller: a named error."""
    q, k, v, cq, ck = packed(rng, [10, 30], [25, 5], 2, 2, 16, 16)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, return_lse=True)
    o2, lse2 = flashjit.attention_varlen(q, k, v, cq, ck, max_seqlen_q=64,
                                         max_seqlen_k=40, return_lse=True)
    np.testing.assert_array_equal(o, o2)
    assert lse2.shape == (2, 2, 64)
    np.testing.assert_array_equal(lse2[:, :, :30], lse)
    assert np.isneginf(lse2[:, :, 30:]).all()
    with pytest.raises(ValueError, match="max_seqlen_q = 29 is shorter than "
                                         "the longest sequence \\(30\\)"):
        flashjit.attention_varlen(q, k, v, cq, ck, max_seqlen_q=29)
    with pytest.raises(ValueError, match="max_seqlen_k = 24"):
        flashjit.attention_varlen(q, k, v, cq, ck, max_seqlen_k=24)
    with pytest.raises(TypeError, match="max_seqlen_k must be an int"):
        flashjit.attention_varlen(q, k, v, cq, ck, max_seqlen_k=25.0)
    with pytest.raises(ValueError, match="must be in \\[1, 2\\*\\*31 - 1\\]"):
        flashjit.attention_varlen(q, k, v, cq, ck, max_seqlen_q=0)


@pytest.mark.parametrize("args, error, message", [
    (dict(cu_seqlens_q=np.array([0, 10, 40], np.int64)), TypeError,
     "cu_seqlens_q must be int32 offsets, got dtype int64"),
    (dict(cu_seqlens_k=np.array([[0, 25, 30]], np.int32)), ValueError,
     "cu_seqlens_k must be 1-D"),
    (dict(cu_seqlens_k=np.array([0, 30], np.int32)), ValueError,
     "one length \\(batch \\+ 1\\), got 3 and 2"),
    (dict(cu_seqlens_q=np.array([0], np.int32),
          cu_seqlens_k=np.array([0], np.int32)), ValueError,
     "at least 2 offsets"),
    (dict(cu_seqlens_q=[1, 10, 40]), ValueError,
     "cu_seqlens_q\\[0\\] must be 0, got 1"),
    (dict(cu_seqlens_q=[0, 12, 10]), ValueError,
     "non-decreasing: cu_seqlens_q\\[2\\] = 10 < cu_seqlens_q\\[1\\] = 12"),
    (dict(cu_seqlens_k=[0, 25, 31]), ValueError,
     "cu_seqlens_k\\[-1\\] = 31 is past the packed tensor's 30 tokens"),
    (dict(cu_seqlens_q=[0, 2**31, 40]), ValueError, "past int32"),
    (dict(cu_seqlens_q=[0, 1.5, 40]), TypeError, "sequence of ints"),
    (dict(q=np.zeros((1, 40, 2, 16), np.float16)), ValueError,
     "q must be 3-D \\(total_tokens, heads, head_dim\\)"),
    (dict(v=np.zeros((29, 2, 16), np.float16)), ValueError,
     "k and v must agree in \\(total_k, heads\\)"),
    (dict(k=np.zeros((30, 3, 16), np.float16),
          v=np.zeros((30, 3, 16), np.float16)), ValueError,
     "multiple of k's and v's \\(3\\)"),
    (dict(k=np.zeros((30, 2, 8), np.float16)), ValueError,
     "head dims differ"),
    (dict(q=np.zeros((40, 2, 16)), k=np.zeros((30, 2, 16)),
          v=np.zeros((30, 2, 16))), TypeError,
     "numpy inputs must be float16 or float32"),
    (dict(k=np.zeros((30, 2, 16), np.float32)), TypeError,
     "dtypes differ"),
    (dict(q=[[0.0]]), TypeError, "expected torch CUDA tensors or numpy"),
    (dict(causal=True, window=(3, 0)), ValueError, "exclusive"),
])
def test_named_errors_numpy(args, error, message):
    base = dict(q=np.zeros((40, 2, 16), np.float16),
                k=np.zeros((30, 2, 16), np.float16),
                v=np.zeros((30, 2, 16), np.float16),
                cu_seqlens_q=np.array([0, 10, 40], np.int32),
                cu_seqlens_k=np.array([0, 25, 30], np.int32))
    base.update(args)
    with pytest.raises(error, match=message):
        flashjit.attention_varlen(**base)


def test_backward_named_errors(rng):
    q, k, v, cq, ck = packed(rng, [10, 30], [25, 5], 2, 2, 16, 16)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, return_lse=True)
    with pytest.raises(ValueError, match="lse must be \\(2, 2, 30\\)"):
        flashjit.attention_backward_varlen(q, k, v, o, o, lse[:, :, :10], cq,
                                           ck)
    with pytest.raises(ValueError, match="o and d_o must be"):
        flashjit.attention_backward_varlen(q, k, v, o, o[:5], lse, cq, ck)
    bad = lse.copy()
    bad[1, 0, 3] = np.nan  # a row of sequence 1: refused by the C API
    with pytest.raises(flashjit.InvalidArgumentError, match="lse"):
        flashjit.attention_backward_varlen(q, k, v, o, o, bad, cq, ck)
    bad = lse.copy()
    bad[0, 0, 20] = np.nan  # padding (sequence 0 has 10 queries): not read
    flashjit.attention_backward_varlen(q, k, v, o, o, bad, cq, ck)


def test_compile_emits_the_varlen_kernel():
    """flashjit.compile(varlen=True): the description carries varlen, the
    tiled functions read the offsets (a dense kernel's do not); a
    block-sparse varlen kernel reads its layout too (the binding's varlen
    calls take no layout yet: C API and CLI)."""
    k = flashjit.compile(64, causal=True, varlen=True)
    assert "varlen = true" in k.emit("attn")
    tile = k.emit("tile")
    assert '"cu_seqlens_q", "cu_seqlens_kv"' in tile
    assert "memref.load %arg7" in tile
    assert "memref.load %arg7" not in flashjit.compile(64, causal=True).emit(
        "tile")
    bwd = flashjit.compile(64, varlen=True, backward=True).emit("tile")
    assert "memref.load %arg15" in bwd
    sparse = flashjit.compile(64, varlen=True, sparse_block=128).emit("tile")
    assert "varlen = true" not in sparse  # the tile stage: offsets read
    assert "memref.load %arg7" in sparse and "memref.load %arg6" in sparse


def test_block_mask_over_the_sequences(rng):
    """attention_varlen(block_mask=) with a layout [B, H, ceil(max_q / S),
    ceil(max_k / S)], each sequence's blocks from its own start (blocks
    past a sequence's keys masked there): each sequence against a float64
    reference with its part of the mask, forward and backward; the torch
    CPU op gives the same bits as the numpy path, and without the mask the
    output differs (the layout was used)."""
    lq, lk, H, d, S = [40, 1, 70, 0], [50, 9, 70, 5], 2, 32, 16
    q, k, v, cq, ck = packed(rng, lq, lk, H, H, d, d)
    B, qb, kb = len(lq), -(-max(lq) // S), -(-max(lk) // S)
    dense = rng.random((B, H, qb, kb)) < 0.6
    bm = flashjit.BlockMask.from_dense(dense, S)
    o, lse = flashjit.attention_varlen(q, k, v, cq, ck, causal=True,
                                       block_mask=bm, return_lse=True)
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    dq, dk, dv = flashjit.attention_backward_varlen(
        q, k, v, o, d_o, lse, cq, ck, causal=True, block_mask=bm)
    plain = flashjit.attention_varlen(q, k, v, cq, ck, causal=True)
    assert not np.array_equal(o, plain)
    for b in range(B):
        if lq[b] == 0:
            continue
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        seq = [x[s].transpose(1, 0, 2)[None] for x, s in
               ((q, rows), (k, keys), (v, keys))]
        vis = reference.visible_mask(lq[b], lk[b], causal=True)
        blocks = np.repeat(np.repeat(dense[b], S, 1), S, 2)
        vis = vis & blocks[None, :, :lq[b], :lk[b]]
        ro, rl = reference.attention_ref(*seq, None, vis)
        got = o[rows].transpose(1, 0, 2)[None]
        assert rel_err(got, ro) <= BOUND[np.float16]
        assert lse_err(lse[b:b + 1, :, :lq[b]], rl) <= BOUND[np.float16]
        want = reference.attention_grads_ref(
            *seq, got, d_o[rows].transpose(1, 0, 2)[None], None, vis)
        for g, w, s in ((dq, want[0], rows), (dk, want[1], keys),
                        (dv, want[2], keys)):
            if lk[b]:
                assert rel_err(g[s].transpose(1, 0, 2)[None], w) <= \
                    GRAD_BOUND[np.float16]
    torch = pytest.importorskip("torch")
    t = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    ot = flashjit.attention_varlen(*t, torch.from_numpy(cq),
                                   torch.from_numpy(ck), causal=True,
                                   block_mask=bm)
    assert np.array_equal(ot.detach().numpy(), o)
    ot.backward(torch.from_numpy(d_o))  # autograd: the op's backward
    for g, want in zip(t, (dq, dk, dv)):
        assert np.array_equal(g.grad.numpy(), want)
