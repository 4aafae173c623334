//===- AttentionLauncher.h - Launch a compiled forward kernel ---*- C++ -*-===//
//
/// \file
/// Launches a cubin made by flashjit's GPU pipeline: fills the argument list
/// of kernels/KernelABI.h from device pointers and strides, and the grid,
/// block and shared memory from kernels/GpuGeometry.h. No MLIR here: the
/// compile step is the caller's.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H
#define FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H

#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "runtime/CudaDriver.h"

#include <array>
#include <initializer_list>
#include <vector>

namespace flashjit::rt {

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
  /// Loads \p cubin; throws RuntimeError.
  ForwardKernel(const std::vector<char> &cubin, const AttentionSpec &spec,
                const TileConfig &config, int64_t copyBytes);

  /// Launches on \p stream (nullptr: the legacy default stream). Throws
  /// SpecError for bad arguments, RuntimeError for driver errors.
  void launch(const Problem &problem, const ForwardArgs &args,
              CUstream stream) const;

  const GpuGeometry &geometry() const { return geo; }
  int64_t copyBytes() const { return copy; }

private:
  Module module;
  CUfunction function = nullptr;
  AttentionSpec spec;
  TileConfig config;
  GpuGeometry geo;
  int64_t copy;
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_ATTENTIONLAUNCHER_H
