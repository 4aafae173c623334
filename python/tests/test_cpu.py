"""flashjit's Python binding on the CPU path (numpy only; runs in CI).

Every case compares with a float64 numpy reference on the inputs as the
kernel sees them (float16, or float32 rounded to bf16).
"""

import ctypes
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import flashjit
from flashjit import _lib
import reference
import score_mods
from reference import attention_ref, lse_err, rel_err, visible_mask

BOUND = {np.float16: 5e-3, np.float32: 1e-2}  # fp16, bf16


def kernel_view(x):
    """The values the kernel computes with."""
    if x.dtype == np.float16:
        return x.astype(np.float64)
    return flashjit._bf16_bits_to_f32(flashjit._f32_to_bf16_bits(x)).astype(
        np.float64)


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def check(q, k, v, causal=False, scale=None, window=None, block_mask=None):
    o, lse = flashjit.attention(q, k, v, causal=causal, scale=scale,
                                window=window, block_mask=block_mask,
                                return_lse=True)
    assert o.dtype == q.dtype
    assert o.shape == q.shape[:3] + (v.shape[3],)
    assert lse.dtype == np.float32 and lse.shape == q.shape[:3]
    bm = block_mask
    if bm is not None and not isinstance(bm, flashjit.BlockMask):
        bm = flashjit.BlockMask.from_flex(bm)
    vis = visible_mask(q.shape[2], k.shape[2], causal, window,
                       bm.to_dense() if bm else None,
                       bm.block_size if bm else None)
    ro, rl = attention_ref(kernel_view(q), kernel_view(k), kernel_view(v),
                           scale, vis)
    bound = BOUND[q.dtype.type]
    assert not np.isnan(o).any()
    assert rel_err(o, ro) <= bound, rel_err(o, ro)
    assert lse_err(lse, rl) <= bound, lse_err(lse, rl)
    return o, lse


# -- the library --------------------------------------------------------------


def test_library_and_version():
    assert flashjit.version() == flashjit.__version__
    assert os.path.isfile(flashjit.library_path())


def run_python(code, **env):
    e = dict(os.environ)
    e.update(env)
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(flashjit.__file__))
    return subprocess.run([sys.executable, "-c", code], env=e,
                          capture_output=True, text=True, timeout=120)


def test_import_does_not_import_torch():
    r = run_python("import sys, flashjit; flashjit.version(); "
                   "print('torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_library_from_environment():
    r = run_python("import flashjit; print(flashjit.library_path())",
                   FLASHJIT_LIBRARY=flashjit.library_path())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == flashjit.library_path()
    r = run_python("import flashjit\n"
                   "try:\n    flashjit.version()\n"
                   "except flashjit.LibraryNotFoundError as e:\n    print(e)\n",
                   FLASHJIT_LIBRARY="/nonexistent/libflashjit.so")
    assert r.returncode == 0, r.stderr
    assert "/nonexistent/libflashjit.so" in r.stdout


# -- numbers ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("shape", [
    # B, H, Hkv, Nq, Nkv, d, dv
    (1, 1, 1, 1, 1, 16, 16),
    (2, 3, 3, 65, 65, 64, 64),
    (1, 4, 2, 77, 130, 40, 24),   # GQA, Nq < Nkv, dqk != dv
    (2, 2, 1, 130, 33, 7, 33),    # Nq > Nkv, odd head dims
])
@pytest.mark.parametrize("causal", [False, True])
def test_forward(dtype, shape, causal):
    B, H, Hkv, Nq, Nkv, d, dv = shape
    rng = np.random.default_rng(hash((shape, causal)) & 0xffff)
    q = randn(rng, (B, H, Nq, d), dtype)
    k = randn(rng, (B, Hkv, Nkv, d), dtype)
    v = randn(rng, (B, Hkv, Nkv, dv), dtype)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("shape", [
    # B, H, Hkv, Nq, Nkv, d: decode and short queries take the split-KV
    # forward with GQA packing (decodeGpuConfig: Nq * gqa <= 64, Nkv >= 1024)
    (2, 8, 2, 1, 1500, 64),
    (1, 6, 2, 5, 1100, 40),
    (1, 2, 2, 1, 2000, 32),
])
@pytest.mark.parametrize("causal", [False, True])
def test_decode_split_kv(shape, causal):
    B, H, Hkv, Nq, Nkv, d = shape
    rng = np.random.default_rng()
    q = randn(rng, (B, H, Nq, d), np.float16)
    k = randn(rng, (B, Hkv, Nkv, d), np.float16)
    v = randn(rng, (B, Hkv, Nkv, d), np.float16)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("window", [(9, 3), (0, 0), (None, 5), (4, None)])
