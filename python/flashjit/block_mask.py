"""flashjit.BlockMask: a run-time block-sparse layout.

A layout says, for each (batch, head, query block), which key blocks a query
block attends to; blocks are square, `block_size` rows and columns (the
kernel's spec.sparse_block). It is stored in BCSR form, as FlexAttention
stores it: counts [B, H, Qb] and indices [B, H, Qb, KVb] (int32; the first
counts[b, h, qb] entries of a row are the listed key blocks). A batch or
head dimension of 1 broadcasts.

Build one from a dense boolean block matrix (numpy or torch) with
BlockMask.from_dense, from a mask function with BlockMask.from_mask_mod, or
from torch.nn.attention.flex_attention's BlockMask with
BlockMask.from_flex.

A listed block may be marked "full": the mask_mod that the attention is
given keeps every element of it, so the kernel does not evaluate the mask
there (FlexAttention's full blocks). An index entry k >= 0 lists block k
as partial, ~k = -k - 1 as full (the C API's encoding); without a
mask_mod both are attended to alike. from_mask_mod finds the full blocks
itself; a block marked full where the mask is not all true gives a wrong
result (the mask is not evaluated there). Needs numpy; torch only for torch inputs and for
use with torch tensors.
"""

import ctypes
import operator
import weakref

try:
    import numpy as np
except ImportError:  # flashjit imports without numpy; BlockMask needs it
    np = None

from . import _lib


def _need_numpy():
    if np is None:
        raise ImportError("flashjit.BlockMask needs numpy (pip install numpy)")


_MAX_BLOCK = 1 << 16  # spec.sparse_block's range in the C API


def _int_array(name, x):
    """x as an int64 numpy array; TypeError for non-integer elements (an
    index 0.7 is not truncated to 0) and ValueError past int64, so that a
    count of 2**32 + 1 is not wrapped to 1 by a cast to int32: the range
    checks see the true values."""
    a = _to_numpy(x)
    if a.size == 0:
        return np.zeros(a.shape, dtype=np.int64)
    if a.dtype == object:  # Python ints too large for int64, or a mix
        for v in a.flat:
            if isinstance(v, (bool, np.bool_)) or not isinstance(
                    v, (int, np.integer)):
                raise TypeError(f"flashjit.BlockMask: {name} must hold "
                                f"integers, got {v!r}")
            if not -(1 << 63) <= int(v) < (1 << 63):
                raise ValueError(f"flashjit.BlockMask: {name} holds {int(v)}, "
                                 "out of range")
        return np.ascontiguousarray(a, dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"flashjit.BlockMask: {name} must hold integers, got "
                        f"dtype {a.dtype} (values are not truncated)")
    if a.dtype.kind == "u" and int(a.max()) >= (1 << 63):
        raise ValueError(f"flashjit.BlockMask: {name} holds {int(a.max())}, "
                         "out of range")
    return np.ascontiguousarray(a, dtype=np.int64)


def _check_no_repeats(indices, counts, kv_blocks):
    """ValueError if a (batch, head, q block) lists a key block twice: the
    forward would count it twice (lse high by ln 2), the backward refuses
    it."""
    if not indices.size:
        return
    listed = np.arange(kv_blocks)[None, None, None, :] < counts[..., None]
    marked = np.where(listed, indices, kv_blocks)
    ordered = np.sort(marked, axis=-1)
    dup = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] < kv_blocks)
    if dup.any():
        b, h, qb, j = (int(x) for x in np.argwhere(dup)[0])
        raise ValueError(
            f"flashjit.BlockMask: key block {int(ordered[b, h, qb, j])} is "
            f"listed twice for batch {b}, head {h}, query block {qb}")


