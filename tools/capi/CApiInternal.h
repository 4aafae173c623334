//===- CApiInternal.h - What the C API's source files share -----*- C++ -*-===//
//
/// \file
/// The pieces of libflashjit.so's C API (tools/capi/flashjit.h) that its
/// source files share: the handle, the exception-to-status boundary, the
/// conversion and checking of the C description (CApiConvert.cpp), the CPU
/// execution mode (CApiCpu.cpp), the CUDA path's steps (CApiCuda.cpp). The
/// entry points are in CApi.cpp and, for prepared forward calls,
/// CApiPlan.cpp.
///
/// Nothing here is exported: the version script (tools/flashjit.map) keeps
/// only the flashjit_* C symbols visible.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_CAPI_CAPIINTERNAL_H
#define FLASHJIT_TOOLS_CAPI_CAPIINTERNAL_H

#include "flashjit.h"

#include "compiler/Compiler.h"
#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"
#include "runtime/AttentionLauncher.h"
#include "runtime/BackwardLauncher.h"
#include "runtime/CudaDriver.h"
#include "runtime/Error.h"

#include <fmt/format.h>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>

struct flashjit_handle {
  int device = FLASHJIT_DEVICE_CPU;
  /// The device whose primary context is used when none is current.
  int cudaOrdinal = 0;
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<flashjit::CpuKernel>> cpuKernels;
  std::map<std::string, std::shared_ptr<flashjit::CpuBackwardKernel>>
      cpuBwdKernels;
  std::map<std::string, std::shared_ptr<flashjit::rt::ForwardKernel>>
      gpuKernels;
  std::map<std::string, std::shared_ptr<flashjit::rt::BackwardKernel>>
      gpuBwdKernels;
  std::map<int, flashjit::rt::DeviceInfo> devices;
  /// Tile configs per (spec, problem class, device): tuned, loaded from the
  /// disk cache, or (FLASHJIT_AUTOTUNE=0, and the backward) the heuristic.
  std::map<std::string, flashjit::TileConfig> gpuConfigs;

