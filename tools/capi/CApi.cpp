//===- CApi.cpp - flashjit's C API (tools/capi/flashjit.h) ----------------===//
//
/// \file
/// The C entry points of libflashjit.so. Every function converts the C
/// description into the C++ one (AttentionSpec, Problem, tensors), runs it
/// through the compiler and the runtime, and catches every exception at the
/// boundary: the status says what kind of failure it was, the thread-local
/// message (flashjit_last_error) says what failed.
///
/// The tiling choice lives in ONE function, chooseConfig(), so that the
/// autotuner can replace it. Compiled kernels are cached in the handle per
/// (spec, config, copy width, arch, CUDA context); the forward and the
/// backward share the CUDA path's steps (device, target, config, kernel).
//
//===----------------------------------------------------------------------===//

#include "flashjit.h"

#include "compiler/Compiler.h"
#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"
#include "runtime/AttentionLauncher.h"
#include "runtime/BackwardLauncher.h"
#include "runtime/CudaDriver.h"
#include "runtime/Error.h"
#include "runtime/NvJitLink.h"
#include "tools/engine/KernelProvider.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>

#if defined(FLASHJIT_VERSION) // the project's version, from CMake
#define FLASHJIT_VERSION_STRING FLASHJIT_VERSION
#else
#define FLASHJIT_VERSION_STRING "0.1.0"
#endif

using namespace flashjit;

struct flashjit_handle {
  int device = FLASHJIT_DEVICE_CPU;
  /// The device whose primary context is used when none is current.
  int cudaOrdinal = 0;
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<CpuKernel>> cpuKernels;
  std::map<std::string, std::shared_ptr<CpuBackwardKernel>> cpuBwdKernels;
  std::map<std::string, std::shared_ptr<rt::ForwardKernel>> gpuKernels;
  std::map<std::string, std::shared_ptr<rt::BackwardKernel>> gpuBwdKernels;
  std::map<int, rt::DeviceInfo> devices;
  /// Tile configs per (spec, problem class, device): tuned, loaded from the
  /// disk cache, or (FLASHJIT_AUTOTUNE=0, and the backward) the heuristic.
  std::map<std::string, TileConfig> gpuConfigs;

  /// The backward's workspace when the caller passes none, per CUDA
  /// context: used in stream order through \c lastUse (see
  /// withLibraryWorkspace in CApi.cpp).
  struct Workspace {
    rt::DeviceBuffer buffer;
    /// Recorded after each call's kernels; every call waits on it first.
    std::optional<rt::Event> lastUse;
    /// Waits for the last use before the buffer is freed (errors ignored:
    /// the context may be gone at exit).
    ~Workspace() {
      try {
        if (lastUse)
          lastUse->synchronize();
      } catch (...) {
      }
    }
  };
  /// Held from a call's wait on lastUse to its record (launches only).
  std::mutex workspaceMutex;
  std::map<CUcontext, Workspace> workspaces;
};

