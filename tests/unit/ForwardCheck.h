//===- ForwardCheck.h - One forward case on the CPU vs float64 -*- C++ -*-===//
//
/// \file
/// Runs one Case through the CPU execution mode (the tile IR, lowered to
/// loops) on fresh random inputs with NaN-poisoned outputs and checks it
/// against the float64 reference: relative norm errors within the dtype's
/// bound, no NaN, the -inf pattern of lse, and O = 0 on rows that see no
/// key. Shared by the forward matrix and the property test.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TESTS_UNIT_FORWARDCHECK_H
#define FLASHJIT_TESTS_UNIT_FORWARDCHECK_H

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

namespace flashjit::test {

/// The description of case \p c.
inline AttentionSpec specOf(const Case &c) {
  AttentionSpec spec;
  spec.headDimQK = c.dqk;
  spec.headDimV = c.dv;
  spec.dtype = c.dtype;
  spec.mask = c.mask;
  spec.gqaGroup = c.gqa;
  spec.blockSparse = c.layout != LayoutKind::Dense;
  spec.sparseBlock = c.sparseBlock;
  spec.scoreMod = c.scoreMod;
  return spec;
}

/// The tiling of case \p c.
inline TileConfig configOf(const Case &c) {
  TileConfig config;
  config.blockM = c.br;
  config.blockN = c.bc;
  config.splits = c.splits;
  config.overlapSoftmax = c.overlap;
  return config;
}

/// The problem of case \p c.
inline Problem problemOf(const Case &c) {
  Problem p;
  p.batch = c.batch;
  p.heads = c.heads;
  p.seqLenQ = c.nq;
  p.seqLenKV = c.nkv;
  p.windowLeft = c.winL;
  p.windowRight = c.winR;
  return p;
}

/// Checks case \p c on inputs drawn from \p seed (reported on failure).
inline void expectForwardMatchesReference(const Case &c, uint64_t seed) {
  AttentionSpec spec = specOf(c);
  TileConfig config = configOf(c);
  Problem p = problemOf(c);

  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionData data = makeRandomInputs(spec, p, c.qkv, rng);
  if (c.qkv == QKVLayout::Packed)
    ASSERT_EQ(data.q.buffer, data.k.buffer) << "case must use packed qkv";
  std::unique_ptr<BlockSparseLayout> layout;
  if (spec.blockSparse)
    layout = std::make_unique<BlockSparseLayout>(makeLayout(c, seed));

  auto kernel = CpuKernel::compile(spec, config);
  kernel->run(p, data, layout.get());
  ReferenceResult ref = referenceForward(spec, p, data, layout.get());
  ErrorReport err = compareWithReference(spec, p, data, ref);

  EXPECT_EQ(err.nanCount, 0) << "NaN (or unwritten poisoned) outputs";
  EXPECT_EQ(err.lseMismatch, 0) << "lse -inf pattern differs";
  EXPECT_LT(err.oRelErr, errorBound(spec.dtype));
  EXPECT_LT(err.lseRelErr, errorBound(spec.dtype));
  // Rows that see no key: O exactly 0 and lse -inf.
  ASSERT_EQ(int64_t(ref.rows.size()), p.batch * p.heads * p.seqLenQ);
  for (size_t ri = 0; ri < ref.rows.size(); ++ri)
    if (std::isinf(ref.lse[ri])) {
      int64_t row = ref.rows[ri];
      ASSERT_TRUE(std::isinf(data.lse[row]) && data.lse[row] < 0);
      int64_t i = int64_t(row) % p.seqLenQ;
      int64_t bh = int64_t(row) / p.seqLenQ;
      for (int64_t d = 0; d < c.dv; ++d)
        ASSERT_EQ(halfToFloat(spec.dtype,
                              data.o.at(bh / p.heads, bh % p.heads, i, d)),
                  0.0f);
    }
}

/// Runs case \p c (its overlapped loop) and the plain loop on the same
/// fresh inputs, outputs poisoned before each run, and expects the same O
/// and lse bits; the environment variable \p envName (when given) holds
/// \p envValue for the overlapped loop's compile only.
inline void expectSameBitsAsThePlainLoop(const Case &c,
                                         const char *envName = nullptr,
                                         const char *envValue = nullptr) {
  SCOPED_TRACE(c.name);
  AttentionSpec spec = specOf(c);
  Problem p = problemOf(c);
  const uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionData data = makeRandomInputs(spec, p, c.qkv, rng);
  std::unique_ptr<BlockSparseLayout> layout;
  if (spec.blockSparse)
    layout = std::make_unique<BlockSparseLayout>(makeLayout(c, seed));
  TileConfig config = configOf(c);
  {
    std::unique_ptr<ScopedEnv> env;
    if (envName)
      env = std::make_unique<ScopedEnv>(envName, envValue);
    CpuKernel::compile(spec, config)->run(p, data, layout.get());
  }
  const std::vector<uint16_t> o = *data.o.buffer;
  const std::vector<float> lse = data.lse;
  std::fill(data.o.buffer->begin(), data.o.buffer->end(), uint16_t(0x7fc0));
  std::fill(data.lse.begin(), data.lse.end(), std::nanf(""));
  config.overlapSoftmax = false;
  CpuKernel::compile(spec, config)->run(p, data, layout.get());
  EXPECT_EQ(o, *data.o.buffer);
  ASSERT_EQ(lse.size(), data.lse.size());
  EXPECT_EQ(
      0, std::memcmp(lse.data(), data.lse.data(), lse.size() * sizeof(float)));
}

} // namespace flashjit::test

#endif // FLASHJIT_TESTS_UNIT_FORWARDCHECK_H