  /// The backward's workspace when the caller passes none, per CUDA
  /// context: used in stream order through \c lastUse (see
  /// withLibraryWorkspace in CApiCuda.cpp).
  struct Workspace {
    flashjit::rt::DeviceBuffer buffer;
    /// Recorded after each call's kernels; every call waits on it first.
    std::optional<flashjit::rt::Event> lastUse;
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

namespace flashjit::capi {

//===----------------------------------------------------------------------===//
// The boundary
//===----------------------------------------------------------------------===//

/// The message flashjit_last_error() returns on this thread.
inline thread_local std::string lastError;

/// Records "fn: what" as the thread's last error and returns \p s.
flashjit_status fail(const char *fn, flashjit_status s,
                     const std::string &what);

/// Runs \p body, turning every exception into a status and a message.
template <typename Body> flashjit_status guarded(const char *fn, Body body) {
  try {
    body();
    return FLASHJIT_OK;
  } catch (const rt::RuntimeError &e) {
    switch (e.code()) {
    case rt::ErrorCode::NoDriver:
      return fail(fn, FLASHJIT_ERROR_NO_DRIVER, e.what());
    case rt::ErrorCode::DriverError:
      return fail(fn, FLASHJIT_ERROR_CUDA, e.what());
    case rt::ErrorCode::NvJitLinkError:
      return fail(fn, FLASHJIT_ERROR_COMPILE, e.what());
    case rt::ErrorCode::InvalidArgument:
      return fail(fn, FLASHJIT_ERROR_INVALID_ARGUMENT, e.what());
    }
    return fail(fn, FLASHJIT_ERROR_INTERNAL, e.what());
  } catch (const CompileError &e) {
    return fail(fn, FLASHJIT_ERROR_COMPILE, e.what());
  } catch (const SpecError &e) {
    return fail(fn, FLASHJIT_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc &) {
    return fail(fn, FLASHJIT_ERROR_INTERNAL, "out of host memory");
  } catch (const std::exception &e) {
    return fail(fn, FLASHJIT_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(fn, FLASHJIT_ERROR_INTERNAL, "unknown exception");
  }
}

/// Throws the SpecError that becomes FLASHJIT_ERROR_INVALID_ARGUMENT.
[[noreturn]] void invalid(const std::string &message);

void requireHandle(const flashjit_handle *h);

//===----------------------------------------------------------------------===//
// The tiling choice and the C description (CApiConvert.cpp)
//===----------------------------------------------------------------------===//

/// THE config choice of the C API (see CApiConvert.cpp); \p gpu is null for
/// the CPU execution mode.
TileConfig chooseConfig(const AttentionSpec &spec, const Problem &problem,
                        const rt::DeviceInfo *gpu);

/// The checked C++ spec of \p s (named errors for every bad field).
AttentionSpec toSpec(const flashjit_spec *s);

/// Checks one tensor: non-null data, positive shape, innermost stride 1,
/// its reach below 2^47.
void checkTensor(const flashjit_tensor *t, const char *what);

/// Checks the four tensors against the spec and each other and returns the
/// problem they describe; with \p varlen (required iff spec.varlen) the
/// batch and the longest sequences are its, the tensors one packed batch.
Problem toProblem(const AttentionSpec &spec, const flashjit_tensor *q,
                  const flashjit_tensor *k, const flashjit_tensor *v,
                  const flashjit_tensor *o, double scale, int64_t windowLeft,
                  int64_t windowRight, const flashjit_varlen *varlen = nullptr);

/// Checks the layout's presence and dimensions (not its contents).
void checkLayoutShape(const AttentionSpec &spec, const Problem &p,
                      const flashjit_layout *layout);

/// Checks that \p captured gives spec.captures tensors (flashjit_captured:
/// data not NULL, 1 <= size <= 2^40); a call that gives none is told to use
/// \p capturedCall.
void checkCaptured(const AttentionSpec &spec, const flashjit_captured *captured,
                   int64_t count, const char *capturedCall);

/// Checks a caller's KV-major transpose of \p layout (null: none given)
/// for presence and dimensions: layout's batch and heads, its block counts
/// swapped (flashjit_backward_kv_major).
void checkKvLayoutShape(const flashjit_layout *layout,
                        const flashjit_layout *kvLayout);

/// \p l's dimensions (no contents).
BlockSparseLayout layoutShape(const flashjit_layout &l);

/// The problem of a size query (no tensors): \p spec at these sizes.
Problem sizedProblem(const AttentionSpec &spec, int64_t batch, int64_t heads,
                     int64_t seqLenQ, int64_t seqLenKV);

/// \p t must have \p like's shape (the gradient of a tensor is shaped as it).
void checkSameShape(const flashjit_tensor *t, const char *what,
                    const flashjit_tensor &like, const char *likeName);

/// Where the parts of the backward's workspace lie, in bytes from its start.
struct WorkspaceLayout {
  /// backwardWorkspaceBytes(): delta and -lse log2(e), then dq_accum for
  /// atomic dQ.
  size_t delta = 0;
  /// Block-sparse: the layout's KV-major transpose (int32 counts [B, H,
  /// KVb], indices [B, H, KVb, Qb]), each 256-byte aligned.
  size_t kvCounts = 0, kvIndices = 0;
  /// Deterministic captured gradients (abi::bwd::fixedPointCaptureGrads):
  /// their fixed-point words (abi::bwd::captureWordLayout), 256-byte
  /// aligned.
  size_t captureWords = 0;
  size_t total = 0;
};

/// \p captureSizes: each captured tensor's elements, needed (and read)
/// only when the spec's captured gradients are summed in fixed point.
WorkspaceLayout workspaceLayout(const AttentionSpec &spec, const Problem &p,
                                const int64_t *captureSizes = nullptr);

/// Checks a caller's workspace (NULL and 0: the library's) against \p w.
void checkWorkspace(const void *workspace, size_t bytes,
                    const WorkspaceLayout &w);

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

//===----------------------------------------------------------------------===//
// The CPU execution mode (CApiCpu.cpp)
//===----------------------------------------------------------------------===//

/// The handle's compiled CPU forward kernel of (spec, config), compiled on
/// first use.
std::shared_ptr<CpuKernel> cpuKernel(flashjit_handle *h,
                                     const AttentionSpec &spec,
                                     const TileConfig &config);

/// hostLayout() of a CPU call: the layout in host memory.
std::unique_ptr<BlockSparseLayout> hostLayout(const flashjit_layout *layout,
                                              const Problem &p,
                                              int64_t sparseBlock);

/// Runs \p kernel on host tensors (any strides; \p bcsr null when dense)
/// and writes o and, if not null, lse.
void runCpuForward(const CpuKernel &kernel, const Problem &p,
                   const flashjit_tensor &q, const flashjit_tensor &k,
                   const flashjit_tensor &v, const flashjit_tensor &o,
                   float *lse, const BlockSparseLayout *bcsr,
                   Captures captures = {},
                   const flashjit_varlen *varlen = nullptr);

/// \p captured (spec.captures of them; checkCaptured) as host data.
Captures hostCaptures(const AttentionSpec &spec,
                      const flashjit_captured *captured);

void forwardCpu(flashjit_handle *h, const AttentionSpec &spec, const Problem &p,
                const flashjit_tensor &q, const flashjit_tensor &k,
                const flashjit_tensor &v, const flashjit_tensor &o, float *lse,
                const flashjit_layout *layout,
                const flashjit_captured *captured = nullptr,
                const flashjit_varlen *varlen = nullptr);

void backwardCpu(flashjit_handle *h, const AttentionSpec &forwardSpec,
                 const Problem &p, const flashjit_tensor &q,
                 const flashjit_tensor &k, const flashjit_tensor &v,
                 const flashjit_tensor &o, const flashjit_tensor &dO,
                 const float *lse, const flashjit_tensor &dq,
                 const flashjit_tensor &dk, const flashjit_tensor &dv,
                 const flashjit_layout *layout, const flashjit_layout *kvLayout,
                 const flashjit_captured *captured,
                 const flashjit_varlen *varlen);

//===----------------------------------------------------------------------===//
// CUDA (CApiCuda.cpp)
//===----------------------------------------------------------------------===//

/// Makes a context current (the caller's, else the primary context of the
/// handle's device) and returns it and its device's description.
std::pair<CUcontext, rt::DeviceInfo> currentDevice(flashjit_handle *h);

inline CUdeviceptr devicePtr(const void *p) {
  return CUdeviceptr(reinterpret_cast<uintptr_t>(p));
}

/// The forward's device arguments of a call (its layout's too).
rt::ForwardArgs forwardArgs(const flashjit_tensor &q, const flashjit_tensor &k,
                            const flashjit_tensor &v, const flashjit_tensor &o,
                            float *lse, const flashjit_layout *layout);

/// What a call compiles for: the device's arch and driver, \p copyBytes.
GpuTarget gpuTarget(const rt::DeviceInfo &info, int64_t copyBytes);

/// The loaded forward kernel a call of (spec, problem) with \p args on
/// \p stream uses in \p context: its config (tuned, cached or the
/// heuristic; a first call may tune on \p args) and its kernel (the
/// handle's memory, the disk cache, or a compile). \p config receives the
/// config.
std::shared_ptr<rt::ForwardKernel>
forwardKernelFor(flashjit_handle *h, const AttentionSpec &spec,
                 const Problem &p, CUcontext context,
                 const rt::DeviceInfo &info, const rt::ForwardArgs &args,
                 CUstream stream, TileConfig *config = nullptr);

/// flashjit_mask_blocks(_varlen) on the CPU: the classification of
/// \p spec's CPU kernel copied into the host arrays of \p layout (\p varlen:
/// the sequences of a varlen spec, else null).
void maskBlocksCpu(flashjit_handle *h, const AttentionSpec &spec,
                   const Problem &p, const flashjit_layout &layout,
                   const flashjit_captured *captured,
                   const flashjit_varlen *varlen);

/// flashjit_mask_blocks(_varlen) on CUDA: the classification of \p spec's
/// kernel (checked arguments) into the device arrays of \p layout.
void maskBlocksCuda(flashjit_handle *h, const AttentionSpec &spec,
                    const Problem &p, const flashjit_layout &layout,
                    const flashjit_captured *captured,
                    const flashjit_varlen *varlen, void *stream);

void forwardCuda(flashjit_handle *h, const AttentionSpec &spec,
                 const Problem &p, const flashjit_tensor &q,
                 const flashjit_tensor &k, const flashjit_tensor &v,
                 const flashjit_tensor &o, float *lse,
                 const flashjit_layout *layout,
                 const flashjit_captured *captured,
                 const flashjit_varlen *varlen, void *stream);

void backwardCuda(flashjit_handle *h, const AttentionSpec &forwardSpec,
                  const Problem &p, const flashjit_tensor &q,
                  const flashjit_tensor &k, const flashjit_tensor &v,
                  const flashjit_tensor &o, const flashjit_tensor &dO,
                  const float *lse, const flashjit_tensor &dq,
                  const flashjit_tensor &dk, const flashjit_tensor &dv,
                  const flashjit_layout *layout,
                  const flashjit_layout *kvLayout, void *workspace,
                  const WorkspaceLayout &w, const flashjit_captured *captured,
                  const flashjit_varlen *varlen, void *stream);

} // namespace flashjit::capi

#endif // FLASHJIT_TOOLS_CAPI_CAPIINTERNAL_H
