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
/// (spec, config, copy width, arch, CUDA context).
//
//===----------------------------------------------------------------------===//

#include "flashjit.h"

#include "compiler/Compiler.h"
#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"
#include "runtime/AttentionLauncher.h"
#include "runtime/CudaDriver.h"
#include "runtime/Error.h"
#include "runtime/NvJitLink.h"
#include "tools/engine/KernelProvider.h"

#include <algorithm>
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
  std::map<int, rt::DeviceInfo> devices;
  /// Tile configs per (spec, problem class, device): tuned, loaded from the
  /// disk cache, or (FLASHJIT_AUTOTUNE=0) the heuristic.
  std::map<std::string, TileConfig> gpuConfigs;
};

namespace {

thread_local std::string lastError;

/// A request for what is not implemented yet (FLASHJIT_ERROR_NOT_IMPLEMENTED).
struct NotImplemented : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
  } catch (const NotImplemented &e) {
    return fail(FLASHJIT_ERROR_NOT_IMPLEMENTED, e.what());
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
/// default GPU tiling for the head dims, as the CLI uses. \p gpu is the
/// device the kernel runs on, nullptr for the CPU execution mode. The
/// autotuner replaces this function.
TileConfig chooseConfig(const AttentionSpec &spec, const Problem &problem,
                        const rt::DeviceInfo *gpu) {
  (void)problem;
  (void)gpu;
  TileConfig c = defaultGpuConfig(spec);
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
  if (s->reserved != 0)
    invalid(fmt::format("spec.reserved must be 0, got {}", s->reserved));
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
}

BlockSparseLayout layoutShape(const flashjit_layout &l) {
  BlockSparseLayout b;
  b.batch = l.batch;
  b.heads = l.heads;
  b.qBlocks = l.q_blocks;
  b.kvBlocks = l.kv_blocks;
  return b;
}

std::string kernelKey(const AttentionSpec &spec, const TileConfig &c,
                      int64_t copyBytes, const std::string &arch,
                      const void *context) {
  return fmt::format("{}|{}x{}w{}s{}|copy{}|{}|ctx{}", spec.name(), c.blockM,
                     c.blockN, c.warps, c.stages, copyBytes, arch, context);
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

/// A host copy of a CPU call's layout (nullptr when dense), its counts and
/// indices checked to be in range.
std::unique_ptr<BlockSparseLayout> hostLayout(const flashjit_layout *layout,
                                              const Problem &p,
                                              int64_t sparseBlock) {
  if (!layout)
    return nullptr;
  auto bcsr = std::make_unique<BlockSparseLayout>(layoutShape(*layout));
  size_t rows = size_t(layout->batch * layout->heads * layout->q_blocks);
  bcsr->counts.assign(layout->counts, layout->counts + rows);
  bcsr->indices.assign(layout->indices,
                       layout->indices + rows * size_t(layout->kv_blocks));
  bcsr->checkFits(p, sparseBlock);
  return bcsr;
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
/// lse, and d_o (dQ by a separate pass over Q blocks: deterministic).
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
  TileConfig config = chooseConfig(forwardSpec, p, nullptr);
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

rt::DeviceTensor deviceTensor(const flashjit_tensor &t) {
  rt::DeviceTensor d;
  d.ptr = CUdeviceptr(reinterpret_cast<uintptr_t>(t.data));
  for (int i = 0; i < 4; ++i)
    d.strides[i] = t.strides[i];
  return d;
}

/// The GPU tile config of a forward call: a flag-free first call on a new
/// (spec, problem class, GPU) tunes on the caller's real inputs (after
/// synchronising its stream; the outputs are overwritten by the call that
/// follows), later calls hit the handle's memory, then the disk cache.
/// FLASHJIT_AUTOTUNE=0, or a stream being captured into a CUDA graph, gets
/// the heuristic instead (never tuning or synchronising during capture).
TileConfig chooseGpuConfig(flashjit_handle *h, const AttentionSpec &spec,
                           const Problem &p, const rt::DeviceInfo &info,
                           const rt::ForwardArgs &args, const GpuTarget &target,
                           CUstream stream) {
  std::string key = fmt::format("{}|{}|{}|{}", spec.name(), rt::problemClass(p),
                                info.ordinal, target.copyBytes);
  std::lock_guard<std::mutex> lock(h->mutex);
  if (auto it = h->gpuConfigs.find(key); it != h->gpuConfigs.end())
    return it->second;
  rt::DiskCache cache;
  if (auto tuned = engine::loadTunedConfig(spec, p, info, cache))
    return h->gpuConfigs[key] = *tuned;
  const char *env = std::getenv("FLASHJIT_AUTOTUNE");
  bool autotune = !(env && std::string(env) == "0");
  if (!autotune)
    return h->gpuConfigs[key] = chooseConfig(spec, p, &info);
  if (rt::isStreamCapturing(stream))
    return chooseConfig(spec, p, &info); // not remembered: tune later
  rt::CudaDriver::get().synchronize(stream);
  bool print = std::getenv("FLASHJIT_PRINT_AUTOTUNING") != nullptr;
  rt::TuneResult r = engine::tuneOnDevice(
      spec, p, args, target, info, cache,
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
  args.lse = CUdeviceptr(reinterpret_cast<uintptr_t>(lse));
  if (layout) {
    BlockSparseLayout shape = layoutShape(*layout);
    args.counts = CUdeviceptr(reinterpret_cast<uintptr_t>(layout->counts));
    args.indices = CUdeviceptr(reinterpret_cast<uintptr_t>(layout->indices));
    args.countStrides = shape.countStrides();
    args.indexStrides = shape.indexStrides();
  }
  GpuTarget target;
  target.arch = info.targetArch();
  target.driverVersion = info.driverVersion;
  target.copyBytes = rt::chooseCopyBytes(args);

  CUstream cuStream = static_cast<CUstream>(stream);
  TileConfig config = chooseGpuConfig(h, spec, p, info, args, target, cuStream);
  std::string problem =
      gpuConfigProblem(spec, config, info.maxSharedPerBlockOptin);
  if (!problem.empty())
    invalid(problem);

  std::string key =
      kernelKey(spec, config, target.copyBytes, target.arch, context);
  std::shared_ptr<rt::ForwardKernel> kernel;
  {
    std::lock_guard<std::mutex> lock(h->mutex);
    auto it = h->gpuKernels.find(key);
    if (it != h->gpuKernels.end()) {
      kernel = it->second;
    } else {
      // Memory, then the disk cache, then a compile.
      rt::DiskCache cache;
      engine::CubinBuild b = engine::buildCubin(spec, config, target, cache);
      kernel = std::make_shared<rt::ForwardKernel>(b.cubin, spec, config,
                                                   target.copyBytes);
      h->gpuKernels.emplace(key, kernel);
    }
  }
  kernel->launch(p, args, cuStream);
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
  return int64_t(h->cpuKernels.size() + h->gpuKernels.size());
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
  spec->sparse_block = 128;
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
    void *cuda_stream) {
  (void)cuda_stream;
  return guarded("flashjit_backward", [&] {
    requireHandle(handle);
    AttentionSpec s = toSpec(spec);
    Problem p = toProblem(s, q, k, v, o, scale, window_left, window_right);
    checkLayoutShape(s, p, layout);
    checkSameShape(d_o, "d_o", *o, "o");
    checkSameShape(dq, "dq", *q, "q");
    checkSameShape(dk, "dk", *k, "k");
    checkSameShape(dv, "dv", *v, "v");
    if (!lse)
      invalid("lse is NULL: the backward reads the forward's lse");
    if (handle->device == FLASHJIT_DEVICE_CUDA)
      throw NotImplemented("the GPU backward is not implemented yet (the CPU "
                           "backward is)");
    backwardCpu(handle, s, p, *q, *k, *v, *o, *d_o, lse, *dq, *dk, *dv, layout);
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
    Problem p;
    p.batch = batch;
    p.heads = heads;
    p.seqLenQ = seq_len_q;
    p.seqLenKV = seq_len_kv;
    p.validate(s);
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