def test_window(window):
    rng = np.random.default_rng(3)
    q = randn(rng, (1, 2, 50, 32), np.float16)
    k = randn(rng, (1, 2, 70, 32), np.float16)
    v = randn(rng, (1, 2, 70, 32), np.float16)
    check(q, k, v, window=window)


def test_scale_and_lse():
    rng = np.random.default_rng(4)
    q = randn(rng, (1, 1, 20, 16), np.float32)
    o, lse = check(q, q, q, scale=0.05)
    o2 = flashjit.attention(q, q, q)  # default scale differs
    assert not np.allclose(o, o2)
    assert o.dtype == np.float32


def test_strided_inputs_from_packed_qkv():
    """q, k, v as views of one (B, N, 3, H, d) buffer: outer strides
    (N*3*H*d, d, 3*H*d, 1)."""
    rng = np.random.default_rng(5)
    B, N, H, d = 2, 45, 3, 32
    qkv = randn(rng, (B, N, 3, H, d), np.float16)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    assert q.strides == (N * 3 * H * d * 2, d * 2, 3 * H * d * 2, 2)
    o, _ = check(q, k, v, causal=True)
    o2 = flashjit.attention(np.ascontiguousarray(q), np.ascontiguousarray(k),
                            np.ascontiguousarray(v), causal=True)
    np.testing.assert_array_equal(o, o2)


def test_broadcast_stride_zero():
    rng = np.random.default_rng(6)
    k = randn(rng, (1, 1, 30, 16), np.float16)
    v = randn(rng, (1, 1, 30, 16), np.float16)
    q = np.broadcast_to(randn(rng, (1, 1, 10, 16), np.float16), (2, 1, 10, 16))
    kb, vb = (np.broadcast_to(x, (2, 1, 30, 16)) for x in (k, v))
    check(q, kb, vb)


# -- block masks --------------------------------------------------------------


def test_block_mask_dense_broadcast():
    rng = np.random.default_rng(7)
    q = randn(rng, (2, 2, 100, 32), np.float16)
    k = randn(rng, (2, 2, 70, 32), np.float16)
    v = randn(rng, (2, 2, 70, 32), np.float16)
    dense = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]], bool)
    bm = flashjit.BlockMask.from_dense(dense, block_size=32)
    assert bm.shape == (1, 1, 4, 3)
    np.testing.assert_array_equal(bm.to_dense()[0, 0], dense)
    o, lse = check(q, k, v, block_mask=bm)
    # Query block 1 sees nothing: O = 0, lse = -inf.
    assert np.all(o[:, :, 32:64] == 0)
    assert np.all(np.isneginf(lse[:, :, 32:64]))


def test_block_mask_per_batch_and_head():
    rng = np.random.default_rng(8)
    q = randn(rng, (2, 3, 64, 16), np.float32)
    dense = rng.random((2, 3, 4, 4)) < 0.5
    bm = flashjit.BlockMask.from_dense(dense, block_size=16)
    check(q, q, q, causal=True, block_mask=bm)


def test_block_mask_from_flex():
    """A stand-in for FlexAttention's BlockMask (same attributes)."""
    rng = np.random.default_rng(9)
    B, H, Qb, KVb, blk = 1, 2, 3, 4, 16
    dense = rng.random((B, H, Qb, KVb)) < 0.5
    full = dense & (rng.random(dense.shape) < 0.5)
    partial = dense & ~full

    def bcsr(m):
        n = m.sum(-1).astype(np.int32)
        idx = np.argsort(~m, axis=-1, kind="stable").astype(np.int32)
        return n, idx

    kv_n, kv_i = bcsr(partial)
    f_n, f_i = bcsr(full)
    flex = types.SimpleNamespace(BLOCK_SIZE=(blk, blk), kv_num_blocks=kv_n,
                                 kv_indices=kv_i, full_kv_num_blocks=f_n,
                                 full_kv_indices=f_i,
                                 seq_lengths=(Qb * blk - 5, KVb * blk))
    bm = flashjit.BlockMask.from_flex(flex)
    np.testing.assert_array_equal(bm.to_dense(), dense)
    assert flashjit.BlockMask.from_flex(
        flex, include_partial=False).to_dense().sum() == full.sum()
    q = randn(rng, (B, H, Qb * blk - 5, 32), np.float16)
    k = randn(rng, (B, H, KVb * blk, 32), np.float16)
    check(q, k, k, block_mask=flex)  # passed directly: converted
    with pytest.raises(ValueError, match="square"):
        flashjit.BlockMask.from_flex(types.SimpleNamespace(
            BLOCK_SIZE=(128, 64), kv_num_blocks=kv_n, kv_indices=kv_i))