namespace {

thread_local std::string lastError;

/// Runs \p body, turning every exception into a status and a message.
template <typename Body> flashjit_status guarded(const char *fn, Body body) {
  auto fail = [&](flashjit_status s, const std::string &what) {
    try {
      lastError = fmt::format("{}: {}", fn, what);
    } catch (...) {
      lastError.clear();
    }
    return s;
  };
  try {
    body();
    return FLASHJIT_OK;
  } catch (const rt::RuntimeError &e) {
    switch (e.code()) {
    case rt::ErrorCode::NoDriver:
      return fail(FLASHJIT_ERROR_NO_DRIVER, e.what());
    case rt::ErrorCode::DriverError:
      return fail(FLASHJIT_ERROR_CUDA, e.what());
    case rt::ErrorCode::NvJitLinkError:
      return fail(FLASHJIT_ERROR_COMPILE, e.what());
    case rt::ErrorCode::InvalidArgument:
      return fail(FLASHJIT_ERROR_INVALID_ARGUMENT, e.what());
    }
    return fail(FLASHJIT_ERROR_INTERNAL, e.what());
  } catch (const CompileError &e) {
    return fail(FLASHJIT_ERROR_COMPILE, e.what());
  } catch (const SpecError &e) {
    return fail(FLASHJIT_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc &) {
    return fail(FLASHJIT_ERROR_INTERNAL, "out of host memory");
  } catch (const std::exception &e) {
    return fail(FLASHJIT_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(FLASHJIT_ERROR_INTERNAL, "unknown exception");
  }
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
/// nullptr for the CPU execution mode. The autotuner replaces this function.
TileConfig chooseConfig(const AttentionSpec &spec, const Problem &problem,
                        const rt::DeviceInfo *gpu) {
  (void)problem;
  if (spec.direction == Direction::Backward)
    return defaultGpuBackwardConfig(spec);
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
  if (s->reserved != 0)
    invalid(fmt::format("spec.reserved must be 0 (flashjit_spec_init sets "
                        "it), got {}",
                        s->reserved));
  try {
    spec.validate();
  } catch (const SpecError &e) {
    invalid(std::string("spec.") + e.what());
  }
  return spec;
}

const char *shapeName(int i) {
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

void checkDim(const flashjit_tensor *t, const char *what, int dim, int64_t want,
              const char *wantWhat) {
  if (t->shape[dim] != want)
    invalid(fmt::format("{}.shape[{}] ({}) is {}, {} is {}", what, dim,
                        shapeName(dim), t->shape[dim], wantWhat, want));
}

/// Checks the four tensors against the spec and each other and returns the
/// problem they describe.
Problem toProblem(const AttentionSpec &spec, const flashjit_tensor *q,
                  const flashjit_tensor *k, const flashjit_tensor *v,
                  const flashjit_tensor *o, double scale, int64_t windowLeft,
                  int64_t windowRight) {
  checkTensor(q, "q");
  checkTensor(k, "k");
  checkTensor(v, "v");
  checkTensor(o, "o");
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

std::string kernelKey(const AttentionSpec &spec, const TileConfig &c,
                      int64_t copyBytes, const std::string &arch,
                      const void *context) {
  return fmt::format("{}|{}x{}w{}s{}|copy{}|{}|ctx{}", spec.name(), c.blockM,
                     c.blockN, c.warps, c.stages, copyBytes, arch, context);
}

//===----------------------------------------------------------------------===//
// The backward's workspace
//===----------------------------------------------------------------------===//

/// Where the parts of the backward's workspace lie, in bytes from its start.
struct WorkspaceLayout {
  /// backwardWorkspaceBytes(): delta and -lse log2(e), then dq_accum for
  /// atomic dQ.
  size_t delta = 0;
  /// Block-sparse: the layout's KV-major transpose (int32 counts [B, H,
  /// KVb], indices [B, H, KVb, Qb]), each 256-byte aligned.
  size_t kvCounts = 0, kvIndices = 0;
  size_t total = 0;
};

[[noreturn]] void workspaceTooLarge() {
  invalid("the backward's workspace for this problem would exceed 2^63 bytes");
}

/// The product of \p factors (bytes), or workspaceTooLarge().
size_t checkedBytes(std::initializer_list<int64_t> factors) {
  int64_t bytes = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(bytes, f, &bytes))
      workspaceTooLarge();
  return size_t(bytes);
}

WorkspaceLayout workspaceLayout(const AttentionSpec &spec, const Problem &p) {
  // backwardWorkspaceBytes() multiplies in int64: at most two statistics
  // and a dQ accumulator of head_dim_qk floats per row.
  checkedBytes({p.batch, p.heads, p.seqLenQ, 4 * (2 + spec.headDimQK)});
  WorkspaceLayout w;
  w.total = size_t(backwardWorkspaceBytes(spec, p));
  if (spec.blockSparse) {
    int64_t qBlocks = ceilDiv(p.seqLenQ, spec.sparseBlock);
    int64_t kvBlocks = ceilDiv(p.seqLenKV, spec.sparseBlock);
    size_t counts = checkedBytes({p.batch, p.heads, kvBlocks, 4});
    size_t indices = checkedBytes({p.batch, p.heads, kvBlocks, qBlocks, 4});
    auto add = [](size_t a, size_t b) {
      size_t sum;
      if (__builtin_add_overflow(a, b, &sum) || sum > size_t(INT64_MAX))
        workspaceTooLarge();
      return sum;
    };
    auto align = [&](size_t x) { return add(x, 255) / 256 * 256; };
    w.kvCounts = align(w.total);
    w.kvIndices = align(add(w.kvCounts, counts));
    w.total = add(w.kvIndices, indices);
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
                        "backward needs (flashjit_backward_workspace_size)",
                        bytes, w.total));
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    invalid(fmt::format("workspace ({}) must be 16-byte aligned", workspace));
}

//===----------------------------------------------------------------------===//
// CPU
//===----------------------------------------------------------------------===//

/// A packed host copy of a caller's strided tensor (the CPU execution mode
/// runs on HalfTensor buffers it owns).
HalfTensor packedCopy(const flashjit_tensor &t) {
  HalfTensor h =
      HalfTensor::packed({t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
  const auto *src = static_cast<const uint16_t *>(t.data);
  uint16_t *dst = h.buffer->data();
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t hh = 0; hh < t.shape[1]; ++hh)
      for (int64_t n = 0; n < t.shape[2]; ++n) {
        std::memcpy(
            dst, src + b * t.strides[0] + hh * t.strides[1] + n * t.strides[2],
            size_t(t.shape[3]) * 2);
        dst += t.shape[3];
      }
  return h;
}

void scatterBack(const HalfTensor &h, const flashjit_tensor &t) {
  auto *dst = static_cast<uint16_t *>(t.data);
  const uint16_t *src = h.buffer->data();
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t hh = 0; hh < t.shape[1]; ++hh)
      for (int64_t n = 0; n < t.shape[2]; ++n) {
        std::memcpy(dst + b * t.strides[0] + hh * t.strides[1] +
                        n * t.strides[2],
                    src, size_t(t.shape[3]) * 2);
        src += t.shape[3];
      }
}

std::shared_ptr<CpuKernel> cpuKernel(flashjit_handle *h,
                                     const AttentionSpec &spec,
                                     const TileConfig &config) {
  std::string key = kernelKey(spec, config, 0, "cpu", nullptr);
  std::lock_guard<std::mutex> lock(h->mutex);
  auto it = h->cpuKernels.find(key);
  if (it != h->cpuKernels.end())
    return it->second;
  std::shared_ptr<CpuKernel> k = CpuKernel::compile(spec, config);
  h->cpuKernels.emplace(key, k);
  return k;
}

/// A host copy of a call's layout (nullptr when dense), its counts and
/// indices checked to be in range. \p copy(dst, src, elements) copies int32
/// elements from the caller's memory (host or device) to the host.
template <typename CopyFn>
std::unique_ptr<BlockSparseLayout>
hostLayout(const flashjit_layout *layout, const Problem &p, int64_t sparseBlock,
           CopyFn copy) {
  if (!layout)
    return nullptr;
  auto bcsr = std::make_unique<BlockSparseLayout>(layoutShape(*layout));
  size_t rows = size_t(layout->batch * layout->heads * layout->q_blocks);
  bcsr->counts.resize(rows);
  bcsr->indices.resize(rows * size_t(layout->kv_blocks));
  copy(bcsr->counts.data(), layout->counts, bcsr->counts.size());
  copy(bcsr->indices.data(), layout->indices, bcsr->indices.size());
  bcsr->checkFits(p, sparseBlock);
  return bcsr;
}

/// A CPU call's layout: host memory.
std::unique_ptr<BlockSparseLayout> hostLayout(const flashjit_layout *layout,
                                              const Problem &p,
                                              int64_t sparseBlock) {
  return hostLayout(layout, p, sparseBlock,
                    [](int32_t *dst, const int32_t *src, size_t n) {
                      std::copy(src, src + n, dst);
                    });
}

void forwardCpu(flashjit_handle *h, const AttentionSpec &spec, const Problem &p,
                const flashjit_tensor &q, const flashjit_tensor &k,
                const flashjit_tensor &v, const flashjit_tensor &o, float *lse,
                const flashjit_layout *layout) {
  std::unique_ptr<BlockSparseLayout> bcsr =
      hostLayout(layout, p, spec.sparseBlock);
  TileConfig config = chooseConfig(spec, p, nullptr);
  std::shared_ptr<CpuKernel> kernel = cpuKernel(h, spec, config);

  AttentionData d;
  d.q = packedCopy(q);
  d.k = packedCopy(k);
  d.v = packedCopy(v);
  d.o = HalfTensor::packed({o.shape[0], o.shape[1], o.shape[2], o.shape[3]});
  d.lse.assign(size_t(p.batch * p.heads * p.seqLenQ), 0.0f);
  kernel->run(p, d, bcsr.get());
  scatterBack(d.o, o);
  if (lse)
    std::memcpy(lse, d.lse.data(), d.lse.size() * sizeof(float));
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

/// The backward on the CPU: dq, dk, dv from q, k, v, the forward's o and
/// lse, and d_o (dQ in the spec's mode; the kernel's own workspace).
void backwardCpu(flashjit_handle *h, const AttentionSpec &forwardSpec,
                 const Problem &p, const flashjit_tensor &q,
                 const flashjit_tensor &k, const flashjit_tensor &v,
                 const flashjit_tensor &o, const flashjit_tensor &dO,
                 const float *lse, const flashjit_tensor &dq,
                 const flashjit_tensor &dk, const flashjit_tensor &dv,
                 const flashjit_layout *layout) {
  std::unique_ptr<BlockSparseLayout> bcsr =
      hostLayout(layout, p, forwardSpec.sparseBlock);
  AttentionSpec spec = forwardSpec;
  spec.direction = Direction::Backward;
  TileConfig config = chooseConfig(spec, p, nullptr);
  std::shared_ptr<CpuBackwardKernel> kernel;
  {
    std::string key = kernelKey(spec, config, 0, "cpu", nullptr);
    std::lock_guard<std::mutex> lock(h->mutex);
    auto it = h->cpuBwdKernels.find(key);
    if (it == h->cpuBwdKernels.end())
      it = h->cpuBwdKernels
               .emplace(key, CpuBackwardKernel::compile(spec, config))
               .first;
    kernel = it->second;
  }
  AttentionData fwd;
  fwd.q = packedCopy(q);
  fwd.k = packedCopy(k);
  fwd.v = packedCopy(v);
  fwd.o = packedCopy(o);
  fwd.lse.assign(lse, lse + p.batch * p.heads * p.seqLenQ);
  // A NaN (or +inf) lse is no forward's output; the kernel would read it as
  // a row that sees no key and give that row a zero dQ. Refused instead.
  for (size_t i = 0; i < fwd.lse.size(); ++i)
    if (std::isnan(fwd.lse[i]) || fwd.lse[i] == INFINITY) {
      int64_t row = int64_t(i) % p.seqLenQ, bh = int64_t(i) / p.seqLenQ;
      invalid(fmt::format("lse[{}, {}, {}] is {}: the forward's lse is "
                          "finite, or -inf for a row that sees no key",
                          bh / p.heads, bh % p.heads, row, fwd.lse[i]));
    }
  AttentionGrads g;
  g.dO = packedCopy(dO);
  g.dq = HalfTensor::packed({q.shape[0], q.shape[1], q.shape[2], q.shape[3]});
  g.dk = HalfTensor::packed({k.shape[0], k.shape[1], k.shape[2], k.shape[3]});
  g.dv = HalfTensor::packed({v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
  kernel->run(p, fwd, g, bcsr.get());
  scatterBack(g.dq, dq);
  scatterBack(g.dk, dk);
  scatterBack(g.dv, dv);
}

//===----------------------------------------------------------------------===//
// CUDA
//===----------------------------------------------------------------------===//

/// Makes a context current (the caller's, else the primary context of the
/// handle's device) and returns it and its device's description.
std::pair<CUcontext, rt::DeviceInfo> currentDevice(flashjit_handle *h) {
  rt::CudaDriver &driver = rt::CudaDriver::get();
  driver.requireAvailable();
  CUcontext context = driver.ensureContext(h->cudaOrdinal);
  int ordinal = driver.currentDevice();
  std::lock_guard<std::mutex> lock(h->mutex);
  auto it = h->devices.find(ordinal);
  if (it == h->devices.end())
    it = h->devices.emplace(ordinal, rt::queryDevice(ordinal, driver)).first;
  return {context, it->second};
}

CUdeviceptr devicePtr(const void *p) {
  return CUdeviceptr(reinterpret_cast<uintptr_t>(p));
}

rt::DeviceTensor deviceTensor(const flashjit_tensor &t) {
  rt::DeviceTensor d;
  d.ptr = devicePtr(t.data);
  for (int i = 0; i < 4; ++i)
    d.strides[i] = t.strides[i];
  return d;
}

/// The caller's layout (device pointers) as kernel arguments of a forward
/// or a backward (rt::ForwardArgs, rt::BackwardArgs); nothing when dense.
template <typename Args>
void setLayoutArgs(Args &args, const flashjit_layout *layout) {
  if (!layout)
    return;
  BlockSparseLayout shape = layoutShape(*layout);
  args.counts = devicePtr(layout->counts);
  args.indices = devicePtr(layout->indices);
  args.countStrides = shape.countStrides();
  args.indexStrides = shape.indexStrides();
}

/// What a call compiles for: the device's arch and driver, \p copyBytes.
GpuTarget gpuTarget(const rt::DeviceInfo &info, int64_t copyBytes) {
  GpuTarget target;
  target.arch = info.targetArch();
  target.driverVersion = info.driverVersion;
  target.copyBytes = copyBytes;
  return target;
}

/// The GPU tile config of a call: the handle's memory, then a config tuned
/// on this GPU for the problem class (the disk cache). Else, for a forward
/// (\p tuneArgs set), a flag-free first call on a new (spec, problem class,
/// GPU) tunes on the caller's real inputs (after synchronising its stream;
/// the outputs are overwritten by the call that follows); FLASHJIT_AUTOTUNE=0,
/// or a stream being captured into a CUDA graph, gets the heuristic instead
/// (never tuning or synchronising during capture). The backward (\p tuneArgs
/// null) never tunes: the heuristic.
TileConfig lookUpGpuConfig(flashjit_handle *h, const AttentionSpec &spec,
                           const Problem &p, const rt::DeviceInfo &info,
                           const GpuTarget &target, CUstream stream,
                           const rt::ForwardArgs *tuneArgs) {
  std::string key = fmt::format("{}|{}|{}|{}", spec.name(), rt::problemClass(p),
                                info.ordinal, target.copyBytes);
  std::lock_guard<std::mutex> lock(h->mutex);
  if (auto it = h->gpuConfigs.find(key); it != h->gpuConfigs.end())
    return it->second;
  rt::DiskCache cache;
  if (auto tuned = engine::loadTunedConfig(spec, p, info, cache))
    return h->gpuConfigs[key] = *tuned;
  const char *env = std::getenv("FLASHJIT_AUTOTUNE");
  bool autotune = tuneArgs && !(env && std::string(env) == "0");
  if (!autotune)
    return h->gpuConfigs[key] = chooseConfig(spec, p, &info);
  if (rt::isStreamCapturing(stream))
    return chooseConfig(spec, p, &info); // not remembered: tune later
  rt::CudaDriver::get().synchronize(stream);
  bool print = std::getenv("FLASHJIT_PRINT_AUTOTUNING") != nullptr;
  rt::TuneResult r = engine::tuneOnDevice(
      spec, p, *tuneArgs, target, info, cache,
      [&](size_t i, size_t n, const rt::TunedCandidate &c) {
        if (print)
          fmt::print(stderr,
                     "flashjit: tuning {}: candidate {} of {}: {} "
                     "{}\n",
                     spec.name(), i + 1, n, c.config.toJson(),
                     c.error.empty() ? fmt::format("{:.4f} ms", c.ms)
                                     : "failed");
      });
  if (print)
    fmt::print(stderr, "{}", rt::formatTuneTable(r));
  return h->gpuConfigs[key] = r.best;
}

/// lookUpGpuConfig(), checked to run on the device (the forward's or the
/// backward's geometry, by \p spec's direction).
TileConfig chooseGpuConfig(flashjit_handle *h, const AttentionSpec &spec,
                           const Problem &p, const rt::DeviceInfo &info,
                           const GpuTarget &target, CUstream stream,
                           const rt::ForwardArgs *tuneArgs) {
  TileConfig config =
      lookUpGpuConfig(h, spec, p, info, target, stream, tuneArgs);
  std::string problem =
      spec.direction == Direction::Backward
          ? gpuBackwardConfigProblem(spec, config, info.maxSharedPerBlockOptin)
          : gpuConfigProblem(spec, config, info.maxSharedPerBlockOptin,
                             usesKvRing(target));
  if (!problem.empty())
    invalid(problem);
  return config;
}

/// The loaded kernel (rt::ForwardKernel or rt::BackwardKernel) of (spec,
/// config, target) in \p context: the handle's memory \p kernels, then the
/// disk cache, then a compile.
template <typename Kernel>
std::shared_ptr<Kernel>
gpuKernel(flashjit_handle *h,
          std::map<std::string, std::shared_ptr<Kernel>> &kernels,
          const AttentionSpec &spec, const TileConfig &config,
          const GpuTarget &target, CUcontext context) {
  std::string key =
      kernelKey(spec, config, target.copyBytes, target.arch, context);
  std::lock_guard<std::mutex> lock(h->mutex);
  auto it = kernels.find(key);
  if (it != kernels.end())
    return it->second;
  rt::DiskCache cache;
  engine::CubinBuild b = engine::buildCubin(spec, config, target, cache);
  auto kernel =
      std::make_shared<Kernel>(b.image, spec, target.copyBytes);
  kernels.emplace(key, kernel);
  return kernel;
}

void forwardCuda(flashjit_handle *h, const AttentionSpec &spec,
                 const Problem &p, const flashjit_tensor &q,
                 const flashjit_tensor &k, const flashjit_tensor &v,
                 const flashjit_tensor &o, float *lse,
                 const flashjit_layout *layout, void *stream) {
  if (!lse)
    invalid("lse is NULL: on CUDA the kernel always writes lse (fp32 "
            "[B, H, Nq])");
  auto [context, info] = currentDevice(h);

  rt::ForwardArgs args;
  args.q = deviceTensor(q);
  args.k = deviceTensor(k);
  args.v = deviceTensor(v);
  args.o = deviceTensor(o);
  args.lse = devicePtr(lse);
  setLayoutArgs(args, layout);
  GpuTarget target = gpuTarget(info, rt::chooseCopyBytes(args));
  CUstream cuStream = static_cast<CUstream>(stream);
  TileConfig config =
      chooseGpuConfig(h, spec, p, info, target, cuStream, &args);
  gpuKernel(h, h->gpuKernels, spec, config, target, context)
      ->launch(p, args, cuStream);
}

/// Runs \p launch(base) on the handle's workspace of at least \p bytes in
/// \p context (grown if needed), in stream order with every other call that
/// uses it: \p stream first waits, on the device, for the work the previous
/// user queued (on any stream), and the work \p launch queues on \p stream
/// is what the next user waits for. Growing waits on the host for the last
/// use before the old buffer is freed.
template <typename LaunchFn>
void withLibraryWorkspace(flashjit_handle *h, CUcontext context, size_t bytes,
                          CUstream stream, LaunchFn launch) {
  std::lock_guard<std::mutex> lock(h->workspaceMutex);
  flashjit_handle::Workspace &ws = h->workspaces[context];
  if (!ws.lastUse)
    ws.lastUse.emplace();
  if (ws.buffer.size() < bytes) {
    ws.lastUse->synchronize();
    ws.buffer.reset();
    ws.buffer =
        rt::DeviceBuffer(size_t(roundUp(int64_t(bytes), int64_t(1) << 20)));
  }
  ws.lastUse->waitOn(stream);
  try {
    launch(ws.buffer.ptr());
  } catch (...) {
    // Kernels launched before the failure may still use the buffer.
    try {
      ws.lastUse->record(stream);
    } catch (...) {
    }
    throw;
  }
  ws.lastUse->record(stream);
}

/// Copies \p l's counts and indices to \p counts and \p indices on \p stream
/// and waits for the copies, so that \p l may be freed (also when one fails).
void uploadLayoutAndWait(const BlockSparseLayout &l, CUdeviceptr counts,
                         CUdeviceptr indices, CUstream stream) {
  rt::CudaDriver &driver = rt::CudaDriver::get();
  try {
    rt::copyToDeviceAsync(counts, l.counts.data(),
                          l.counts.size() * sizeof(int32_t), stream);
    rt::copyToDeviceAsync(indices, l.indices.data(),
                          l.indices.size() * sizeof(int32_t), stream);
  } catch (...) {
    try {
      driver.synchronize(stream);
    } catch (...) {
    }
    throw;
  }
  driver.synchronize(stream);
}

/// The backward on CUDA: see flashjit_backward in flashjit.h. \p workspace
/// is the caller's (laid out as \p w) or null: the library's.
void backwardCuda(flashjit_handle *h, const AttentionSpec &forwardSpec,
                  const Problem &p, const flashjit_tensor &q,
                  const flashjit_tensor &k, const flashjit_tensor &v,
                  const flashjit_tensor &o, const flashjit_tensor &dO,
                  const float *lse, const flashjit_tensor &dq,
                  const flashjit_tensor &dk, const flashjit_tensor &dv,
                  const flashjit_layout *layout, void *workspace,
                  const WorkspaceLayout &w, void *stream) {
  auto [context, info] = currentDevice(h);
  CUstream cuStream = static_cast<CUstream>(stream);
  bool capturing = rt::isStreamCapturing(cuStream);
  if (capturing && layout)
    invalid("the stream is being captured into a CUDA graph, and a "
            "block-sparse backward reads the layout on the host "
            "(synchronizing the stream): run it outside the capture");
  if (capturing && !workspace)
    invalid("workspace is NULL while the stream is being captured into a "
            "CUDA graph: the library's buffer is shared with later calls; "
            "pass a workspace of flashjit_backward_workspace_size bytes");
  AttentionSpec spec = forwardSpec;
  spec.direction = Direction::Backward;

  rt::BackwardArgs args;
  args.q = deviceTensor(q);
  args.k = deviceTensor(k);
  args.v = deviceTensor(v);
  args.o = deviceTensor(o);
  args.dO = deviceTensor(dO);
  args.dq = deviceTensor(dq);
  args.dk = deviceTensor(dk);
  args.dv = deviceTensor(dv);
  args.lse = devicePtr(lse);
  setLayoutArgs(args, layout);
  GpuTarget target = gpuTarget(info, rt::chooseCopyBytes(args));
  TileConfig config =
      chooseGpuConfig(h, spec, p, info, target, cuStream, nullptr);
  std::shared_ptr<rt::BackwardKernel> kernel =
      gpuKernel(h, h->gpuBwdKernels, spec, config, target, context);

  // Block-sparse: the KV-major transpose of the caller's layout, made on the
  // host after the work queued before this call (the layout's writes) ran.
  std::unique_ptr<BlockSparseLayout> kvMajor;
  if (layout) {
    rt::CudaDriver &driver = rt::CudaDriver::get();
    std::unique_ptr<BlockSparseLayout> bcsr =
        hostLayout(layout, p, forwardSpec.sparseBlock,
                   [&](int32_t *dst, const int32_t *src, size_t n) {
                     rt::copyToHostAsync(dst, devicePtr(src),
                                         n * sizeof(int32_t), cuStream);
                     driver.synchronize(cuStream);
                   });
    kvMajor = std::make_unique<BlockSparseLayout>(bcsr->transposed());
    args.kvCountStrides = kvMajor->countStrides();
    args.kvIndexStrides = kvMajor->indexStrides();
  }
  auto launch = [&](CUdeviceptr base) {
    args.delta = base + w.delta;
    if (kvMajor) {
      args.kvCounts = base + w.kvCounts;
      args.kvIndices = base + w.kvIndices;
      uploadLayoutAndWait(*kvMajor, args.kvCounts, args.kvIndices, cuStream);
    }
    kernel->launch(p, args, cuStream);
  };
  if (workspace)
    launch(devicePtr(workspace));
  else
    withLibraryWorkspace(h, context, w.total, cuStream, launch);
}

} // namespace

//===----------------------------------------------------------------------===//
// The C entry points
//===----------------------------------------------------------------------===//

extern "C" {

FLASHJIT_API const char *flashjit_status_name(flashjit_status status) {
  switch (status) {
  case FLASHJIT_OK:
    return "OK";
  case FLASHJIT_ERROR_INVALID_ARGUMENT:
    return "INVALID_ARGUMENT";
  case FLASHJIT_ERROR_NO_DRIVER:
    return "NO_DRIVER";
  case FLASHJIT_ERROR_COMPILE:
    return "COMPILE_ERROR";
  case FLASHJIT_ERROR_CUDA:
    return "CUDA_ERROR";
  case FLASHJIT_ERROR_NOT_IMPLEMENTED:
    return "NOT_IMPLEMENTED";
  case FLASHJIT_ERROR_INTERNAL:
    return "INTERNAL";
  }
  return "UNKNOWN";
}

FLASHJIT_API const char *flashjit_last_error(const flashjit_handle *) {
  return lastError.c_str();
}

FLASHJIT_API const char *flashjit_version(void) {
  return FLASHJIT_VERSION_STRING;
}

FLASHJIT_API flashjit_status flashjit_create(flashjit_handle **handle,
                                             int device) {
  return guarded("flashjit_create", [&] {
    if (!handle)
      invalid("handle is NULL");
    *handle = nullptr;
    if (device != FLASHJIT_DEVICE_CPU && device != FLASHJIT_DEVICE_CUDA)
      invalid(fmt::format("device must be FLASHJIT_DEVICE_CPU (0) or "
                          "FLASHJIT_DEVICE_CUDA (1), got {}",
                          device));
    if (device == FLASHJIT_DEVICE_CUDA)
      rt::CudaDriver::get().requireAvailable();
    auto h = std::make_unique<flashjit_handle>();
    h->device = device;
    *handle = h.release();
  });
}

FLASHJIT_API void flashjit_destroy(flashjit_handle *handle) {
  try {
    delete handle;
  } catch (...) {
  }
}

FLASHJIT_API flashjit_status flashjit_set_cuda_device(flashjit_handle *handle,
                                                      int ordinal) {
  return guarded("flashjit_set_cuda_device", [&] {
    requireHandle(handle);
    if (handle->device != FLASHJIT_DEVICE_CUDA)
      invalid("flashjit_set_cuda_device needs a CUDA handle");
    int count = rt::CudaDriver::get().deviceCount();
    if (ordinal < 0 || ordinal >= count)
      invalid(fmt::format("CUDA device ordinal {} out of range: this machine "
                          "has {} device(s)",
                          ordinal, count));
    std::lock_guard<std::mutex> lock(handle->mutex);
    handle->cudaOrdinal = ordinal;
  });
}

FLASHJIT_API int64_t flashjit_cached_kernels(const flashjit_handle *handle) {
  if (!handle)
    return 0;
  auto *h = const_cast<flashjit_handle *>(handle);
  std::lock_guard<std::mutex> lock(h->mutex);
  return int64_t(h->cpuKernels.size() + h->cpuBwdKernels.size() +
                 h->gpuKernels.size() + h->gpuBwdKernels.size());
}

FLASHJIT_API void flashjit_spec_init(flashjit_spec *spec) {
  if (!spec)
    return;
  std::memset(spec, 0, sizeof(*spec));
  spec->head_dim_qk = 128;
  spec->head_dim_v = 128;
  spec->dtype = FLASHJIT_DTYPE_BF16;
  spec->mask = FLASHJIT_MASK_NONE;
  spec->gqa = 1;
  spec->block_sparse = 0;
  spec->direction = FLASHJIT_DIRECTION_FORWARD;
  spec->sparse_block = 128;
  spec->deterministic = 0;
  spec->reserved = 0;
}

FLASHJIT_API flashjit_status
flashjit_forward(flashjit_handle *handle, const flashjit_spec *spec,
                 const flashjit_tensor *q, const flashjit_tensor *k,
                 const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
                 double scale, int64_t window_left, int64_t window_right,
                 const flashjit_layout *layout, void *cuda_stream) {
  return guarded("flashjit_forward", [&] {
    requireHandle(handle);
    AttentionSpec s = toSpec(spec);
    s.direction = Direction::Forward; // the pass this call runs
    Problem p = toProblem(s, q, k, v, o, scale, window_left, window_right);
    checkLayoutShape(s, p, layout);
    if (handle->device == FLASHJIT_DEVICE_CPU)
      forwardCpu(handle, s, p, *q, *k, *v, *o, lse, layout);
    else
      forwardCuda(handle, s, p, *q, *k, *v, *o, lse, layout, cuda_stream);
  });
}

FLASHJIT_API flashjit_status flashjit_backward(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_layout *layout,
    void *workspace, size_t workspace_bytes, void *cuda_stream) {
  return guarded("flashjit_backward", [&] {
    requireHandle(handle);
    AttentionSpec s = toSpec(spec);   // as the forward's: the callees derive
    s.direction = Direction::Forward; // the backward spec from it
    Problem p = toProblem(s, q, k, v, o, scale, window_left, window_right);
    checkLayoutShape(s, p, layout);
    checkSameShape(d_o, "d_o", *o, "o");
    checkSameShape(dq, "dq", *q, "q");
    checkSameShape(dk, "dk", *k, "k");
    checkSameShape(dv, "dv", *v, "v");
    if (!lse)
      invalid("lse is NULL: the backward reads the forward's lse");
    WorkspaceLayout w = workspaceLayout(s, p);
    checkWorkspace(workspace, workspace_bytes, w);
    if (handle->device == FLASHJIT_DEVICE_CUDA)
      backwardCuda(handle, s, p, *q, *k, *v, *o, *d_o, lse, *dq, *dk, *dv,
                   layout, workspace, w, cuda_stream);
    else
      backwardCpu(handle, s, p, *q, *k, *v, *o, *d_o, lse, *dq, *dk, *dv,
                  layout);
  });
}

FLASHJIT_API flashjit_status flashjit_backward_workspace_size(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_len_q, int64_t seq_len_kv, size_t *bytes) {
  return guarded("flashjit_backward_workspace_size", [&] {
    requireHandle(handle);
    if (!bytes)
      invalid("bytes is NULL");
    *bytes = 0;
    AttentionSpec s = toSpec(spec);
    Problem p = sizedProblem(s, batch, heads, seq_len_q, seq_len_kv);
    *bytes = workspaceLayout(s, p).total;
  });
}

FLASHJIT_API flashjit_status flashjit_chosen_config(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_len_q, int64_t seq_len_kv, int64_t out[4]) {
  return guarded("flashjit_chosen_config", [&] {
    requireHandle(handle);
    if (!out)
      invalid("out is NULL");
    AttentionSpec s = toSpec(spec);
    Problem p = sizedProblem(s, batch, heads, seq_len_q, seq_len_kv);
    TileConfig c;
    if (handle->device == FLASHJIT_DEVICE_CUDA) {
      // What the next forward would use without tuning: a config tuned on
      // this GPU for this problem class (memory or disk), else the
      // heuristic.
      rt::DeviceInfo info = currentDevice(handle).second;
      rt::DiskCache cache;
      std::optional<TileConfig> tuned;
      {
        std::lock_guard<std::mutex> lock(handle->mutex);
        std::string prefix = fmt::format("{}|{}|{}|", s.name(),
                                         rt::problemClass(p), info.ordinal);
        for (auto &[key, config] : handle->gpuConfigs)
          if (key.rfind(prefix, 0) == 0)
            tuned = config;
      }
      if (!tuned)
        tuned = engine::loadTunedConfig(s, p, info, cache);
      c = tuned ? *tuned : chooseConfig(s, p, &info);
    } else {
      c = chooseConfig(s, p, nullptr);
    }
    out[0] = c.blockM;
    out[1] = c.blockN;
    out[2] = c.warps;
    out[3] = c.stages;
  });
}

FLASHJIT_API flashjit_status flashjit_emit(flashjit_handle *handle,
                                           const flashjit_spec *spec,
                                           const char *stage, const char *arch,
                                           char **out, size_t *len) {
  return guarded("flashjit_emit", [&] {
    requireHandle(handle);
    if (!out || !len)
      invalid("out and len must not be NULL");
    *out = nullptr;
    *len = 0;
    if (!stage)
      invalid("stage is NULL");
    AttentionSpec s = toSpec(spec);
    Stage st = parseStage(stage);
    GpuTarget target;
    Problem p;
    TileConfig config;
    if (arch) {
      target.arch = arch;
      config = chooseConfig(s, p, nullptr);
    } else if (handle->device == FLASHJIT_DEVICE_CUDA) {
      rt::DeviceInfo info = currentDevice(handle).second;
      target.arch = info.targetArch();
      target.driverVersion = info.driverVersion;
      config = chooseConfig(s, p, &info);
    } else {
      config = chooseConfig(s, p, nullptr); // target.arch: sm_90a
    }
    std::string text;
    if (st == Stage::Cubin) {
      rt::CubinResult r =
          rt::ptxToCubin(compileToPtx(s, config, target), target.arch);
      text.assign(r.cubin.begin(), r.cubin.end());
    } else {
      text = emitStage(s, config, st, target);
    }
    char *buffer = static_cast<char *>(std::malloc(text.size() + 1));
    if (!buffer)
      throw std::bad_alloc();
    std::memcpy(buffer, text.data(), text.size());
    buffer[text.size()] = '\0';
    *out = buffer;
    *len = text.size();
  });
}

FLASHJIT_API void flashjit_free(void *buffer) { std::free(buffer); }

} // extern "C"
