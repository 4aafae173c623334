//===- CApiConvert.cpp - The C API's description, converted and checked ---===//
//
/// \file
/// The C description (flashjit_spec, flashjit_tensor, flashjit_layout) as
/// the C++ one (AttentionSpec, Problem, BlockSparseLayout), with a named
/// error for every bad field; the tiling choice; the backward's workspace
/// layout. No device is touched here.
//
//===----------------------------------------------------------------------===//

#include "CApiInternal.h"
#include "kernels/GpuDefaults.h"

#include <algorithm>
#include <cstring>

namespace flashjit::capi {

flashjit_status fail(const char *fn, flashjit_status s,
                     const std::string &what) {
  try {
    lastError = fmt::format("{}: {}", fn, what);
  } catch (...) {
    lastError.clear();
  }
  return s;
}

[[noreturn]] void invalid(const std::string &message) {
  throw SpecError(message);
}

void requireHandle(const flashjit_handle *h) {
  if (!h)
    invalid("handle is NULL");
}

//===----------------------------------------------------------------------===//
// The tiling choice
//===----------------------------------------------------------------------===//

/// THE config choice of the C API (and so of the Python binding): the
/// default GPU tiling for the head dims and the device (the warpgroup
/// tilings on sm_90a), as the CLI's run and bench use (the backward's for
/// a Direction::Backward spec). \p gpu is the device the kernel runs on,
/// nullptr for the CPU execution mode. Decode and short queries take the
/// split-KV tiling (decodeGpuConfig) on both. The autotuner replaces this
/// function.
TileConfig chooseConfig(const AttentionSpec &spec, const Problem &problem,
                        const rt::DeviceInfo *gpu) {
  if (spec.direction == Direction::Backward)
    return defaultGpuBackwardConfig(spec);
  if (std::optional<TileConfig> decode = decodeGpuConfig(spec, problem))
    return *decode;
  GpuTarget target;
  if (gpu)
    target.arch = gpu->targetArch();
  TileConfig c = defaultGpuConfig(spec, gpu && usesWgmma(target),
                                  gpu && usesKvRing(target));
  c.warps = std::min(c.warps, std::max<int64_t>(1, c.blockM / 16));
  return c;
}

//===----------------------------------------------------------------------===//
// Converting the C description
//===----------------------------------------------------------------------===//

AttentionSpec toSpec(const flashjit_spec *s) {
  if (!s)
    invalid("spec is NULL");
  AttentionSpec spec;
  spec.headDimQK = s->head_dim_qk;
  spec.headDimV = s->head_dim_v;
  if (s->dtype != FLASHJIT_DTYPE_BF16 && s->dtype != FLASHJIT_DTYPE_FP16)
    invalid(fmt::format("spec.dtype must be FLASHJIT_DTYPE_BF16 (0) or "
                        "FLASHJIT_DTYPE_FP16 (1), got {}",
                        s->dtype));
  spec.dtype = s->dtype == FLASHJIT_DTYPE_BF16 ? DType::BF16 : DType::FP16;
  switch (s->mask) {
  case FLASHJIT_MASK_NONE:
    spec.mask = MaskKind::None;
    break;
  case FLASHJIT_MASK_CAUSAL:
    spec.mask = MaskKind::Causal;
    break;
  case FLASHJIT_MASK_SLIDING_WINDOW:
    spec.mask = MaskKind::SlidingWindow;
    break;
  default:
    invalid(fmt::format("spec.mask must be 0 (none), 1 (causal) or 2 "
                        "(sliding window), got {}",
                        s->mask));
  }
  spec.gqaGroup = s->gqa;
  spec.blockSparse = s->block_sparse != 0;
  spec.sparseBlock = s->sparse_block;
  if (s->direction != FLASHJIT_DIRECTION_FORWARD &&
      s->direction != FLASHJIT_DIRECTION_BACKWARD)
    invalid(fmt::format("spec.direction must be FLASHJIT_DIRECTION_FORWARD "
                        "(0) or FLASHJIT_DIRECTION_BACKWARD (1), got {}",
                        s->direction));
  spec.direction = s->direction == FLASHJIT_DIRECTION_BACKWARD
                       ? Direction::Backward
                       : Direction::Forward;
  if (s->deterministic != 0 && s->deterministic != 1)
    invalid(fmt::format("spec.deterministic must be 0 (atomic dQ) or 1 (dQ "
                        "by a separate pass), got {}",
                        s->deterministic));
  spec.deterministic = s->deterministic == 1;
  if (s->varlen != 0 && s->varlen != 1)
    invalid(fmt::format("spec.varlen must be 0 (B, H, N, d tensors) or 1 "
                        "(variable-length packing), got {}",
                        s->varlen));
  spec.varlen = s->varlen == 1;
  if (s->score_mod && *s->score_mod) {
    // A name (at most 255 characters) or a region's text (at most 64 KiB).
    constexpr size_t kLimit = size_t(1) << 16;
    const size_t n = strnlen(s->score_mod, kLimit + 1);
    const std::string text(s->score_mod, n);
    const size_t first = text.find_first_not_of(" \t\r\n");
    const bool region = first != std::string::npos && text[first] == '{';
    if (n > (region ? kLimit : 255))
      invalid(region ? "spec.score_mod: the region text is longer than 65536 "
                       "characters (or not terminated)"
                     : "spec.score_mod is longer than 255 characters (or not "
                       "terminated)");
    try {
      // The canonical name: "softcap:20.0" and "softcap:20" are one kernel;
      // a region that is a named variant is that variant.
      if (region)
        spec = withScoreModRegion(spec, text);
      else
        spec.scoreMod = ScoreMod::parse(text).name();
    } catch (const SpecError &e) {
      invalid(fmt::format("spec.score_mod: {}", e.what()));
    }
  }
  if (s->mask_mod && *s->mask_mod) {
    constexpr size_t kLimit = size_t(1) << 16;
    const size_t n = strnlen(s->mask_mod, kLimit + 1);
    if (n > kLimit)
      invalid("spec.mask_mod: the region text is longer than 65536 "
              "characters (or not terminated)");
    try {
      spec = withMaskModRegion(spec, std::string(s->mask_mod, n));
    } catch (const SpecError &e) {
      invalid(fmt::format("spec.mask_mod: {}", e.what()));
    }
  }
  try {
    spec.validate();
  } catch (const SpecError &e) {
    invalid(std::string("spec.") + e.what());
  }
  return spec;
}

static const char *shapeName(int i) {
  static const char *names[] = {"batch", "heads", "seq_len", "head_dim"};
  return names[i];
}

void checkTensor(const flashjit_tensor *t, const char *what) {
  if (!t)
    invalid(fmt::format("{} is NULL", what));
  if (!t->data)
    invalid(fmt::format("{}.data is NULL", what));
  for (int i = 0; i < 4; ++i) {
    if (t->shape[i] < 1)
      invalid(fmt::format("{}.shape[{}] ({}) must be >= 1, got {}", what, i,
                          shapeName(i), t->shape[i]));
    if (t->strides[i] < 0)
      invalid(fmt::format("{}.strides[{}] must be >= 0, got {}", what, i,
                          t->strides[i]));
  }
  if (t->strides[3] != 1)
    invalid(fmt::format(
        "{}.strides[3]: the innermost (head-dim) stride must be 1, got {}",
        what, t->strides[3]));
  checkTensorReach(what, t->shape, t->strides);
}

static void checkDim(const flashjit_tensor *t, const char *what, int dim,
                     int64_t want, const char *wantWhat) {
  if (t->shape[dim] != want)
    invalid(fmt::format("{}.shape[{}] ({}) is {}, {} is {}", what, dim,
                        shapeName(dim), t->shape[dim], wantWhat, want));
}

/// Checks the four tensors against the spec and each other and returns the
/// problem they describe.
Problem toProblem(const AttentionSpec &spec, const flashjit_tensor *q,
                  const flashjit_tensor *k, const flashjit_tensor *v,
                  const flashjit_tensor *o, double scale, int64_t windowLeft,
                  int64_t windowRight, const flashjit_varlen *varlen) {
  checkTensor(q, "q");
  checkTensor(k, "k");
  checkTensor(v, "v");
  checkTensor(o, "o");
  if (varlen && q->shape[0] != 1)
    invalid(fmt::format("varlen: q holds the sequences packed, shape {{1, H, "
                        "total_q, d}}; got a batch of {}",
                        q->shape[0]));
  checkDim(q, "q", 3, spec.headDimQK, "spec.head_dim_qk");
  checkDim(k, "k", 3, spec.headDimQK, "spec.head_dim_qk");
  checkDim(v, "v", 3, spec.headDimV, "spec.head_dim_v");
  checkDim(o, "o", 3, spec.headDimV, "spec.head_dim_v");
  checkDim(k, "k", 0, q->shape[0], "q's");
  checkDim(v, "v", 0, q->shape[0], "q's");
  checkDim(o, "o", 0, q->shape[0], "q's");
  checkDim(o, "o", 1, q->shape[1], "q's");
  checkDim(o, "o", 2, q->shape[2], "q's");
  checkDim(v, "v", 1, k->shape[1], "k's");
  checkDim(v, "v", 2, k->shape[2], "k's");
  if (q->shape[1] != k->shape[1] * spec.gqaGroup)
    invalid(fmt::format("q has {} heads and k has {}: q's heads must be "
                        "spec.gqa ({}) times k's",
                        q->shape[1], k->shape[1], spec.gqaGroup));
  Problem p;
  p.batch = q->shape[0];
  p.heads = q->shape[1];
  p.seqLenQ = q->shape[2];
  p.seqLenKV = k->shape[2];
  p.scale = scale;
  if (spec.varlen && !varlen)
    invalid("spec.varlen is set: run it with flashjit_forward_varlen or "
            "flashjit_backward_varlen, which take the sequences' offsets");
  if (varlen && !spec.varlen)
    invalid("a flashjit_varlen given for a spec without varlen (set "
            "spec.varlen = 1)");
  if (varlen) {
    if (!varlen->cu_seqlens_q || !varlen->cu_seqlens_kv)
      invalid("varlen: cu_seqlens_q and cu_seqlens_kv must not be NULL");
    p.batch = varlen->batch;
    p.seqLenQ = varlen->max_seqlen_q;
    p.seqLenKV = varlen->max_seqlen_kv;
  }
  if (spec.mask == MaskKind::SlidingWindow) {
    auto side = [](const char *name, int64_t w) {
      if (w == -1)
        return kUnboundedWindow;
      if (w < 0)
        invalid(
            fmt::format("{} must be >= 0 or -1 (unbounded), got {}", name, w));
      return std::min(w, kUnboundedWindow);
    };
    p.windowLeft = side("window_left", windowLeft);
    p.windowRight = side("window_right", windowRight);
  } else if (windowLeft != -1 || windowRight != -1) {
    invalid(fmt::format("window_left/window_right ({}, {}) apply only to "
                        "FLASHJIT_MASK_SLIDING_WINDOW; pass -1, -1",
                        windowLeft, windowRight));
  }
  p.validate(spec);
  checkProblemSize(spec, p); // before any copy or allocation
  return p;
}

/// Checks the captured tensors' count and each one's data and size.
void checkCaptured(const AttentionSpec &spec, const flashjit_captured *captured,
                   int64_t count, const char *capturedCall) {
  if (count != spec.captures)
    invalid(fmt::format("spec.{} {} tensors, the call gives {}{}",
                        spec.maskCaptures == 0 ? "score_mod captures"
                        : spec.maskCaptures == spec.captures
                            ? "mask_mod captures"
                            : "score_mod and spec.mask_mod "
                              "capture",
                        spec.captures, count,
                        spec.captures > 0 && count == 0
                            ? fmt::format(" (give them with {})", capturedCall)
                            : ""));
  if (count > 0 && !captured)
    invalid("captured is NULL, but num_captured is " + std::to_string(count));
  for (int64_t c = 0; c < count; ++c) {
    if (!captured[c].data)
      invalid(fmt::format("captured[{}].data is NULL", c));
    if (captured[c].size < 1 || captured[c].size > kMaxTensorElements)
      invalid(fmt::format("captured[{}].size must be in [1, 2^40], got {}", c,
                          captured[c].size));
  }
}

/// Checks the layout's presence and dimensions (not its contents).
void checkLayoutShape(const AttentionSpec &spec, const Problem &p,
                      const flashjit_layout *layout) {
  if (spec.blockSparse && !layout)
    invalid("layout is NULL, but spec.block_sparse is set");
  if (!spec.blockSparse && layout)
    invalid("a layout is given, but spec.block_sparse is 0");
  if (!layout)
    return;
  if (!layout->counts || !layout->indices)
    invalid("layout.counts and layout.indices must not be NULL");
  if (layout->batch != 1 && layout->batch != p.batch)
    invalid(fmt::format("layout.batch must be 1 or {}, got {}", p.batch,
                        layout->batch));
  if (layout->heads != 1 && layout->heads != p.heads)
    invalid(fmt::format("layout.heads must be 1 or {}, got {}", p.heads,
                        layout->heads));
  int64_t needQ = ceilDiv(p.seqLenQ, spec.sparseBlock);
  int64_t needKV = ceilDiv(p.seqLenKV, spec.sparseBlock);
  if (layout->q_blocks != needQ || layout->kv_blocks != needKV)
    invalid(fmt::format("layout: {}x{} blocks given, the problem needs {}x{} "
                        "(q_blocks x kv_blocks) blocks of {}",
                        layout->q_blocks, layout->kv_blocks, needQ, needKV,
                        spec.sparseBlock));
  int64_t cells = 0;
  if (__builtin_mul_overflow(layout->batch * layout->heads,
                             layout->q_blocks * layout->kv_blocks, &cells) ||
      cells > kMaxTensorElements)
    invalid(fmt::format("layout: indices of batch * heads * q_blocks * "
                        "kv_blocks = {} * {} * {} * {} entries exceed 2^40",
                        layout->batch, layout->heads, layout->q_blocks,
                        layout->kv_blocks));
}

void checkKvLayoutShape(const flashjit_layout *layout,
                        const flashjit_layout *kvLayout) {
  if (!kvLayout)
    return;
  if (!layout)
    invalid("kv_layout is given without a layout (spec.block_sparse is 0 "
            "or layout is NULL)");
  if (!kvLayout->counts || !kvLayout->indices)
    invalid("kv_layout.counts and kv_layout.indices must not be NULL");
  if (kvLayout->batch != layout->batch || kvLayout->heads != layout->heads ||
      kvLayout->q_blocks != layout->kv_blocks ||
      kvLayout->kv_blocks != layout->q_blocks)
    invalid(fmt::format(
        "kv_layout is {} x {} x {} x {} (batch, heads, rows, entries); the "
        "KV-major transpose of layout is {} x {} x {} x {} (a row per KV "
        "block, an entry per Q block)",
        kvLayout->batch, kvLayout->heads, kvLayout->q_blocks,
        kvLayout->kv_blocks, layout->batch, layout->heads, layout->kv_blocks,
        layout->q_blocks));
}

BlockSparseLayout layoutShape(const flashjit_layout &l) {
  BlockSparseLayout b;
  b.batch = l.batch;
  b.heads = l.heads;
  b.qBlocks = l.q_blocks;
  b.kvBlocks = l.kv_blocks;
  return b;
}

/// The problem of a size query (no tensors): \p spec at these sizes.
Problem sizedProblem(const AttentionSpec &spec, int64_t batch, int64_t heads,
                     int64_t seqLenQ, int64_t seqLenKV) {
  Problem p;
  p.batch = batch;
  p.heads = heads;
  p.seqLenQ = seqLenQ;
  p.seqLenKV = seqLenKV;
  p.validate(spec);
  return p;
}

//===----------------------------------------------------------------------===//
// The backward's workspace
//===----------------------------------------------------------------------===//

[[noreturn]] static void workspaceTooLarge() {
  invalid("the backward's workspace for this problem would exceed 2^63 bytes");
}

/// The product of \p factors (bytes), or workspaceTooLarge().
static size_t checkedBytes(std::initializer_list<int64_t> factors) {
  int64_t bytes = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(bytes, f, &bytes))
      workspaceTooLarge();
  return size_t(bytes);
}

