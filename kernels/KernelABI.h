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

#include "kernels/AttentionSpec.h"

#include <array>
#include <cstdint>

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

/// Element strides (b, h, n, d) of Q, K, V, O, and of the layout's counts
/// (b, h, m) and indices (b, h, m); the layout's are zero for a dense kernel.
struct TensorStrides {
  std::array<int64_t, 4> q{}, k{}, v{}, o{};
  std::array<int64_t, 3> counts{}, indices{};
};

/// The index arguments of a forward kernel, in IndexArg order: one place
/// for every launcher (CPU and GPU).
inline std::array<int64_t, NumIndexArgs>
indexArgs(const AttentionSpec &spec, const Problem &p,
          const TensorStrides &s) {
  std::array<int64_t, NumIndexArgs> idx{};
  idx[Batch] = p.batch;
  idx[Heads] = p.heads;
  idx[SeqQ] = p.seqLenQ;
  idx[SeqKV] = p.seqLenKV;
  for (int i = 0; i < 3; ++i) {
    idx[QStrideB + i] = s.q[i];
    idx[KStrideB + i] = s.k[i];
    idx[VStrideB + i] = s.v[i];
    idx[OStrideB + i] = s.o[i];
  }
  auto [left, right] = effectiveWindow(spec, p);
  idx[WindowLeft] = left;
  idx[WindowRight] = right;
  idx[CountsStrideB] = s.counts[0];
  idx[CountsStrideH] = s.counts[1];
  idx[IndicesStrideB] = s.indices[0];
  idx[IndicesStrideH] = s.indices[1];
  idx[IndicesStrideM] = s.indices[2];
  return idx;
}

} // namespace flashjit::abi

#endif // FLASHJIT_KERNELS_KERNELABI_H