def _to_numpy(x):
    """numpy array of x (a numpy array, a torch tensor or a nested list)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def kv_major(counts, indices):
    """The KV-major transpose of a checked BCSR layout (numpy int32 counts
    [B, H, Qb], indices [B, H, Qb, KVb], an entry ~k marking a full pair):
    counts [B, H, KVb] and indices [B, H, KVb, Qb], int32, each KV block's
    Q blocks in increasing order (~qb where the pair is full), the slots
    past a count 0: flashjit_backward_kv_major's kv_layout. One (batch,
    head) at a time, so the temporaries stay a head's size."""
    B, H, QB, KB = indices.shape
    kv_counts = np.zeros((B, H, KB), np.int32)
    kv_indices = np.zeros((B, H, KB, QB), np.int32)
    slot = np.arange(KB)
    for b, h in np.ndindex(B, H):
        listed = slot < counts[b, h, :, None]
        entries = indices[b, h]
        full = entries < 0
        # A code per block pair (0 unlisted, 1 listed, 2 full); an unlisted
        # slot writes the extra column KB, dropped after.
        code = np.zeros((QB, KB + 1), np.int8)
        np.put_along_axis(code, np.where(listed, np.where(full, ~entries,
                                                          entries), KB),
                          np.where(listed, full + 1, 0).astype(np.int8),
                          axis=1)
        code = code[:, :KB].T
        # The listed Q blocks first, in increasing order (a stable sort).
        order = np.argsort(code == 0, axis=-1, kind="stable")
        taken = np.take_along_axis(code, order, -1)
        kv_indices[b, h] = np.where(taken == 2, ~order,
                                    np.where(taken == 1, order, 0))
        kv_counts[b, h] = (code != 0).sum(-1)
    return kv_counts, kv_indices


# The live BlockMasks by their device copies (_device_tensors): (device,
# counts' and indices' addresses) -> mask. While a mask lives its copies do,
# so no other allocation can take those addresses.
_owners = weakref.WeakValueDictionary()


def owner_of(counts, indices):
    """The live BlockMask whose device copies counts and indices are (the
    torch ops' block tensors, as flashjit.attention passes them), or None:
    same device, addresses, shapes and dtype."""
    bm = _owners.get((str(counts.device), counts.data_ptr(),
                      indices.data_ptr()))
    if bm is None:
        return None
    # Its copies on that device (cached under the device as the caller
    # named it: "cuda" or "cuda:0").
    for key, mine in bm._device_cache.items():
        if isinstance(key, str) and all(
                a.device == b.device and a.data_ptr() == b.data_ptr()
                and a.shape == b.shape and a.dtype == b.dtype
                for a, b in zip(mine, (counts, indices))):
            return bm
    return None


def _check_entries(counts, indices, kv_blocks):
    """ValueError unless every count is in [0, kv_blocks] and every listed
    entry names a key block in range (~k too) at most once per row."""
    if counts.size and (counts.min() < 0 or counts.max() > kv_blocks):
        bad = counts[(counts < 0) | (counts > kv_blocks)].flat[0]
        raise ValueError("flashjit.BlockMask: a count is out of range "
                         f"[0, {kv_blocks}]: {int(bad)}")
    listed = np.arange(kv_blocks)[None, None, None, :] < counts[..., None]
    blocks = np.where(indices < 0, ~indices, indices)  # ~k: k, full
    bad = listed & (blocks >= kv_blocks)
    if bad.any():
        raise ValueError("flashjit.BlockMask: a key block index is out of "
                         f"range [0, {kv_blocks}): "
                         f"{int(indices[bad].flat[0])} (~k, a negative "
                         "entry, marks block k full)")
    _check_no_repeats(np.where(listed, blocks, 0), counts, kv_blocks)
    return listed