WorkspaceLayout workspaceLayout(const AttentionSpec &spec, const Problem &p,
                                const int64_t *captureSizes) {
  // backwardWorkspaceBytes() multiplies in int64: at most two statistics
  // and a dQ accumulator of head_dim_qk floats per row.
  checkedBytes({p.batch, p.heads, p.seqLenQ, 4 * (2 + spec.headDimQK)});
  WorkspaceLayout w;
  w.total = size_t(backwardWorkspaceBytes(spec, p));
  auto add = [](size_t a, size_t b) {
    size_t sum;
    if (__builtin_add_overflow(a, b, &sum) || sum > size_t(INT64_MAX))
      workspaceTooLarge();
    return sum;
  };
  auto align = [&](size_t x) { return add(x, 255) / 256 * 256; };
  if (spec.blockSparse) {
    int64_t qBlocks = ceilDiv(p.seqLenQ, spec.sparseBlock);
    int64_t kvBlocks = ceilDiv(p.seqLenKV, spec.sparseBlock);
    size_t counts = checkedBytes({p.batch, p.heads, kvBlocks, 4});
    size_t indices = checkedBytes({p.batch, p.heads, kvBlocks, qBlocks, 4});
    w.kvCounts = align(w.total);
    w.kvIndices = align(add(w.kvCounts, counts));
    w.total = add(w.kvIndices, indices);
  }
  if (abi::bwd::fixedPointCaptureGrads(spec)) {
    if (!captureSizes)
      invalid("a deterministic backward with captured gradients needs the "
              "captured tensors' sizes for its workspace "
              "(flashjit_backward_captured_workspace_size)");
    for (int64_t c = 0; c < spec.captures; ++c)
      if (((spec.captureGrads >> c) & 1) &&
          (captureSizes[c] < 1 || captureSizes[c] > INT32_MAX))
        invalid(fmt::format("captured[{}].size is {}: a tensor whose "
                            "gradient is summed deterministically has 1 .. "
                            "2^31 - 1 elements",
                            c, captureSizes[c]));
    w.captureWords = align(w.total);
    w.total =
        add(w.captureWords,
            size_t(abi::bwd::captureWordLayout(spec, captureSizes).bytes));
  }
  return w;
}

