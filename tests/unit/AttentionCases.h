//===- AttentionCases.h - The CPU suites' matrix cases ----------*- C++ -*-===//
//
/// \file
/// One case of the forward and backward CPU matrices (spec, tiling,
/// problem, layout kind), its block-sparse layout, and fresh seeds: shared
/// by CpuForwardTests and CpuBackwardTests.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TESTS_UNIT_ATTENTIONCASES_H
#define FLASHJIT_TESTS_UNIT_ATTENTIONCASES_H

#include "kernels/HostTensor.h"

#include <ostream>
#include <random>
#include <vector>

namespace flashjit::test {

// Short names for the case tables.
constexpr auto BF = DType::BF16;
constexpr auto FP = DType::FP16;
constexpr auto NONE = MaskKind::None;
constexpr auto CAUSAL = MaskKind::Causal;
constexpr auto WIN = MaskKind::SlidingWindow;

enum class LayoutKind { Dense, Random, EmptyRow, Full };

struct Case {
  const char *name;
  int64_t dqk, dv;
  DType dtype;
  MaskKind mask;
  int64_t gqa;
  int64_t br, bc;
  int64_t batch, heads, nq, nkv;
  int64_t winL = 0, winR = 0;
  LayoutKind layout = LayoutKind::Dense;
  int64_t sparseBlock = 128;
  QKVLayout qkv = QKVLayout::Separate;
  /// AttentionSpec::scoreMod ("" for none).
  const char *scoreMod = "";
  /// TileConfig::splits (split-KV; 0 one pass, -1 auto).
  int64_t splits = 0;
  /// TileConfig::overlapSoftmax (the software-pipelined KV loop).
  bool overlap = false;
};

inline std::ostream &operator<<(std::ostream &os, const Case &c) {
  return os << c.name;
}

/// Fresh inputs (seeded from the OS) every run; tests print the seed on
/// failure so that a failure can be replayed.
inline uint64_t freshSeed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

/// The case's layout: random (density 0.5 per batch and head), one with an
/// empty Q-block row (Q block 1 lists no KV block: its rows see no key) and
/// one more block missing, broadcast over batch and heads, or full.
inline BlockSparseLayout makeLayout(const Case &c, uint64_t seed) {
  int64_t qb = (c.nq + c.sparseBlock - 1) / c.sparseBlock;
  int64_t kb = (c.nkv + c.sparseBlock - 1) / c.sparseBlock;
  switch (c.layout) {
  case LayoutKind::Random:
    return BlockSparseLayout::random(c.batch, c.heads, qb, kb, 0.5, seed);
  case LayoutKind::EmptyRow: {
    std::vector<uint8_t> dense(size_t(qb * kb), 1);
    for (int64_t k = 0; k < kb; ++k)
      dense[size_t(1 * kb + k)] = 0;
    dense[0] = 0;
    return BlockSparseLayout::fromDense(1, 1, qb, kb, dense);
  }
  case LayoutKind::Full:
  case LayoutKind::Dense:
    return BlockSparseLayout::fromDense(
        1, 1, qb, kb, std::vector<uint8_t>(size_t(qb * kb), 1));
  }
  return {};
}

/// A problem of \p batch x \p heads, \p nq queries and \p nkv keys (the
/// other fields their defaults).
inline Problem makeProblem(int64_t batch, int64_t heads, int64_t nq,
                           int64_t nkv) {
  Problem p;
  p.batch = batch;
  p.heads = heads;
  p.seqLenQ = nq;
  p.seqLenKV = nkv;
  return p;
}

/// \p n floats drawn uniformly from [lo, hi) (captured tensors' data).
inline std::vector<float> uniform(std::mt19937_64 &rng, size_t n, float lo,
                                  float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float &x : v)
    x = u(rng);
  return v;
}

/// Br x Bc with \p warps warps and the other TileConfig defaults: the
/// tiling the unit suites name inline.
inline TileConfig tileConfig(int64_t blockM, int64_t blockN,
                             int64_t warps = 4) {
  TileConfig config;
  config.blockM = blockM;
  config.blockN = blockN;
  config.warps = warps;
  return config;
}

/// Occurrences of \p what in \p text (an op in IR, an instruction in PTX).
inline int occurrences(const std::string &text, const std::string &what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1))
    ++n;
  return n;
}

/// A document mask_mod region (MaskModTests, CApiCapturedTests): keep
/// where seg[i] == seg[j], the segment ids its captured tensor.
inline const char *kDocumentMaskRegion = R"({
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  attn.yield %same : i1
})";

/// A score_mod region with two captured tensors (CapturedTensorTests,
/// MaskModTests): s + bias[(h * Nq + i) * Nkv + j] where seg[i] == seg[j],
/// else -inf
/// (Nq = 70, Nkv = 90 written in: the bias tensor is (H, Nq, Nkv)).
inline const char *kBiasAndDocumentsRegion = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %bias: memref<?xf32>, %seg: memref<?xf32>):
  %nq = arith.constant 70 : index
  %nkv = arith.constant 90 : index
  %hq = arith.muli %h, %nq : index
  %row = arith.addi %hq, %i : index
  %rk = arith.muli %row, %nkv : index
  %at = arith.addi %rk, %j : index
  %x = memref.load %bias[%at] : memref<?xf32>
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  %biased = arith.addf %s, %x : f32
  %ninf = arith.constant 0xFF800000 : f32
  %y = arith.select %same, %biased, %ninf : f32
  attn.yield %y : f32
})";

/// s * temp[0] + slopes[h] * (j - i) + bias[(h * Nq + i) * Nkv + j]:
/// three captured tensors, one read per score each (a learned temperature,
/// trainable ALiBi, a full bias; Nq = 50, Nkv = 70 written in).
/// CapturedTensorTests, DeterministicCaptureGradTests.
inline const char *kLearnedRegion = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %temp: memref<?xf32>, %slopes: memref<?xf32>, %bias: memref<?xf32>):
  %c0 = arith.constant 0 : index
  %t = memref.load %temp[%c0] : memref<?xf32>
  %st = arith.mulf %s, %t : f32
  %slope = memref.load %slopes[%h] : memref<?xf32>
  %d = arith.subi %j, %i : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %x = arith.mulf %slope, %df : f32
  %nq = arith.constant 50 : index
  %nkv = arith.constant 70 : index
  %hq = arith.muli %h, %nq : index
  %row = arith.addi %hq, %i : index
  %rk = arith.muli %row, %nkv : index
  %at = arith.addi %rk, %j : index
  %bv = memref.load %bias[%at] : memref<?xf32>
  %y0 = arith.addf %st, %x : f32
  %y = arith.addf %y0, %bv : f32
  attn.yield %y : f32
})";

} // namespace flashjit::test

#endif // FLASHJIT_TESTS_UNIT_ATTENTIONCASES_H