class BlockMask:
    """A block-sparse layout of `block_size` x `block_size` blocks."""

    def __init__(self, counts, indices, block_size=128):
        _need_numpy()
        counts = _int_array("counts", counts)
        indices = _int_array("indices", indices)
        if counts.ndim != 3 or indices.ndim != 4:
            raise ValueError(
                "flashjit.BlockMask: counts must be [B, H, Qb] and indices "
                f"[B, H, Qb, KVb], got shapes {counts.shape} and "
                f"{indices.shape}")
        if indices.shape[:3] != counts.shape:
            raise ValueError(
                f"flashjit.BlockMask: indices' leading shape {indices.shape[:3]}"
                f" differs from counts' {counts.shape}")
        if isinstance(block_size, bool):
            raise TypeError("flashjit.BlockMask: block_size must be an int, "
                            f"got {block_size!r}")
        try:
            block_size = operator.index(block_size)  # 1.5 is not 1
        except TypeError:
            raise TypeError("flashjit.BlockMask: block_size must be an int, "
                            f"got {block_size!r}") from None
        if not 1 <= block_size <= _MAX_BLOCK:
            raise ValueError(
                f"flashjit.BlockMask: block_size must be in [1, {_MAX_BLOCK}]"
                f", got {block_size}")
        listed = _check_entries(counts, indices, indices.shape[3])
        # Unlisted slots are never read; keep them in range anyway.
        indices = np.where(listed, indices, 0)
        self.indices = np.ascontiguousarray(indices, dtype=np.int32)
        self.counts = np.ascontiguousarray(counts, dtype=np.int32)
        self.block_size = block_size
        self._device_cache = {}

    # -- construction -----------------------------------------------------

    @classmethod
    def from_dense(cls, mask, block_size=128, full=None):
        """From a boolean block matrix [Qb, KVb], [H, Qb, KVb] or
        [B, H, Qb, KVb] (numpy or torch; nonzero = attend). Missing leading
        dimensions broadcast. full: None, or a boolean matrix of the same
        shape marking the listed blocks whose elements the mask_mod keeps
        all (the kernel skips the mask there)."""
        _need_numpy()
        dense = _to_numpy(mask)
        if dense.ndim < 2 or dense.ndim > 4:
            raise ValueError(
                "flashjit.BlockMask.from_dense: expected a [Qb, KVb], "
                f"[H, Qb, KVb] or [B, H, Qb, KVb] matrix, got {dense.ndim} "
                "dimensions")
        dense = dense.astype(bool)
        while dense.ndim < 4:
            dense = dense[None]
        counts = dense.sum(axis=-1, dtype=np.int64).astype(np.int32)
        # Listed blocks first, in increasing order (a stable sort of "not").
        indices = np.argsort(~dense, axis=-1, kind="stable").astype(np.int32)
        if full is not None:
            full = np.broadcast_to(_to_numpy(full).astype(bool), dense.shape)
            marked = np.take_along_axis(full, indices.astype(np.int64), -1)
            indices = np.where(marked, ~indices, indices).astype(np.int32)
        return cls(counts, indices, block_size)

    @classmethod
    def from_mask_mod(cls, mask_mod, batch=None, heads=None, seq_len=128,
                      seq_len_kv=None, block_size=128, device=None):
        """The blocks a mask function ``mask_mod(b, h, i, j)`` (as
        flashjit.attention's mask_mod) keeps any element of, those it keeps
        every element of marked full: with it passed as mask_mod too, the
        kernel skips the blocks it masks whole, evaluates no mask in the
        full ones and masks the elements of the others. Evaluated one row of
        query blocks
        at a time (block_size x Nkv positions per batch and head, never
        N x N), by numpy, or by torch on ``device`` ("cuda": fast for long
        sequences). batch / heads None: the mask is taken not to depend on
        them (evaluated at 0; the layout broadcasts)."""
        _need_numpy()
        nq = operator.index(seq_len)
        nkv = nq if seq_len_kv is None else operator.index(seq_len_kv)
        bs = operator.index(block_size)
        if nq < 1 or nkv < 1 or not 1 <= bs <= _MAX_BLOCK:
            raise ValueError("flashjit.BlockMask.from_mask_mod: seq_len, "
                             "seq_len_kv >= 1 and block_size in [1, 65536] "
                             f"needed, got {nq}, {nkv}, {bs}")
        B = 1 if batch is None else operator.index(batch)
        H = 1 if heads is None else operator.index(heads)
        qb, kvb = -(-nq // bs), -(-nkv // bs)
        if device is None:
            put = np.asarray
        else:
            import torch

            def put(a):
                return torch.as_tensor(a, device=device)
        b = put(np.arange(B).reshape(B, 1, 1, 1))
        h = put(np.arange(H).reshape(1, H, 1, 1))
        j = put(np.arange(nkv).reshape(1, 1, 1, nkv))
        dense = np.zeros((B, H, qb, kvb), dtype=bool)
        full = np.zeros((B, H, qb, kvb), dtype=bool)
        pad = kvb * bs - nkv
        for r in range(qb):
            rows = np.arange(r * bs, min(nq, (r + 1) * bs))
            i = put(rows.reshape(1, 1, -1, 1))
            keep = mask_mod(b, h, i, j)
            shape = (B, H, rows.size, nkv)
            if device is None:
                keep = np.broadcast_to(np.asarray(keep, bool), shape)
                every, keep = keep.all(axis=2), keep.any(axis=2)
            else:
                keep = torch.as_tensor(keep, device=device).to(torch.bool)
                keep = keep.expand(shape)
                every = keep.all(dim=2).cpu().numpy()
                keep = keep.any(dim=2).cpu().numpy()
            if pad:  # positions past Nkv: never attended, never masked
                keep = np.concatenate(
                    [keep, np.zeros((B, H, pad), dtype=bool)], axis=-1)
                every = np.concatenate(
                    [every, np.ones((B, H, pad), dtype=bool)], axis=-1)
            dense[:, :, r] = keep.reshape(B, H, kvb, bs).any(axis=-1)
            full[:, :, r] = every.reshape(B, H, kvb, bs).all(axis=-1)
        return cls.from_dense(dense, block_size=bs, full=full & dense)

    @classmethod
    def from_flex(cls, flex_mask, include_partial=True):
        """From torch.nn.attention.flex_attention.BlockMask.

        FlexAttention lists "full" blocks (full_kv_num_blocks/indices) and
        "partial" ones (kv_num_blocks/indices) whose elements its mask_mod
        decides; so does this mask (full blocks marked full). Given to
        flashjit.attention with the same mask_mod, it is exact. With
        include_partial=False the partial blocks are dropped. Q and KV block
        sizes must be equal."""
        _need_numpy()
        bs = getattr(flex_mask, "BLOCK_SIZE", None)
        if bs is None:
            raise TypeError("flashjit.BlockMask.from_flex: expected a "
                            "FlexAttention BlockMask (no BLOCK_SIZE)")
        if isinstance(bs, int):
            bs = (bs, bs)
        if int(bs[0]) != int(bs[1]):
            raise ValueError(
                "flashjit.BlockMask.from_flex: flashjit needs square blocks, "
                f"got BLOCK_SIZE {tuple(int(b) for b in bs)}")
        block = int(bs[0])
        parts = []
        full_n = getattr(flex_mask, "full_kv_num_blocks", None)
        full_i = getattr(flex_mask, "full_kv_indices", None)
        if full_n is not None and full_i is not None:
            parts.append((_to_numpy(full_n), _to_numpy(full_i)))
        has_full = bool(parts)
        if include_partial or not parts:
            parts.append((_to_numpy(flex_mask.kv_num_blocks),
                          _to_numpy(flex_mask.kv_indices)))
        shape = parts[-1][1].shape  # [B, H, Qb, KVb]
        kv_blocks = shape[3]
        dense = np.zeros(shape[:3] + (kv_blocks + 1,), dtype=bool)
        full = None
        for n, (num, idx) in enumerate(parts):
            if has_full and n == 1:
                full = dense.copy()  # what the full lists listed
            num = np.broadcast_to(num, shape[:3])
            idx = np.broadcast_to(idx, shape)
            listed = np.arange(idx.shape[3])[None, None, None, :] < num[..., None]
            cols = np.where(listed, idx, kv_blocks).astype(np.int64)
            np.put_along_axis(dense, cols, True, axis=-1)
        if has_full and full is None:
            full = dense.copy()
        dense = dense[..., :kv_blocks]
        full = None if full is None else full[..., :kv_blocks]
        lengths = getattr(flex_mask, "seq_lengths", None)
        if lengths is not None:  # FlexAttention may pad the block grid
            q_blocks = -(-int(lengths[0]) // block)
            kv_blocks = -(-int(lengths[1]) // block)
            dense = dense[:, :, :q_blocks, :kv_blocks]
            if full is not None:
                full = full[:, :, :q_blocks, :kv_blocks]
        return cls.from_dense(dense, block, full=full)

    # -- inspection -------------------------------------------------------

    @property
    def batch(self):
        return self.counts.shape[0]

    @property
    def heads(self):
        return self.counts.shape[1]

    @property
    def q_blocks(self):
        return self.counts.shape[2]

    @property
    def kv_blocks(self):
        return self.indices.shape[3]

    @property
    def shape(self):
        """(batch, heads, q_blocks, kv_blocks)."""
        return (self.batch, self.heads, self.q_blocks, self.kv_blocks)

    def density(self):
        """Fraction of blocks attended to."""
        return float(self.counts.sum()) / max(1, self.counts.size * self.kv_blocks)

    def to_dense(self, full_only=False):
        """The boolean block matrix [B, H, Qb, KVb] of the listed blocks (of
        those marked full with full_only=True)."""
        dense = np.zeros(self.shape[:3] + (self.kv_blocks + 1,), dtype=bool)
        listed = np.arange(self.kv_blocks)[None, None, None, :] < self.counts[..., None]
        if full_only:
            listed &= self.indices < 0
        blocks = np.where(self.indices < 0, ~self.indices, self.indices)
        cols = np.where(listed, blocks, self.kv_blocks).astype(np.int64)
        np.put_along_axis(dense, cols, True, axis=-1)
        return dense[..., :self.kv_blocks]

    def __repr__(self):
        return (f"flashjit.BlockMask(shape={self.shape}, "
                f"block_size={self.block_size}, density={self.density():.3f})")

    # -- the C API's flashjit_layout --------------------------------------

    def _layout(self, counts_ptr, indices_ptr):
        return _lib.make_layout(counts_ptr, indices_ptr, self.shape)

    def _host_layout(self):
        """(flashjit_layout on host memory, objects to keep alive)."""
        return (self._layout(self.counts.ctypes.data_as(ctypes.c_void_p),
                             self.indices.ctypes.data_as(ctypes.c_void_p)),
                (self.counts, self.indices))

    def _device_tensors(self, device):
        """(counts, indices) as int32 torch tensors on a torch device (the
        custom ops' block_counts / block_indices): copied once per device
        and kept in the mask; on the CPU they share the mask's memory."""
        key = str(device)
        cached = self._device_cache.get(key)
        if cached is None:
            import torch

            counts = torch.from_numpy(self.counts).to(device)
            indices = torch.from_numpy(self.indices).to(device)
            cached = (counts, indices)
            self._device_cache[key] = cached
            _owners[(str(counts.device), counts.data_ptr(),
                     indices.data_ptr())] = self
        return cached

    def _device_layout(self, device):
        """(flashjit_layout on a torch CUDA device, tensors to keep alive).
        The copies are made once per device and kept in the mask."""
        cached = self._device_tensors(device)
        counts, indices = cached
        return (self._layout(counts.data_ptr(), indices.data_ptr()), cached)

    def _kv_arrays(self):
        """kv_major of the mask (numpy int32 counts and indices), made once
        from the mask's arrays (checked again: they may have been changed
        since the mask was made, before its first use) and kept."""
        cached = self._device_cache.get(("kv", "host"))
        if cached is None:
            try:
                _check_entries(self.counts, self.indices, self.kv_blocks)
            except ValueError as e:
                raise _lib.InvalidArgumentError(
                    f"flashjit.attention_backward: {e}",
                    _lib.ERROR_INVALID_ARGUMENT) from None
            cached = kv_major(self.counts, self.indices)
            self._device_cache[("kv", "host")] = cached
        return cached

    def _kv_device_layout(self, device):
        """(flashjit_layout of the KV-major transpose on a torch device,
        tensors to keep alive), for flashjit_backward_kv_major: _kv_arrays
        copied once per device and kept in the mask, so the backward reads
        nothing on the host."""
        key = ("kv", str(device))
        cached = self._device_cache.get(key)
        if cached is None:
            import torch

            cached = tuple(torch.from_numpy(a).to(device)
                           for a in self._kv_arrays())
            self._device_cache[key] = cached
        counts, indices = cached
        return (_lib.make_layout(counts.data_ptr(), indices.data_ptr(),
                                 (*counts.shape, indices.shape[3])), cached)

    def _kv_host_layout(self):
        """(flashjit_layout of the KV-major transpose in host memory,
        arrays to keep alive), for the CPU handle, which checks it."""
        counts, indices = kv = self._kv_arrays()
        return (_lib.make_layout(counts.ctypes.data, indices.ctypes.data,
                                 (*counts.shape, indices.shape[3])), kv)
