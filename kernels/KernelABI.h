//===- KernelABI.h - The argument list of a compiled kernel -----*- C++ -*-===//
//
/// \file
/// The tiling pass creates, and the CPU and GPU launchers fill, one argument
/// list for every forward kernel, dense or block-sparse:
///
///   buffers:  q, k, v, o (element type), lse (f32), counts, indices (i32)
///   indices:  the IndexArg values below, in order
///   f32:      scale * log2(e)
///   indices:  pid_m (Q block), pid_bh (batch * heads + head)
///
/// A dense kernel ignores the counts and indices buffers and their strides.
/// Strides are in elements. Plain C++, shared by compiler and runtime.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_KERNELABI_H
#define FLASHJIT_KERNELS_KERNELABI_H

namespace flashjit::abi {

enum Buffer : int { Q, K, V, O, Lse, Counts, Indices, NumBuffers };

enum IndexArg : int {
  Batch,
  Heads,
  SeqQ,
  SeqKV,
  QStrideB,
  QStrideH,
  QStrideN,
  KStrideB,
  KStrideH,
  KStrideN,
  VStrideB,
  VStrideH,
  VStrideN,
  OStrideB,
  OStrideH,
  OStrideN,
  WindowLeft,
  WindowRight,
  CountsStrideB,
  CountsStrideH,
  IndicesStrideB,
  IndicesStrideH,
  IndicesStrideM,
  NumIndexArgs
};

/// Argument names, in order, as the tiled IR names them.
inline const char *bufferName(int i) {
  static const char *names[] = {"q", "k", "v", "o", "lse", "counts", "indices"};
  return names[i];
}
inline const char *indexArgName(int i) {
  static const char *names[] = {
      "batch",    "heads",    "seq_q",     "seq_kv",    "q_sb",
      "q_sh",     "q_sn",     "k_sb",      "k_sh",      "k_sn",
      "v_sb",     "v_sh",     "v_sn",      "o_sb",      "o_sh",
      "o_sn",     "win_left", "win_right", "counts_sb", "counts_sh",
      "indices_sb", "indices_sh", "indices_sm"};
  return names[i];
}

} // namespace flashjit::abi

#endif // FLASHJIT_KERNELS_KERNELABI_H