def test_block_mask_errors():
    rng = np.random.default_rng(10)
    q = randn(rng, (1, 1, 64, 16), np.float16)
    bm = flashjit.BlockMask.from_dense(np.ones((3, 2), bool), block_size=32)
    with pytest.raises(ValueError, match="blocks"):
        flashjit.attention(q, q, q, block_mask=bm)  # 64 rows need 2 Q blocks
    with pytest.raises(TypeError):
        flashjit.attention(q, q, q, block_mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="out of range"):
        flashjit.BlockMask(np.array([[[1]]]), np.array([[[[5]]]]), 16)


# -- errors -------------------------------------------------------------------


def arrays(dtype=np.float16, shape=(1, 2, 8, 16)):
    rng = np.random.default_rng(11)
    return [randn(rng, shape, dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint16])
def test_wrong_dtype(dtype):
    q, k, v = arrays(dtype)
    with pytest.raises(TypeError, match="float16 or float32"):
        flashjit.attention(q, k, v)


def test_mixed_dtypes_and_kinds():
    q, k, v = arrays()
    with pytest.raises(TypeError, match="dtypes differ"):
        flashjit.attention(q, k.astype(np.float32), v)
    with pytest.raises(TypeError, match="list"):
        flashjit.attention(q, k.tolist(), v)


