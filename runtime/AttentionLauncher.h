//===- AttentionLauncher.h - Launch a compiled forward kernel ---*- C++ -*-===//
//
/// \file
/// Launches a cubin made by flashjit's GPU pipeline: fills the argument list
/// of kernels/KernelABI.h from device pointers and strides, and takes the
/// grid, block and shared memory from the resources the lowering recorded
/// on each kernel (kernels/KernelLaunch.h). No MLIR here: the compile step
/// is the caller's.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H
#define FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H

#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"
#include "kernels/KernelLaunch.h"
#include "runtime/CudaDriver.h"

#include <array>
#include <initializer_list>
#include <vector>

namespace flashjit::rt {

/// The recorded launch of kernel \p name in \p image; throws RuntimeError
/// (InvalidArgument) when the image does not record it.
const KernelLaunch &recordedLaunch(const KernelImage &image,
                                   const std::string &name);

/// Launches \p function as \p launch says for \p p (grid over \p gqa
/// query heads per KV head); throws SpecError when batch * heads exceeds
/// the grid's y limit.
void launchRecorded(CUfunction function, const KernelLaunch &launch,
                    const Problem &p, int64_t gqa, CUstream stream,
                    void **params);

/// A (B, H, N, d) tensor on the device: pointer and element strides.
struct DeviceTensor {
  CUdeviceptr ptr = 0;
  std::array<int64_t, 4> strides{};
};

/// The device-side arguments of one forward call.
struct ForwardArgs {
  DeviceTensor q, k, v, o;
  CUdeviceptr lse = 0; ///< fp32 [B, H, Nq], packed
  CUdeviceptr counts = 0, indices = 0;
  std::array<int64_t, 3> countStrides{}, indexStrides{};
};

/// The widest global->shared copy (16, 8, 4 or 2 bytes) that the pointers
/// and strides of Q, K and V allow. Part of the compiled variant.
int64_t chooseCopyBytes(const ForwardArgs &args);

/// Throws SpecError unless every tensor's innermost stride is 1 and the
/// tensors allow (\p allowedCopy) the copy width the kernel was compiled
/// for (\p compiledCopy).
void checkDeviceTensors(std::initializer_list<const DeviceTensor *> tensors,
                        int64_t compiledCopy, int64_t allowedCopy);

class ForwardKernel;

/// The buffers of one forward call: what changes from call to call of a
/// PreparedForward.
struct ForwardBuffers {
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, lse = 0;
  CUdeviceptr counts = 0, indices = 0; ///< block-sparse only
};

/// A forward launch of one kernel for one problem, strides and layout
/// shape, prepared once: the checks, the grid, the index arguments, scale
/// * log2(e) and the function's shared memory attribute. launch() only
/// fills in the buffers and calls cuLaunchKernel: no allocation, no
/// string, no lookup, no synchronization (capturable into a CUDA graph).
/// Read-only after construction, so threads may share one.
class PreparedForward {
public:
  /// Checks \p p and \p shape (its strides, layout strides and copy width;
  /// its pointers only for the copy width) as ForwardKernel::launch does,
  /// and raises the function's shared memory limit. Throws SpecError or
  /// RuntimeError. \p kernel must outlive this object.
  PreparedForward(const ForwardKernel &kernel, const Problem &p,
                  const ForwardArgs &shape);

  /// Launches on \p stream in the current context (the kernel's). The
  /// caller checks the buffers (non-null, aligned to copyBytes()).
  void launch(const ForwardBuffers &buffers, CUstream stream) const;

  /// The copy width the kernel was compiled for: q, k and v must be
  /// aligned to it.
  int64_t copyBytes() const { return copy; }
  bool blockSparse() const { return sparse; }
  Dim3 grid() const { return gridDim; }
  Dim3 block() const { return blockDim; }
  unsigned sharedBytes() const { return shared; }

private:
  CUfunction function = nullptr;
  Dim3 gridDim, blockDim;
  unsigned shared = 0;
  int64_t copy = 0;
  bool sparse = false;
  /// Mutable only because cuLaunchKernel takes void **; never written
  /// after construction.
  mutable std::array<int64_t, abi::NumIndexArgs> index{};
  mutable float scaleLog2 = 0;
};

/// A loaded forward kernel.
class ForwardKernel {
public:
  /// Loads \p image; throws RuntimeError (also when it does not record
  /// the forward kernel's launch).
  ForwardKernel(const KernelImage &image, const AttentionSpec &spec,
                int64_t copyBytes);

  /// Launches on \p stream (nullptr: the legacy default stream). Throws
  /// SpecError for bad arguments, RuntimeError for driver errors.
  void launch(const Problem &problem, const ForwardArgs &args,
              CUstream stream) const;

  /// The recorded launch of the kernel.
  const KernelLaunch &recorded() const { return launchOf; }
  int64_t copyBytes() const { return copy; }
  CUfunction cuFunction() const { return function; }
  const AttentionSpec &attentionSpec() const { return spec; }

private:
  Module module;
  CUfunction function = nullptr;
  AttentionSpec spec;
  KernelLaunch launchOf;
  int64_t copy;
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H
