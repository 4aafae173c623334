//===- CApi.cpp - flashjit's C API (tools/capi/flashjit.h) ----------------===//
//
/// \file
/// The C entry points of libflashjit.so. Every function converts the C
/// description into the C++ one (AttentionSpec, Problem, tensors), runs it
/// through the compiler and the runtime, and catches every exception at the
/// boundary: the status says what kind of failure it was, the thread-local
/// message (flashjit_last_error) says what failed.
///
/// The tiling choice lives in ONE function, chooseConfig() (CApiConvert.cpp),
/// so that the autotuner can replace it. Compiled kernels are cached in the
/// handle per (spec, config, copy width, arch, CUDA context); the forward and
/// the backward share the CUDA path's steps (CApiCuda.cpp). Prepared forward
/// calls (flashjit_plan_*) are in CApiPlan.cpp.
//
//===----------------------------------------------------------------------===//

#include "CApiInternal.h"

#include "runtime/Autotuner.h"
#include "runtime/DiskCache.h"
#include "runtime/NvJitLink.h"
#include "tools/engine/KernelProvider.h"

#include <cstdlib>
#include <cstring>

#if defined(FLASHJIT_VERSION) // the project's version, from CMake
#define FLASHJIT_VERSION_STRING FLASHJIT_VERSION
#else
#define FLASHJIT_VERSION_STRING "0.1.0"
#endif

using namespace flashjit;
using namespace flashjit::capi;

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
  spec->varlen = 0;
}

/// The forward calls' body: checks, then the handle's device.
static void runForward(flashjit_handle *handle, const flashjit_spec *spec,
                       const flashjit_tensor *q, const flashjit_tensor *k,
                       const flashjit_tensor *v, const flashjit_tensor *o,
                       float *lse, double scale, int64_t windowLeft,
                       int64_t windowRight, const flashjit_layout *layout,
                       const flashjit_captured *captured, int64_t numCaptured,
                       const flashjit_varlen *varlen, void *cudaStream) {
  requireHandle(handle);
  AttentionSpec s = toSpec(spec);
  s.direction = Direction::Forward; // the pass this call runs
  Problem p = toProblem(s, q, k, v, o, scale, windowLeft, windowRight, varlen);
  checkLayoutShape(s, p, layout);
  checkCaptured(s, captured, numCaptured,
                varlen ? "flashjit_forward_varlen"
                       : "flashjit_forward_captured");
  if (handle->device == FLASHJIT_DEVICE_CPU)
    forwardCpu(handle, s, p, *q, *k, *v, *o, lse, layout, captured, varlen);
  else
    forwardCuda(handle, s, p, *q, *k, *v, *o, lse, layout, captured, varlen,
                cudaStream);
}

/// The gradients asked for (a non-NULL grad) become \p s's capture_grads,
/// part of the kernel; their tensors' sizes (the others' 0), which the
/// deterministic words need. A grad for a mask_mod's captured tensor is a
/// named error (a predicate's input takes no gradient).
static std::array<int64_t, abi::kMaxCaptures>
askCaptureGrads(AttentionSpec &s, const flashjit_captured *captured,
                int64_t numCaptured) {
  std::array<int64_t, abi::kMaxCaptures> sizes{};
  for (int64_t c = 0; c < numCaptured && c < abi::kMaxCaptures; ++c) {
    if (!captured[c].grad)
      continue;
    if (c >= s.captures - s.maskCaptures)
      invalid(fmt::format("captured[{}].grad: that tensor is spec.mask_mod's, "
                          "read by a predicate: it takes no gradient (pass "
                          "NULL)",
                          c));
    s.captureGrads |= int64_t(1) << c;
    sizes[size_t(c)] = captured[c].size;
  }
  return sizes;
}

/// The backward calls' body: checks, then the handle's device.
static void runBackward(flashjit_handle *handle, const flashjit_spec *spec,
                        const flashjit_tensor *q, const flashjit_tensor *k,
                        const flashjit_tensor *v, const flashjit_tensor *o,
                        const flashjit_tensor *d_o, const float *lse,
                        const flashjit_tensor *dq, const flashjit_tensor *dk,
                        const flashjit_tensor *dv, double scale,
                        int64_t windowLeft, int64_t windowRight,
                        const flashjit_layout *layout,
                        const flashjit_layout *kvLayout, void *workspace,
                        size_t workspaceBytes,
                        const flashjit_captured *captured, int64_t numCaptured,
                        const flashjit_varlen *varlen, void *cudaStream) {
  requireHandle(handle);
  AttentionSpec s = toSpec(spec);   // as the forward's: the callees derive
  s.direction = Direction::Forward; // the backward spec from it
  Problem p = toProblem(s, q, k, v, o, scale, windowLeft, windowRight, varlen);
  checkLayoutShape(s, p, layout);
  checkKvLayoutShape(layout, kvLayout);
  checkSameShape(d_o, "d_o", *o, "o");
  checkSameShape(dq, "dq", *q, "q");
  checkSameShape(dk, "dk", *k, "k");
  checkSameShape(dv, "dv", *v, "v");
  if (!lse)
    invalid("lse is NULL: the backward reads the forward's lse");
  checkCaptured(s, captured, numCaptured,
                varlen ? "flashjit_backward_varlen"
                       : "flashjit_backward_captured");
  // Deterministic: the gradients are summed in fixed point, in words that
  // the workspace holds (flashjit_backward_captured_workspace_size).
  WorkspaceLayout w =
      workspaceLayout(s, p, askCaptureGrads(s, captured, numCaptured).data());
  checkWorkspace(workspace, workspaceBytes, w);
  if (handle->device == FLASHJIT_DEVICE_CUDA)
    backwardCuda(handle, s, p, *q, *k, *v, *o, *d_o, lse, *dq, *dk, *dv, layout,
                 kvLayout, workspace, w, captured, varlen, cudaStream);
  else
    backwardCpu(handle, s, p, *q, *k, *v, *o, *d_o, lse, *dq, *dk, *dv, layout,
                kvLayout, captured, varlen);
}

