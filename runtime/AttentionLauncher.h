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

private:
  Module module;
  CUfunction function = nullptr;
  AttentionSpec spec;
  KernelLaunch launchOf;
  int64_t copy;
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H
