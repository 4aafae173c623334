//===- CApiCuda.cpp - The C API's CUDA path
//--------------------------------===//
//
/// \file
/// A CUDA handle's forward and backward: the device and context of the
/// call, its tile config (the handle's memory, the disk cache, a first
/// call's tuning, or the heuristic), its loaded kernel (the handle's
/// memory, the disk cache, or a compile), the backward's workspace.
//
//===----------------------------------------------------------------------===//

#include "CApiInternal.h"

#include "runtime/Autotuner.h"
#include "runtime/DiskCache.h"
#include "tools/engine/KernelProvider.h"

#include <algorithm>
#include <array>
#include <cstdlib>

namespace flashjit::capi {

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

static rt::DeviceTensor deviceTensor(const flashjit_tensor &t) {
  rt::DeviceTensor d;
  d.ptr = devicePtr(t.data);
  for (int i = 0; i < 4; ++i)
    d.strides[i] = t.strides[i];
  return d;
}

/// A caller's layout (device pointers; Q-major, or a KV-major transpose)
/// as kernel arguments: its arrays and their element strides.
static void layoutArgs(const flashjit_layout &layout, CUdeviceptr &counts,
                       CUdeviceptr &indices,
                       std::array<int64_t, 3> &countStrides,
                       std::array<int64_t, 3> &indexStrides) {
  BlockSparseLayout shape = layoutShape(layout);
  counts = devicePtr(layout.counts);
  indices = devicePtr(layout.indices);
  countStrides = shape.countStrides();
  indexStrides = shape.indexStrides();
}

/// The caller's layout as kernel arguments of a forward or a backward
/// (rt::ForwardArgs, rt::BackwardArgs); nothing when dense.
template <typename Args>
static void setLayoutArgs(Args &args, const flashjit_layout *layout) {
  if (layout)
    layoutArgs(*layout, args.counts, args.indices, args.countStrides,
               args.indexStrides);
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
static TileConfig lookUpGpuConfig(flashjit_handle *h, const AttentionSpec &spec,
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
static TileConfig chooseGpuConfig(flashjit_handle *h, const AttentionSpec &spec,
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
static std::shared_ptr<Kernel>
gpuKernel(flashjit_handle *h,
          std::map<std::string, std::shared_ptr<Kernel>> &kernels,
          const AttentionSpec &spec, const TileConfig &config,
          const GpuTarget &target, CUcontext context) {
  std::string key = engine::loadedKernelKey(spec, config, target.copyBytes,
                                            target.arch, context);
  std::lock_guard<std::mutex> lock(h->mutex);
  auto it = kernels.find(key);
  if (it != kernels.end())
    return it->second;
  rt::DiskCache cache;
  engine::CubinBuild b = engine::buildCubin(spec, config, target, cache);
  std::shared_ptr<Kernel> kernel;
  if constexpr (std::is_same_v<Kernel, rt::ForwardKernel>)
    kernel = std::make_shared<Kernel>(b.image, spec, target.copyBytes, config);
  else
    kernel = std::make_shared<Kernel>(b.image, spec, target.copyBytes);
  kernels.emplace(key, kernel);
  return kernel;
}

rt::ForwardArgs forwardArgs(const flashjit_tensor &q, const flashjit_tensor &k,
                            const flashjit_tensor &v, const flashjit_tensor &o,
                            float *lse, const flashjit_layout *layout) {
  rt::ForwardArgs args;
  args.q = deviceTensor(q);
  args.k = deviceTensor(k);
  args.v = deviceTensor(v);
  args.o = deviceTensor(o);
  args.lse = devicePtr(lse);
  setLayoutArgs(args, layout);
  return args;
}

std::shared_ptr<rt::ForwardKernel>
forwardKernelFor(flashjit_handle *h, const AttentionSpec &spec,
                 const Problem &p, CUcontext context,
                 const rt::DeviceInfo &info, const rt::ForwardArgs &args,
                 CUstream stream, TileConfig *config) {
  GpuTarget target = gpuTarget(info, rt::chooseCopyBytes(args));
  TileConfig c = chooseGpuConfig(h, spec, p, info, target, stream, &args);
  if (config)
    *config = c;
  return gpuKernel(h, h->gpuKernels, spec, c, target, context);
}

void forwardCuda(flashjit_handle *h, const AttentionSpec &spec,
                 const Problem &p, const flashjit_tensor &q,
                 const flashjit_tensor &k, const flashjit_tensor &v,
                 const flashjit_tensor &o, float *lse,
                 const flashjit_layout *layout,
                 const flashjit_captured *captured,
                 const flashjit_varlen *varlen, void *stream) {
  if (!lse)
    invalid("lse is NULL: on CUDA the kernel always writes lse (fp32 "
            "[B, H, Nq])");
  auto [context, info] = currentDevice(h);
  rt::ForwardArgs args = forwardArgs(q, k, v, o, lse, layout);
  for (int64_t c = 0; c < spec.captures; ++c)
    args.captures[size_t(c)] = devicePtr(captured[c].data);
  if (varlen) {
    args.cuSeqQ = devicePtr(varlen->cu_seqlens_q);
    args.cuSeqKV = devicePtr(varlen->cu_seqlens_kv);
  }
  CUstream cuStream = static_cast<CUstream>(stream);
  forwardKernelFor(h, spec, p, context, info, args, cuStream)
      ->launch(p, args, cuStream);
}

void maskBlocksCuda(flashjit_handle *h, const AttentionSpec &spec,
                    const Problem &p, const flashjit_layout &layout,
                    const flashjit_captured *captured,
                    const flashjit_varlen *varlen, void *stream) {
  auto [context, info] = currentDevice(h);
  CUstream cuStream = static_cast<CUstream>(stream);
  // The forward's kernel for 16-byte copies: the one an aligned forward of
  // the same spec and problem loads, so a later forward finds it compiled.
  GpuTarget target = gpuTarget(info, 16);
  TileConfig config =
      chooseGpuConfig(h, spec, p, info, target, cuStream, nullptr);
  std::array<CUdeviceptr, abi::kMaxCaptures> captures{};
  for (int64_t c = 0; c < spec.captures; ++c)
    captures[size_t(c)] = devicePtr(captured[c].data);
  gpuKernel(h, h->gpuKernels, spec, config, target, context)
      ->classifyBlocks(p, layout.batch, layout.heads, devicePtr(layout.counts),
                       devicePtr(layout.indices), captures, cuStream,
                       varlen ? devicePtr(varlen->cu_seqlens_q) : 0,
                       varlen ? devicePtr(varlen->cu_seqlens_kv) : 0);
}

/// Runs \p launch(base) on the handle's workspace of at least \p bytes in
/// \p context (grown if needed), in stream order with every other call that
/// uses it: \p stream first waits, on the device, for the work the previous
/// user queued (on any stream), and the work \p launch queues on \p stream
/// is what the next user waits for. Growing waits on the host for the last
/// use before the old buffer is freed.
template <typename LaunchFn>
static void withLibraryWorkspace(flashjit_handle *h, CUcontext context,
                                 size_t bytes, CUstream stream,
                                 LaunchFn launch) {
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
static void uploadLayoutAndWait(const BlockSparseLayout &l, CUdeviceptr counts,
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
                  const flashjit_layout *layout,
                  const flashjit_layout *kvLayout, void *workspace,
                  const WorkspaceLayout &w, const flashjit_captured *captured,
                  const flashjit_varlen *varlen, void *stream) {
  auto [context, info] = currentDevice(h);
  CUstream cuStream = static_cast<CUstream>(stream);
  bool capturing = rt::isStreamCapturing(cuStream);
  if (capturing && layout && !kvLayout)
    invalid("the stream is being captured into a CUDA graph, and a "
            "block-sparse backward reads the layout on the host "
            "(synchronizing the stream): run it outside the capture, or "
            "give the layout's transpose (flashjit_backward_kv_major)");
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
  if (varlen) {
    args.cuSeqQ = devicePtr(varlen->cu_seqlens_q);
    args.cuSeqKV = devicePtr(varlen->cu_seqlens_kv);
  }
  setLayoutArgs(args, layout);
  for (int64_t c = 0; c < spec.captures; ++c) {
    args.captures[size_t(c)] = devicePtr(captured[c].data);
    args.captureGrads[size_t(c)] = devicePtr(captured[c].grad);
    args.captureSizes[size_t(c)] = captured[c].size;
  }
  GpuTarget target = gpuTarget(info, rt::chooseCopyBytes(args));
  TileConfig config =
      chooseGpuConfig(h, spec, p, info, target, cuStream, nullptr);
  std::shared_ptr<rt::BackwardKernel> kernel =
      gpuKernel(h, h->gpuBwdKernels, spec, config, target, context);

  // Block-sparse: the KV-major transpose of the caller's layout, the
  // caller's (kvLayout, on the device: read by the kernels alone), else
  // made on the host after the work queued before this call (the layout's
  // writes) ran.
  std::unique_ptr<BlockSparseLayout> kvMajor;
  if (kvLayout) {
    layoutArgs(*kvLayout, args.kvCounts, args.kvIndices, args.kvCountStrides,
               args.kvIndexStrides);
  } else if (layout) {
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
    if (abi::bwd::fixedPointCaptureGrads(spec))
      args.captureWords = base + w.captureWords;
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

} // namespace flashjit::capi
