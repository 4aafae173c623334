"""flashjit.compile() and the Kernel it returns: a kernel description
whose stages (attn, tile, gpu, llvm, ptx, cpu-llvm text) are compiled on
demand, and the tiling flashjit chooses for a problem. The package
re-exports both (flashjit.compile, flashjit.Kernel).
"""

import ctypes

from . import _lib
from ._arguments import _score_mod
from ._lib import CudaError, NoDriverError


_DTYPE_NAMES = {"bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16,
                "fp16": _lib.DTYPE_FP16, "float16": _lib.DTYPE_FP16}


class Kernel:
    """A kernel description; its stages are compiled on demand.

    .ptx          PTX for .arch (None: the current GPU's, else sm_90a)
    .emit(stage)  "attn", "tile" (or "tiled"), "gpu", "llvm", "ptx" or "cpu-llvm" text
    .config(...)  the tiling flashjit chooses for a problem
    """

    def __init__(self, spec, arch):
        self._spec = spec
        self.arch = arch

    @property
    def spec(self):
        s = self._spec
        return {"head_dim_qk": s.head_dim_qk, "head_dim_v": s.head_dim_v,
                "dtype": "bf16" if s.dtype == _lib.DTYPE_BF16 else "fp16",
                "mask": ("none", "causal", "sliding_window")[s.mask],
                "gqa": s.gqa,
                "sparse_block": s.sparse_block if s.block_sparse else None,
                "backward": bool(s.direction),
                "deterministic": bool(s.deterministic),
                "score_mod": s.score_mod.decode() if s.score_mod else None}

    def _handle(self):
        if self.arch is None:  # the current GPU's arch, if there is one
            try:
                return _lib.handle(_lib.DEVICE_CUDA)
            except (NoDriverError, CudaError):
                pass
        return _lib.handle(_lib.DEVICE_CPU)

    def emit(self, stage):
        lib = _lib.lib()
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        arch = self.arch.encode() if self.arch else None
        _lib.check(lib.flashjit_emit(self._handle(), ctypes.byref(self._spec),
                                     stage.encode(), arch, ctypes.byref(out),
                                     ctypes.byref(n)))
        try:
            return ctypes.string_at(out, n.value).decode("utf-8", "replace")
        finally:
            lib.flashjit_free(out)

    @property
    def ptx(self):
        return self.emit("ptx")

    def config(self, batch=1, heads=None, seq_len=128, seq_len_kv=None,
               device="cpu"):
        """{"block_m", "block_n", "warps", "stages"} for a problem."""
        heads = self._spec.gqa if heads is None else heads
        seq_len_kv = seq_len if seq_len_kv is None else seq_len_kv
        sizes = [_lib.int64(n, x) for n, x in (
            ("batch", batch), ("heads", heads), ("seq_len", seq_len),
            ("seq_len_kv", seq_len_kv))]
        out = (ctypes.c_int64 * 4)()
        h = _lib.handle(_lib.DEVICE_CUDA if device == "cuda" else _lib.DEVICE_CPU)
        _lib.check(_lib.lib().flashjit_chosen_config(
            h, ctypes.byref(self._spec), *sizes, out))
        return dict(zip(("block_m", "block_n", "warps", "stages"), list(out)))

    def __repr__(self):
        return f"flashjit.Kernel({self.spec}, arch={self.arch!r})"


def compile(head_dim, head_dim_v=None, dtype="bf16", causal=False,
            sliding_window=False, gqa=1, sparse_block=None, arch=None,
            backward=False, deterministic=False, score_mod=None,
            mask_mod=None, varlen=False):
    """Describes a kernel; read its .ptx or .emit(stage). Validation
    (head dims 1..512, ...) happens here: InvalidArgumentError names the
    field. sparse_block: an int for a block-sparse kernel. arch: "sm_80",
    "sm_90a", ... (None: the current GPU's, else sm_90a). backward: the
    backward's kernels (preprocess, dK/dV, dQ) and tiling instead;
    deterministic (with backward=True): dQ by a separate pass instead of
    atomic adds. score_mod: a score modifier, as attention's (a function,
    traced, or a name; its region is in .emit("attn")); mask_mod: a mask
    function, as attention's. varlen: the variable-length kernel that
    attention_varlen runs (its tiled functions read the sequences'
    offsets); not with sparse_block."""
    if deterministic and not backward:
        raise ValueError("flashjit.compile: deterministic needs backward=True "
                         "(it chooses how the backward sums dQ)")
    if isinstance(dtype, str):
        if dtype not in _DTYPE_NAMES:
            raise TypeError(f"flashjit.compile: dtype must be bf16 or fp16, "
                            f"got {dtype!r}")
        dt = _DTYPE_NAMES[dtype]
    else:  # a torch or numpy dtype
        name = str(dtype).replace("torch.", "")
        if name not in _DTYPE_NAMES:
            raise TypeError(f"flashjit.compile: dtype must be bf16 or fp16, "
                            f"got {dtype!r}")
        dt = _DTYPE_NAMES[name]
    if causal and sliding_window:
        raise ValueError("flashjit.compile: causal and sliding_window are "
                         "exclusive")
    mask = (_lib.MASK_CAUSAL if causal else
            _lib.MASK_SLIDING_WINDOW if sliding_window else _lib.MASK_NONE)
    text = _score_mod(score_mod, mask_mod)
    spec = _lib.make_spec(head_dim, head_dim if head_dim_v is None else head_dim_v,
                          dt, mask, gqa, sparse_block or 0, backward=backward,
                          deterministic=deterministic,
                          score_mod=text, varlen=varlen)
    # Validate now: chosen_config checks the spec on the CPU handle (with
    # alibi:H's H heads, the only count it allows).
    heads = max(1, spec.gqa)
    name, _, arg = text.partition(":")
    if name == "alibi" and arg.isdigit() and int(arg) % heads == 0:
        heads = int(arg)
    out = (ctypes.c_int64 * 4)()
    _lib.check(_lib.lib().flashjit_chosen_config(
        _lib.handle(_lib.DEVICE_CPU), ctypes.byref(spec), 1, heads, 1, 1,
        out))
    return Kernel(spec, arch)