def test_mismatched_shapes():
    q, k, v = arrays()
    with pytest.raises(ValueError, match="4-D"):
        flashjit.attention(q[0], k, v)
    with pytest.raises(ValueError, match="head dims differ"):
        flashjit.attention(q[..., :8], k, v)
    with pytest.raises(ValueError, match="k and v"):
        flashjit.attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match="batch"):
        flashjit.attention(q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(ValueError, match="multiple"):  # 2 q heads, 3 kv heads
        kk = np.concatenate([k, k[:, :1]], axis=1)
        flashjit.attention(q, kk, kk)


def test_innermost_stride():
    q, k, v = arrays(shape=(1, 2, 8, 32))
    with pytest.raises(ValueError, match="innermost"):
        flashjit.attention(q[..., ::2], k[..., ::2], v[..., ::2])


def test_bad_head_dim_names_the_field():
    q, k, v = arrays(shape=(1, 1, 4, 513))
    with pytest.raises(flashjit.InvalidArgumentError, match="head_dim_qk"):
        flashjit.attention(q, k, v)
    with pytest.raises(ValueError, match="head_dim"):  # also a ValueError
        flashjit.attention(*arrays(shape=(1, 1, 4, 0)))


def test_bad_options():
    q, k, v = arrays()
    with pytest.raises(ValueError, match="exclusive"):
        flashjit.attention(q, k, v, causal=True, window=(3, 0))
    with pytest.raises(ValueError, match="window"):
        flashjit.attention(q, k, v, window=(-2, 0))
    with pytest.raises(ValueError, match="window"):
        flashjit.attention(q, k, v, window=5)
    with pytest.raises(ValueError, match="scale"):
        flashjit.attention(q, k, v, scale=-1.0)


def test_zero_length_sequence_is_rejected():
    q, k, v = arrays()
    with pytest.raises(flashjit.InvalidArgumentError, match="seq_len"):
        flashjit.attention(q[:, :, :0], k, v)


# -- compile, config, cache, backward ------------------------------------------


def test_compile_ptx_and_stages():
    kern = flashjit.compile(96, causal=True, arch="sm_80")
    ptx = kern.ptx
    assert ".target sm_80" in ptx and ".entry attention" in ptx
    assert "attn.flash_fwd" in kern.emit("attn")
    assert "scf.for" in kern.emit("tiled")
    assert ".target sm_90a" in flashjit.compile(64, dtype="fp16",
                                                sparse_block=128).ptx
    assert kern.spec["mask"] == "causal"
    cfg = kern.config(batch=2, heads=8, seq_len=1000)
    assert set(cfg) == {"block_m", "block_n", "warps", "stages"}
    assert all(x >= 1 for x in cfg.values())
    with pytest.raises(flashjit.InvalidArgumentError, match="head_dim_qk"):
        flashjit.compile(0)
    with pytest.raises(flashjit.InvalidArgumentError, match="bogus"):
        kern.emit("bogus")
    # The backward's three kernels and its own tiling; dQ by atomic adds
    # (the default: @attention_dq converts the accumulator) or, with
    # deterministic=True, by a separate pass.
    atomic = flashjit.compile(96, causal=True, arch="sm_80", backward=True)
    assert not atomic.spec["deterministic"]
    assert 'role = "dq_convert"' in atomic.emit("tiled")
    assert "red.global.add.f32" in atomic.ptx
    assert "deterministic" not in atomic.emit("attn")
    bwd = flashjit.compile(96, causal=True, arch="sm_80", backward=True,
                           deterministic=True)
    assert bwd.spec["backward"] and not kern.spec["backward"]
    assert bwd.spec["deterministic"]
    bptx = bwd.ptx
    for entry in ("attention_preprocess(", "attention(", "attention_dq("):
        assert ".entry " + entry in bptx
    assert "deterministic = true" in bwd.emit("attn")
    with pytest.raises(ValueError, match="deterministic needs backward"):
        flashjit.compile(96, deterministic=True)
    assert bwd.config(batch=2, heads=8, seq_len=1000) == {
        "block_m": 64, "block_n": 64, "warps": 4, "stages": 2}


def test_kernels_are_cached():
    lib = _lib.lib()
    h = _lib.handle(_lib.DEVICE_CPU)
    q, k, v = arrays(shape=(1, 1, 9, 24))
    flashjit.attention(q, k, v)
    n = lib.flashjit_cached_kernels(h)
    flashjit.attention(*arrays(shape=(3, 2, 50, 24)))  # same spec
    assert lib.flashjit_cached_kernels(h) == n
    flashjit.attention(q, k, v, causal=True)  # another spec
    assert lib.flashjit_cached_kernels(h) == n + 1


def test_backward_rejects_missing_tensors():
    lib = _lib.lib()
    spec = _lib.make_spec(16, 16, _lib.DTYPE_FP16, _lib.MASK_NONE, 1, 0)
    status = lib.flashjit_backward(_lib.handle(_lib.DEVICE_CPU),
                                   ctypes.byref(spec), None, None, None, None,
                                   None, None, None, None, None, 0.0, -1, -1,
                                   None, None, 0, None)
    with pytest.raises(ValueError, match="q is NULL"):
        _lib.check(status)


def test_backward_workspace_size():
    lib = _lib.lib()
    h = _lib.handle(_lib.DEVICE_CPU)
    n = ctypes.c_size_t()

    def size(sparse_block, *shape, deterministic=True):
        spec = _lib.make_spec(16, 16, _lib.DTYPE_FP16, _lib.MASK_NONE, 1,
                              sparse_block, deterministic=deterministic)
        _lib.check(lib.flashjit_backward_workspace_size(
            h, ctypes.byref(spec), *shape, ctypes.byref(n)))
        return n.value

    # delta and -lse * log2(e), fp32 [2, B, H, Nq]
    assert size(0, 2, 3, 100, 50) == 2 * 2 * 3 * 100 * 4
    # Atomic dQ (the default): and dq_accum, fp32 [B, H, Nq, 16].
    assert size(0, 2, 3, 100, 50, deterministic=False) == (
        2 * 2 * 3 * 100 * 4 + 2 * 3 * 100 * 16 * 4)
    # Block-sparse by 64: 2 x 1 blocks; the layout's KV-major transpose
    # (counts [B, H, 1] at 4864, indices [B, H, 1, 2] at 5120) follows.
    assert size(64, 2, 3, 100, 50) == 5120 + 2 * 3 * 1 * 2 * 4
    with pytest.raises(flashjit.InvalidArgumentError, match="seq_len"):
        size(0, 2, 3, 0, 50)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype,causal,window,gqa", [
    (np.float16, False, None, 1),
    (np.float32, True, None, 2),
    (np.float16, False, (7, 3), 1),
])
def test_backward_matches_float64_gradients(dtype, causal, window, gqa,
                                            deterministic):
    rng = np.random.default_rng()
    B, H, Nq, Nkv, D, Dv = 2, 4, 37, 53, 24, 16
    q = rng.standard_normal((B, H, Nq, D)).astype(dtype)
    k = rng.standard_normal((B, H // gqa, Nkv, D)).astype(dtype)
    v = rng.standard_normal((B, H // gqa, Nkv, Dv)).astype(dtype)
    o, lse = flashjit.attention(q, k, v, causal=causal, window=window,
                                return_lse=True)
    d_o = rng.standard_normal(o.shape).astype(dtype)
    if dtype == np.float32:  # what the kernel sees: bf16-rounded values
        q, k, v, o, d_o = (flashjit._bf16_bits_to_f32(flashjit._f32_to_bf16_bits(a))
                           for a in (q, k, v, o, d_o))
    dq, dk, dv = flashjit.attention_backward(q, k, v, o, d_o, lse,
                                             causal=causal, window=window,
                                             deterministic=deterministic)
    vis = reference.visible_mask(Nq, Nkv, causal=causal, window=window)
    ref = reference.attention_grads_ref(q, k, v, o, d_o, visible=vis)
    bound = 5e-3 if dtype == np.float16 else 1e-2
    for got, want in zip((dq, dk, dv), ref):
        assert got.shape == want.shape
        assert np.isfinite(got).all()
        assert reference.rel_err(got, want) < bound


@pytest.mark.parametrize("score_mod,causal,gqa", [
    ("softcap:2", False, 1),
    ("softcap:0.75", True, 2),
    ("alibi:4", True, 2),
    ("alibi:4", False, 1),
])
def test_score_mod_forward_and_gradients(score_mod, causal, gqa):
    """Named score modifiers: o, lse and the gradients against the float64
    reference with the modifier; the plain reference fails them."""
    score_mods.check_forward_and_gradients(score_mod, causal, gqa)


def test_compile_shows_the_score_mod_region():
    k = flashjit.compile(64, score_mod="softcap:30", causal=True)
    assert k.spec["score_mod"] == "softcap:30"
    attn = k.emit("attn")
    assert "score_mod" in attn and "math.tanh" in attn
    assert "3.000000e+01" in attn
    a = flashjit.compile(32, gqa=2, score_mod="alibi:8", backward=True)
    assert "attn.flash_bwd" in a.emit("attn")
    assert "math.exp2" in a.emit("attn")
    assert flashjit.compile(64).spec["score_mod"] is None
    with pytest.raises(ValueError, match="score"):
        flashjit.compile(64, score_mod="softcap:0")


def test_score_mod_errors():
    q, k, v = arrays(np.float16, (1, 2, 16, 16))
    for bad in ("softcap:-1", "custom", "relpos:2", "alibi:3"):
        with pytest.raises(ValueError, match="score"):
            flashjit.attention(q, k, v, score_mod=bad)
    with pytest.raises(TypeError, match="score_mod"):
        flashjit.attention(q, k, v, score_mod=20)


def test_deterministic_backward_is_bit_identical():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, 150, 32)).astype(np.float16)
               for _ in range(3))
    o, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
    d_o = rng.standard_normal(o.shape).astype(np.float16)
    first, second = (flashjit.attention_backward(q, k, v, o, d_o, lse,
                                                 causal=True,
                                                 deterministic=True)
                     for _ in range(2))
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_bf16_rounding():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf, np.nan],
                 np.float32)
    bits = flashjit._f32_to_bf16_bits(x)
    back = flashjit._bf16_bits_to_f32(bits)
    # Ties go to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6.
    np.testing.assert_array_equal(back[:5], [1.0, 1.0, 1 + 2**-6, -2.5, np.inf])
    assert np.isnan(back[5])


def readme_blocks():
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_numpy_example_runs():
    blocks = [b for b in readme_blocks() if "import numpy" in b]
    assert blocks
    for b in blocks:
        exec(compile(b, "README.md", "exec"), {})