FLASHJIT_API flashjit_status
flashjit_forward(flashjit_handle *handle, const flashjit_spec *spec,
                 const flashjit_tensor *q, const flashjit_tensor *k,
                 const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
                 double scale, int64_t window_left, int64_t window_right,
                 const flashjit_layout *layout, void *cuda_stream) {
  return flashjit_forward_captured(handle, spec, q, k, v, o, lse, scale,
                                   window_left, window_right, layout, nullptr,
                                   0, cuda_stream);
}

FLASHJIT_API flashjit_status flashjit_forward_captured(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_layout *layout, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream) {
  return guarded("flashjit_forward", [&] {
    runForward(handle, spec, q, k, v, o, lse, scale, window_left, window_right,
               layout, captured, num_captured, nullptr, cuda_stream);
  });
}

/// flashjit_mask_blocks(_varlen)'s body after the entry point's own checks:
/// the problem of \p batch x \p heads x \p seqQ x \p seqKV (varlen: the
/// sequences and the longest), \p layout checked and written on the
/// handle's device.
static void classifyMaskBlocks(const char *fn, flashjit_handle *handle,
                               const AttentionSpec &s, int64_t batch,
                               int64_t heads, int64_t seqQ, int64_t seqKV,
                               const flashjit_layout *layout,
                               const flashjit_captured *captured,
                               int64_t numCaptured,
                               const flashjit_varlen *varlen, void *stream) {
  Problem p = sizedProblem(s, batch, heads, seqQ, seqKV);
  checkLayoutShape(s, p, layout);
  if (!layout->counts || !layout->indices)
    invalid(fmt::format("{}: layout->counts and layout->indices are "
                        "written: both must be given",
                        fn));
  checkMaskBlocksArgs(s, p, layout->batch, layout->heads);
  checkCaptured(s, captured, numCaptured, fn);
  if (handle->device == FLASHJIT_DEVICE_CPU)
    maskBlocksCpu(handle, s, p, *layout, captured, varlen);
  else
    maskBlocksCuda(handle, s, p, *layout, captured, varlen, stream);
}

FLASHJIT_API flashjit_status flashjit_mask_blocks(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_q, int64_t seq_kv, const flashjit_layout *layout,
    const flashjit_captured *captured, int64_t num_captured,
    void *cuda_stream) {
  return guarded("flashjit_mask_blocks", [&] {
    requireHandle(handle);
    AttentionSpec s = toSpec(spec);
    if (s.direction != Direction::Forward)
      invalid("flashjit_mask_blocks: spec->direction must be forward (the "
              "layout serves both passes)");
    if (s.varlen)
      invalid("flashjit_mask_blocks: a varlen spec's layout is "
              "flashjit_mask_blocks_varlen's (it takes the sequences)");
    classifyMaskBlocks("flashjit_mask_blocks", handle, s, batch, heads, seq_q,
                       seq_kv, layout, captured, num_captured, nullptr,
                       cuda_stream);
  });
}

FLASHJIT_API flashjit_status flashjit_mask_blocks_varlen(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t heads,
    const flashjit_varlen *varlen, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream) {
  return guarded("flashjit_mask_blocks_varlen", [&] {
    requireHandle(handle);
    AttentionSpec s = toSpec(spec);
    if (s.direction != Direction::Forward || !s.varlen)
      invalid("flashjit_mask_blocks_varlen: spec->direction must be forward "
              "and spec->varlen set (flashjit_mask_blocks takes the others)");
    if (!varlen || !varlen->cu_seqlens_q || !varlen->cu_seqlens_kv)
      invalid("flashjit_mask_blocks_varlen: varlen and its cu_seqlens_q and "
              "cu_seqlens_kv must not be NULL");
    if (!varlen->layout)
      invalid("flashjit_mask_blocks_varlen: varlen->layout is NULL: it is "
              "the layout the call writes");
    classifyMaskBlocks("flashjit_mask_blocks_varlen", handle, s, varlen->batch,
                       heads, varlen->max_seqlen_q, varlen->max_seqlen_kv,
                       varlen->layout, captured, num_captured, varlen,
                       cuda_stream);
  });
}

