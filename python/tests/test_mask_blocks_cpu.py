"""flashjit.create_block_mask(..., kernel=True) on the CPU: the layout that
flashjit's block-classification kernel writes (the C API's
flashjit_mask_blocks) against the default evaluation of the mask function
in Python (BlockMask.from_mask_mod): the same listed blocks and the same
full marks, for a document mask over captured segment ids, a banded mask
with an offset and a mask of the batch and head, with B / H given and
None, lengths that are no multiple of the block and blocks of 32 and 128.
A different mask gives a different layout (full marks alone too);
attention with the kernel's layout matches the float64 reference (and a
wrong layout does not); what the C API refuses is its named error."""

import ctypes

import numpy as np
import pytest

import flashjit
from flashjit import _lib
from flashjit import score_ops as F

import score_mods
from reference import attention_ref, lse_err, rel_err

BOUND = 1e-2


def document(nq, nkv, docs=4):
    """ids[i] == ids[j] over two captured int arrays, the query and key
    positions split into `docs` documents proportionally (edges inside
    blocks and, with Nq == Nkv == 256, on them)."""
    sq = F.captured(np.arange(nq) * docs // nq)
    skv = F.captured(np.arange(nkv) * docs // nkv)

    def mask(b, h, i, j):
        return sq[i] == skv[j]
    return mask


def banded(nq, nkv, ahead=-30, behind=200):
    """A band of the positions with an offset: i - behind < j <= i + ahead."""
    def mask(b, h, i, j):
        return (j <= i + ahead) & (i < j + behind)
    return mask


def by_batch_and_head(nq, nkv, prefix=64):
    """A prefix that grows with h and b (whole blocks kept: full) or a
    band whose offsets depend on both."""
    def mask(b, h, i, j):
        return (j < prefix * (h + 1) + 16 * b) | (
            (j <= i + 30 * h - 20 * b) & (i < j + 100 + 10 * b))
    return mask


MASKS = {"document": document, "banded": banded,
         "by_batch_and_head": by_batch_and_head}


def kernel_mask(fn, B, H, nq, nkv, bs, **kw):
    return flashjit.create_block_mask(fn, B, H, nq, nkv, BLOCK_SIZE=bs,
                                      kernel=True, **kw)


def python_mask(fn, B, H, nq, nkv, bs):
    return flashjit.create_block_mask(fn, B, H, nq, nkv, BLOCK_SIZE=bs)


def same_layout(a, b):
    """Equal BlockMasks: shape, block size, counts and every entry (the
    listed blocks with their full marks; the others normalised to 0)."""
    return (a.shape == b.shape and a.block_size == b.block_size
            and np.array_equal(a.counts, b.counts)
            and np.array_equal(a.indices, b.indices))


def assert_same_layout(got, want):
    assert got.shape == want.shape and got.block_size == want.block_size
    assert np.array_equal(got.to_dense(), want.to_dense()), "listed blocks"
    assert np.array_equal(got.to_dense(full_only=True),
                          want.to_dense(full_only=True)), "full marks"
    assert np.array_equal(got.counts, want.counts)
    assert np.array_equal(got.indices, want.indices)


@pytest.mark.parametrize("name", sorted(MASKS))
@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("nq,nkv", [(200, 300), (300, 170), (256, 256)])
@pytest.mark.parametrize("B,H", [(2, 3), (None, None), (2, None), (None, 3)])
def test_kernel_layout_equals_the_python_evaluation(name, bs, nq, nkv, B, H):
    fn = MASKS[name](nq, nkv)
    got = kernel_mask(fn, B, H, nq, nkv, bs)
    want = python_mask(fn, B, H, nq, nkv, bs)
    assert isinstance(got, flashjit.BlockMask)
    assert got.shape == (B or 1, H or 1, -(-nq // bs), -(-nkv // bs))
    assert_same_layout(got, want)
    # Not a vacuous layout: blocks kept and blocks skipped.
    dense = got.to_dense()
    assert dense.any() and not dense.all()


def test_the_cases_have_full_and_partial_blocks():
    """The cases above see full marks and partial blocks (so their check
    of the full marks is not vacuous)."""
    for name, make in MASKS.items():
        fn = make(200, 300)
        bm = kernel_mask(fn, 2, 3, 200, 300, 32)
        full = bm.to_dense(full_only=True)
        assert full.any() and (bm.to_dense() & ~full).any(), name


def test_a_different_mask_gives_a_different_layout():
    """The comparison sees a changed mask: a band shifted by one block
    changes the counts; one element masked in a document only turns a
    full block partial (the same counts; only the marks differ); a mask
    of h evaluated with H None differs from H given."""
    nq = nkv = 256
    a = kernel_mask(banded(nq, nkv), 2, 3, nq, nkv, 32)
    b = python_mask(banded(nq, nkv, ahead=-30 + 32), 2, 3, nq, nkv, 32)
    assert not np.array_equal(a.counts, b.counts) and not same_layout(a, b)

    s = F.captured(np.repeat([0, 1], [96, 160]))
    a = kernel_mask(lambda b, h, i, j: s[i] == s[j], None, None, nq, nkv, 32)
    b = python_mask(lambda b, h, i, j: (s[i] == s[j]) & ~((i == 5) & (j == 7)),
                    None, None, nq, nkv, 32)
    assert np.array_equal(a.counts, b.counts)
    assert np.array_equal(a.to_dense(), b.to_dense())
    assert not same_layout(a, b)
    with pytest.raises(AssertionError, match="full marks"):
        assert_same_layout(a, b)

    fn = by_batch_and_head(nq, nkv)
    a = kernel_mask(fn, 1, 3, nq, nkv, 32)
    b = python_mask(fn, 1, None, nq, nkv, 32)
    assert not same_layout(a, b)
    assert not same_layout(a, kernel_mask(fn, 1, None, nq, nkv, 32))


def test_region_text_is_taken_as_attention_takes_it():
    """A mask_mod region's text (starting with "{") gives the layout of
    the function traced into it."""
    from flashjit import mask_mods

    fn = banded(200, 300)
    text, caps = mask_mods.trace_mask_with_captures(fn)
    assert caps == [] and text.lstrip().startswith("{")
    assert_same_layout(kernel_mask(text, 2, 3, 200, 300, 32),
                       python_mask(fn, 2, 3, 200, 300, 32))


def test_attention_with_the_kernels_layout_matches_the_reference():
    """attention(q, k, v, mask_mod=fn, block_mask=bm) with bm from the
    kernel (like=q: the kernel it compiled is the one attention runs: no
    new kernel is compiled) against the float64 reference of the masked
    attention; a layout of another mask (skipping blocks fn keeps) fails
    it."""
    rng = np.random.default_rng()
    B, H, Nq, Nkv, d, bs = 2, 2, 200, 300, 32, 32
    q, k, v = [rng.standard_normal((B, H, n, d)).astype(np.float16)
               for n in (Nq, Nkv, Nkv)]
    doc = document(Nq, Nkv, docs=3)

    def fn(b, h, i, j):  # causal from the bottom right, in documents
        return doc(b, h, i, j) & (j <= i + Nkv - Nq) | (j < 8 * (h + 1))

    bm = kernel_mask(fn, B, H, Nq, Nkv, bs, like=q)
    assert (bm.indices < 0).any() and bm.density() < 0.7
    handle = _lib.handle(_lib.DEVICE_CPU)
    compiled = _lib.lib().flashjit_cached_kernels(handle)
    o, lse = flashjit.attention(q, k, v, mask_mod=fn, block_mask=bm,
                                return_lse=True)
    assert _lib.lib().flashjit_cached_kernels(handle) == compiled
    vis = score_mods.visible_by(fn, (B, H, Nq, Nkv))
    ro, rl = attention_ref(q, k, v, None, vis)
    assert rel_err(o, ro) <= BOUND, rel_err(o, ro)
    assert lse_err(lse, rl) <= BOUND, lse_err(lse, rl)
    narrow = kernel_mask(lambda b, h, i, j: doc(b, h, i, j) & (j <= i),
                         B, H, Nq, Nkv, bs)
    wrong = flashjit.attention(q, k, v, mask_mod=fn, block_mask=narrow)
    assert rel_err(wrong, ro) > BOUND


def test_varlen_rows_are_each_sequences_own():
    """cu_seqlens_q / cu_seqlens_k (flashjit_mask_blocks_varlen): a row
    per sequence, each classified on its own lengths and positions with b
    its index: each row is from_mask_mod's of that sequence alone, count 0
    past its Q blocks; attention_varlen with it gives the mask's attention
    without a layout (a layout over the longest sequence's lengths for
    every row does not); B that is not the sequences' count, or one of the
    offsets alone, is a ValueError; int64 offsets a TypeError (as
    attention_varlen's)."""
    lq, lk, H, bs = [100, 7, 200], [300, 40, 150], 2, 32
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    fn = by_batch_and_head(0, 0)
    bm = kernel_mask(fn, None, H, max(lq), max(lk), bs, cu_seqlens_q=cu_q,
                     cu_seqlens_k=cu_k)
    assert bm.shape == (3, H, -(-max(lq) // bs), -(-max(lk) // bs))
    for b in range(3):
        want = python_mask(lambda _, h, i, j, b=b: fn(b, h, i, j), 1, H,
                           lq[b], lk[b], bs)
        qb, kb = want.shape[2], want.shape[3]
        assert np.array_equal(bm.counts[b, :, :qb], want.counts[0]), b
        assert not bm.counts[b, :, qb:].any(), b
        for h in range(H):
            for r in range(qb):
                n = want.counts[0, h, r]
                assert np.array_equal(bm.indices[b, h, r, :n],
                                      want.indices[0, h, r, :n]), (b, h, r)
        assert kb <= bm.shape[3]
    rng = np.random.default_rng()
    q, k, v = [rng.standard_normal((sum(n), H, 32)).astype(np.float16)
               for n in (lq, lk, lk)]
    plain = flashjit.attention_varlen(q, k, v, cu_q, cu_k, mask_mod=fn)
    got = flashjit.attention_varlen(q, k, v, cu_q, cu_k, mask_mod=fn,
                                    block_mask=bm)
    assert rel_err(got, plain) <= BOUND, rel_err(got, plain)
    # Every row classified over the longest lengths (sequence 1's blocks
    # past its 40 keys listed, its queries' beyond 7): another layout.
    longest = kernel_mask(fn, 3, H, max(lq), max(lk), bs)
    assert not np.array_equal(longest.counts, bm.counts)
    with pytest.raises(ValueError, match="a row each"):
        kernel_mask(fn, 2, H, max(lq), max(lk), bs, cu_seqlens_q=cu_q,
                    cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="both"):
        kernel_mask(fn, None, H, max(lq), max(lk), bs, cu_seqlens_q=cu_q)
    # The offsets are checked as attention_varlen checks them: int32, not
    # narrowed silently; one length.
    with pytest.raises(TypeError, match="int32"):
        kernel_mask(fn, None, H, max(lq), max(lk), bs,
                    cu_seqlens_q=cu_q.astype(np.int64), cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="one length"):
        kernel_mask(fn, None, H, max(lq), max(lk), bs, cu_seqlens_q=cu_q,
                    cu_seqlens_k=cu_k[:-1])


def test_torch_cpu_tensors():
    """Captured torch CPU tensors and like=q a torch CPU tensor, device
    "cpu" (and torch.device("cpu")): the kernel's layout equals
    from_mask_mod's torch evaluation, and attention with it matches the
    reference."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(
        int(np.random.default_rng().integers(1 << 30)))
    B, H, Nq, Nkv, d, bs = 1, 2, 150, 230, 32, 32
    sq = torch.arange(Nq) * 3 // Nq
    skv = torch.arange(Nkv) * 3 // Nkv

    def fn(b, h, i, j):
        return (sq[i] == skv[j]) & (j <= i + 40 * h)

    q, k, v = (torch.randn(B, H, n, d, generator=g).to(torch.float16)
               for n in (Nq, Nkv, Nkv))
    for device in ("cpu", torch.device("cpu")):
        bm = flashjit.create_block_mask(fn, B, H, Nq, Nkv, device=device,
                                        BLOCK_SIZE=bs, kernel=True, like=q)
        want = flashjit.create_block_mask(fn, B, H, Nq, Nkv, device=device,
                                          BLOCK_SIZE=bs)
        assert_same_layout(bm, want)
        assert (bm.indices < 0).any()
    o = flashjit.attention(q, k, v, mask_mod=fn, block_mask=bm)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float16
    vis = score_mods.visible_by(
        lambda b, h, i, j: (sq.numpy()[i] == skv.numpy()[j]) & (j <= i + 40 * h),
        (B, H, Nq, Nkv))
    ro, _ = attention_ref(q.numpy(), k.numpy(), v.numpy(), None, vis)
    assert rel_err(o.numpy(), ro) <= BOUND
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        kernel_mask(fn, B, H, Nq, Nkv, bs, like=q.float())


def test_bad_inputs_are_named_errors():
    fn = document(64, 64)
    ok = dict(B=2, H=2, Q_LEN=64, KV_LEN=64, BLOCK_SIZE=32)

    def make(**kw):
        args = dict(ok, **kw)
        return flashjit.create_block_mask(args.pop("mask_mod", fn),
                                          kernel=True, **args)

    make()  # the baseline is accepted
    E = flashjit.InvalidArgumentError
    # What the C API refuses: its error with its message.
    with pytest.raises(E, match="flashjit_mask_blocks: .*only a "
                       "block-sparse kernel with a mask_mod region"):
        make(mask_mod=None)
    with pytest.raises(E, match="batch must be in \\[1, "):
        make(B=0)
    with pytest.raises(E, match="heads must be in \\[1, "):
        make(H=-1)
    with pytest.raises(E, match="seq_len must be in \\[1, "):
        make(Q_LEN=0)
    with pytest.raises(E, match="seq_len_kv must be in \\[1, "):
        make(KV_LEN=-7)
    for bs in (0, -3, 1 << 17):
        with pytest.raises(E, match="sparse_block must be in \\[1, 65536\\]"):
            make(BLOCK_SIZE=bs)
    with pytest.raises(E, match="mask_mod"):
        make(mask_mod="{ ^bb0(%b: index): }")
    with pytest.raises(E, match="head_dim_qk must be in \\[1, 512\\]"):
        make(like=np.zeros((2, 2, 64, 1000), np.float16))
    assert isinstance(E("x"), ValueError)
    # The binding's own checks.
    with pytest.raises(F.TraceError, match="expected a function"):
        make(mask_mod=np.ones((2, 2), bool))  # a dense mask is no mask_mod
    with pytest.raises(TypeError, match="B must be an integer"):
        make(B=2.5)
    with pytest.raises(ValueError, match="fit in int64"):
        make(Q_LEN=1 << 64)
    with pytest.raises(TypeError, match="float16 or float32"):
        make(like=np.zeros((2, 2, 64, 32), np.float64))
    with pytest.raises(ValueError, match="like must be 4-D"):
        make(like=np.zeros((64, 32), np.float16))
    with pytest.raises(TypeError, match="like must be a numpy array"):
        make(like=[[1.0]])
    with pytest.raises(ValueError, match="needs kernel=True"):
        flashjit.create_block_mask(fn, 2, 2, 64, 64, like=np.zeros(
            (2, 2, 64, 32), np.float16))


def _raw_mask_blocks(spec, sizes, layout_dims, captures):
    """flashjit_mask_blocks through the binding, with a layout of
    layout_dims (batch, heads, q_blocks, kv_blocks) and captured float32
    arrays; the status's error raised (_lib.check)."""
    counts = np.zeros(layout_dims[:3], np.int32)
    indices = np.zeros(layout_dims, np.int32)
    layout = _lib.Layout()
    layout.counts, layout.indices = counts.ctypes.data, indices.ctypes.data
    (layout.batch, layout.heads, layout.q_blocks,
     layout.kv_blocks) = layout_dims
    caps, count = _lib.make_captured([(a.ctypes.data, a.size)
                                      for a in captures])
    _lib.check(_lib.lib().flashjit_mask_blocks(
        _lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec), *sizes,
        ctypes.byref(layout), caps, count, None))
    return counts, indices


def test_the_c_api_refuses_a_layout_that_does_not_fit():
    """The binding of flashjit_mask_blocks: a layout whose batch is
    neither the problem's nor 1, blocks that do not cover the problem, a
    missing captured tensor, a backward spec: the C API's named errors."""
    from flashjit import mask_mods

    ids = np.repeat([0.0, 1.0], [40, 24]).astype(np.float32)
    text, _ = mask_mods.trace_mask_with_captures(
        lambda b, h, i, j: F.captured(ids)[i] == F.captured(ids)[j])
    spec = _lib.make_spec(64, 64, _lib.DTYPE_BF16, _lib.MASK_NONE, 1, 32,
                          score_mod=_lib.join_modifiers("", text))
    counts, indices = _raw_mask_blocks(spec, (2, 2, 64, 64), (2, 2, 2, 2),
                                       [ids])
    # Documents 0..39 | 40..63 in blocks of 32: block (0, 0) full, the
    # others partial.
    assert counts.tolist() == [[[2, 2]] * 2] * 2
    assert indices.tolist() == [[[[~0, 1], [0, 1]]] * 2] * 2
    E = flashjit.InvalidArgumentError
    with pytest.raises(E, match="layout.batch must be 1 or 2, got 3"):
        _raw_mask_blocks(spec, (2, 2, 64, 64), (3, 2, 2, 2), [ids])
    with pytest.raises(E, match="layout: 2x1 blocks given, the problem "
                       "needs 2x2"):
        _raw_mask_blocks(spec, (2, 2, 64, 64), (2, 2, 2, 1), [ids])
    with pytest.raises(E, match="captures 1 tensors, the call gives 0"):
        _raw_mask_blocks(spec, (2, 2, 64, 64), (2, 2, 2, 2), [])
    back = _lib.make_spec(64, 64, _lib.DTYPE_BF16, _lib.MASK_NONE, 1, 32,
                          backward=True,
                          score_mod=_lib.join_modifiers("", text))
    with pytest.raises(E, match="direction must be forward"):
        _raw_mask_blocks(back, (2, 2, 64, 64), (2, 2, 2, 2), [ids])


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 1, 9, 4), (1, 2, 1, 1)])
def test_kv_major_is_the_transpose(shape):
    """block_mask.kv_major (the backward's KV-major layout, made on the
    host once per mask) against a transpose written out: each KV
    block's Q blocks in increasing order, ~qb where the pair is full, 0
    past the count; on random layouts with full pairs, one of them empty
    per shape."""
    from flashjit.block_mask import kv_major

    B, H, QB, KB = shape
    rng = np.random.default_rng()
    code = rng.integers(0, 3, size=shape)  # 0 none, 1 listed, 2 full
    code[0, 0] = 0
    counts = (code != 0).sum(-1).astype(np.int32)
    indices = np.zeros(shape, np.int32)
    for b, h, qb in np.ndindex(B, H, QB):
        listed = [kb if code[b, h, qb, kb] == 1 else ~kb
                  for kb in rng.permutation(KB) if code[b, h, qb, kb]]
        indices[b, h, qb, :len(listed)] = listed
        # Slots past the count hold anything (a BlockMask keeps 0s).
        indices[b, h, qb, len(listed):] = rng.integers(-KB, KB)
    got_counts, got_indices = kv_major(counts, indices)
    assert got_counts.dtype == np.int32 and got_indices.dtype == np.int32
    assert tuple(got_counts.shape) == (B, H, KB)
    assert tuple(got_indices.shape) == (B, H, KB, QB)
    for b, h, kb in np.ndindex(B, H, KB):
        want = [qb if code[b, h, qb, kb] == 1 else ~qb
                for qb in range(QB) if code[b, h, qb, kb]]
        assert got_counts[b, h, kb] == len(want)
        row = got_indices[b, h, kb].tolist()
        assert row == want + [0] * (QB - len(want)), (b, h, kb)