/// Checks a caller's workspace (NULL and 0: the library's) against \p w.
void checkWorkspace(const void *workspace, size_t bytes,
                    const WorkspaceLayout &w) {
  if (!workspace) {
    if (bytes != 0)
      invalid(fmt::format("workspace is NULL but workspace_bytes is {}: pass "
                          "NULL and 0 to use the library's workspace",
                          bytes));
    return;
  }
  if (bytes < w.total)
    invalid(fmt::format("workspace_bytes ({}) is less than the {} bytes this "
                        "backward needs ({})",
                        bytes, w.total,
                        w.captureWords
                            ? "flashjit_backward_captured_workspace_size: "
                              "deterministic captured gradients"
                            : "flashjit_backward_workspace_size"));
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    invalid(fmt::format("workspace ({}) must be 16-byte aligned", workspace));
}

/// \p t must have \p like's shape (the gradient of a tensor is shaped as it).
void checkSameShape(const flashjit_tensor *t, const char *what,
                    const flashjit_tensor &like, const char *likeName) {
  checkTensor(t, what);
  for (int i = 0; i < 4; ++i)
    if (t->shape[i] != like.shape[i])
      invalid(fmt::format("{} must be shaped as {}: dim {} is {}, expected {}",
                          what, likeName, i, t->shape[i], like.shape[i]));
}

} // namespace flashjit::capi