FLASHJIT_API flashjit_status flashjit_forward_varlen(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o, float *lse,
    double scale, int64_t window_left, int64_t window_right,
    const flashjit_varlen *varlen, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream) {
  return guarded("flashjit_forward_varlen", [&] {
    if (!varlen)
      invalid("varlen is NULL: flashjit_forward_varlen takes the sequences' "
              "offsets");
    runForward(handle, spec, q, k, v, o, lse, scale, window_left, window_right,
               varlen->layout, captured, num_captured, varlen, cuda_stream);
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
  return flashjit_backward_captured(handle, spec, q, k, v, o, d_o, lse, dq, dk,
                                    dv, scale, window_left, window_right,
                                    layout, workspace, workspace_bytes, nullptr,
                                    0, cuda_stream);
}

FLASHJIT_API flashjit_status flashjit_backward_captured(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_layout *layout,
    void *workspace, size_t workspace_bytes, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream) {
  return guarded("flashjit_backward", [&] {
    runBackward(handle, spec, q, k, v, o, d_o, lse, dq, dk, dv, scale,
                window_left, window_right, layout, nullptr, workspace,
                workspace_bytes, captured, num_captured, nullptr, cuda_stream);
  });
}

FLASHJIT_API flashjit_status flashjit_backward_kv_major(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_layout *layout,
    const flashjit_layout *kv_layout, void *workspace, size_t workspace_bytes,
    const flashjit_captured *captured, int64_t num_captured,
    void *cuda_stream) {
  return guarded("flashjit_backward_kv_major", [&] {
    if (!kv_layout)
      invalid("kv_layout is NULL: flashjit_backward_kv_major takes the "
              "layout's KV-major transpose (flashjit_backward_captured "
              "makes it on the host)");
    runBackward(handle, spec, q, k, v, o, d_o, lse, dq, dk, dv, scale,
                window_left, window_right, layout, kv_layout, workspace,
                workspace_bytes, captured, num_captured, nullptr, cuda_stream);
  });
}

FLASHJIT_API flashjit_status flashjit_backward_varlen(
    flashjit_handle *handle, const flashjit_spec *spec,
    const flashjit_tensor *q, const flashjit_tensor *k,
    const flashjit_tensor *v, const flashjit_tensor *o,
    const flashjit_tensor *d_o, const float *lse, const flashjit_tensor *dq,
    const flashjit_tensor *dk, const flashjit_tensor *dv, double scale,
    int64_t window_left, int64_t window_right, const flashjit_varlen *varlen,
    void *workspace, size_t workspace_bytes, const flashjit_captured *captured,
    int64_t num_captured, void *cuda_stream) {
  return guarded("flashjit_backward_varlen", [&] {
    if (!varlen)
      invalid("varlen is NULL: flashjit_backward_varlen takes the forward's "
              "sequence offsets");
    runBackward(handle, spec, q, k, v, o, d_o, lse, dq, dk, dv, scale,
                window_left, window_right, varlen->layout, varlen->kv_layout,
                workspace, workspace_bytes, captured, num_captured, varlen,
                cuda_stream);
  });
}

/// The two workspace-size entry points' body: with \p withCaptured (the
/// captured variant) \p captured, \p numCaptured of them (the spec's
/// count), whose non-NULL grads and sizes decide the deterministic words.
static void backwardWorkspaceSize(flashjit_handle *handle,
                                  const flashjit_spec *spec, int64_t batch,
                                  int64_t heads, int64_t seqQ, int64_t seqKV,
                                  bool withCaptured,
                                  const flashjit_captured *captured,
                                  int64_t numCaptured, size_t *bytes) {
  requireHandle(handle);
  if (!bytes)
    invalid("bytes is NULL");
  *bytes = 0;
  AttentionSpec s = toSpec(spec);
  Problem p = sizedProblem(s, batch, heads, seqQ, seqKV);
  std::array<int64_t, abi::kMaxCaptures> sizes{};
  if (withCaptured) {
    if (numCaptured != s.captures)
      invalid(fmt::format("num_captured is {}, the spec's regions capture {}",
                          numCaptured, s.captures));
    if (numCaptured > 0 && !captured)
      invalid("captured is NULL");
    sizes = askCaptureGrads(s, captured, numCaptured);
  }
  *bytes = workspaceLayout(s, p, sizes.data()).total;
}

FLASHJIT_API flashjit_status flashjit_backward_workspace_size(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_len_q, int64_t seq_len_kv, size_t *bytes) {
  return guarded("flashjit_backward_workspace_size", [&] {
    backwardWorkspaceSize(handle, spec, batch, heads, seq_len_q, seq_len_kv,
                          false, nullptr, 0, bytes);
  });
}

FLASHJIT_API flashjit_status flashjit_backward_captured_workspace_size(
    flashjit_handle *handle, const flashjit_spec *spec, int64_t batch,
    int64_t heads, int64_t seq_len_q, int64_t seq_len_kv,
    const flashjit_captured *captured, int64_t num_captured, size_t *bytes) {
  return guarded("flashjit_backward_captured_workspace_size", [&] {
    backwardWorkspaceSize(handle, spec, batch, heads, seq_len_q, seq_len_kv,
                          true, captured, num_captured, bytes);
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
