//===- BackwardLauncher.h - Launch the compiled GPU backward ----*- C++ -*-===//
//
/// \file
/// Launches the three kernels of a backward cubin (kernels/KernelABI.h,
/// abi::bwd) in stream order: `attention_preprocess` (delta = rowsum(dO *
/// O)), then `attention` (dK, dV: a program per KV block) and
/// `attention_dq` (dQ: a program per Q block, deterministic by
/// construction); with deterministic captured gradients then
/// `attention_capture_grad<c>` for each. Grids, blocks and shared memory come
/// from kernels/GpuGeometry.h (gpuBackwardGeometry). No MLIR here.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_RUNTIME_BACKWARDLAUNCHER_H
#define FLASHJIT_RUNTIME_BACKWARDLAUNCHER_H

#include "runtime/AttentionLauncher.h"

namespace flashjit::rt {

/// The device-side arguments of one backward call.
struct BackwardArgs {
  DeviceTensor q, k, v, o, dO; ///< inputs (dO shaped as o)
  DeviceTensor dq, dk, dv;     ///< outputs (shaped as q, k, v)
  CUdeviceptr lse = 0;         ///< fp32 [B, H, Nq] packed, from the forward
  /// Workspace: fp32 [B, H, Nq] packed (delta), at least
  /// backwardWorkspaceBytes(spec, problem) bytes.
  CUdeviceptr delta = 0;
  /// The forward's BCSR layout (Q-major) and its transpose (KV-major, see
  /// BlockSparseLayout::transposed()); block-sparse specs only.
  CUdeviceptr counts = 0, indices = 0, kvCounts = 0, kvIndices = 0;
  std::array<int64_t, 3> countStrides{}, indexStrides{};
  std::array<int64_t, 3> kvCountStrides{}, kvIndexStrides{};
  /// The score modifier's captured tensors (ForwardArgs::captures), and
  /// the f32 gradient buffers (each its tensor's size, added into) of those
  /// the spec's captureGrads names.
  std::array<CUdeviceptr, abi::kMaxCaptures> captures{}, captureGrads{};
  /// Deterministic captured gradients (abi::bwd::fixedPointCaptureGrads):
  /// each captured tensor's size in elements, and a device workspace of
  /// abi::bwd::captureWordLayout(spec, sizes).bytes for their fixed-point
  /// words, which launch() zeroes in stream order.
  std::array<int64_t, abi::kMaxCaptures> captureSizes{};
  CUdeviceptr captureWords = 0;
  /// Varlen kernels only: the forward's offsets (ForwardArgs::cuSeqQ).
  CUdeviceptr cuSeqQ = 0, cuSeqKV = 0;
};

/// The widest global->shared copy (16, 8, 4 or 2 bytes) that the pointers
/// and strides of Q, K, V and dO allow.
int64_t chooseCopyBytes(const BackwardArgs &args);

/// A loaded backward cubin.
class BackwardKernel {
public:
  /// Loads \p image (compiled from a Direction::Backward spec); throws
  /// RuntimeError (also when it does not record the three kernels'
  /// launches).
  BackwardKernel(const KernelImage &image, const AttentionSpec &spec,
                 int64_t copyBytes);

  /// Launches the three kernels on \p stream. Throws SpecError for bad
  /// arguments, RuntimeError for driver errors.
  void launch(const Problem &problem, const BackwardArgs &args,
              CUstream stream) const;

  int64_t copyBytes() const { return copy; }

private:
  Module module;
  CUfunction preprocess = nullptr, main = nullptr, dq = nullptr;
  KernelLaunch preprocessLaunch, mainLaunch, dqLaunch;
  /// `attention_capture_grad<c>` of each captured gradient summed in fixed
  /// point (null where captured tensor c takes none).
  std::array<CUfunction, abi::kMaxCaptures> captureConvert{};
  KernelLaunch captureConvertLaunch;
  AttentionSpec spec;
  int64_t copy;
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_BACKWARDLAUNCHER_H
