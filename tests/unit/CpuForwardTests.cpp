//===- CpuForwardTests.cpp - The tiled forward on the CPU vs float64 ------===//
//
/// \file
/// Runs the tiled IR through the CPU execution mode and compares it with the
/// float64 reference by relative norm error. Fresh random inputs every run,
/// outputs poisoned with NaN before the run. The matrix covers every value
/// the spine asks for at least once (head dims, lengths, Nq != Nkv, tile
/// shapes that do not divide N, masks, GQA, block-sparse layouts, strides,
/// bf16 and fp16) without the full cross product.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"

#include "tests/unit/ForwardCheck.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace flashjit;

namespace {

using namespace flashjit::test;

class CpuForward : public ::testing::TestWithParam<Case> {};

TEST_P(CpuForward, MatchesFloat64Reference) {
  expectForwardMatchesReference(GetParam(), freshSeed());
}

// clang-format off
const Case kCases[] = {
  // name          dqk  dv  dt  mask   g  Br  Bc  B  H   Nq    Nkv
  {"d1_n17",        1,   1, BF, NONE,  1, 16, 16, 1, 2,   17,   17},
  {"d7_fp16_causal",7,   7, FP, CAUSAL,1, 32, 16, 1, 1,  128,  128},
  {"d16_n1000",    16,  16, BF, NONE,  1, 64, 64, 1, 1, 1000, 1000},
  {"d33_dv64_nq_lt_nkv_causal", 33, 64, BF, CAUSAL, 1, 16, 32, 1, 1, 17, 1000},
  {"d64_fp16_window_n1025", 64, 64, FP, WIN, 1, 64, 32, 1, 1, 1025, 1025, 100, 20},
  {"d80_gqa4",     80,  80, BF, NONE,  4, 32, 64, 2, 8,  128,  128},
  {"d96_causal_nq_gt_nkv", 96, 96, BF, CAUSAL, 1, 64, 64, 1, 2, 1000, 128},
  {"d100_dv80_n1", 100, 80, BF, NONE,  1, 64, 64, 1, 1,    1,    1},
  {"d128_sparse_random", 128, 128, BF, NONE, 1, 32, 64, 2, 2, 1025, 1025, 0, 0, LayoutKind::Random, 64},
  {"d160_dv128_fp16_sparse_emptyrow_causal", 160, 128, FP, CAUSAL, 1, 64, 32, 1, 2, 256, 256, 0, 0, LayoutKind::EmptyRow, 64},
  {"d256_sparse_full_window", 256, 256, BF, WIN, 1, 32, 32, 1, 1, 300, 300, 64, 64, LayoutKind::Full, 64},
  {"d512_br16_bc32", 512, 512, BF, NONE, 1, 16, 32, 1, 1, 128,  128},
  {"d64_packed_qkv_causal", 64, 64, BF, CAUSAL, 1, 48, 40, 2, 4, 200, 200, 0, 0, LayoutKind::Dense, 128, QKVLayout::Packed},
  {"d128_fp16_window_nq_gt_nkv", 128, 128, FP, WIN, 1, 64, 64, 1, 1, 300, 100, 10, 10},
  {"d64_gqa2_causal_sparse_random", 64, 64, BF, CAUSAL, 2, 64, 64, 2, 4, 512, 512, 0, 0, LayoutKind::Random, 128},
  {"d32_dv16_window_left_only", 32, 16, FP, WIN, 1, 16, 16, 1, 1, 100, 140, 5, 0},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Matrix, CpuForward, ::testing::ValuesIn(kCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

/// The check must be able to fail: the same kernel with one output element
/// corrupted, or one row never written, is rejected.
TEST(CpuForwardCheck, DetectsWrongAndUnwrittenOutputs) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 32;
  TileConfig config;
  config.blockM = config.blockN = 32;
  Problem p;
  p.seqLenQ = p.seqLenKV = 64;
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  auto kernel = CpuKernel::compile(spec, config);
  kernel->run(p, data, nullptr);
  ReferenceResult ref = referenceForward(spec, p, data, nullptr);
  ASSERT_LT(compareWithReference(spec, p, data, ref).relErr(), 1e-2);

  AttentionData wrong = data;
  wrong.o.buffer = std::make_shared<std::vector<uint16_t>>(*data.o.buffer);
  for (int64_t d = 0; d < 32; ++d)
    wrong.o.at(0, 0, 5, d) = floatToHalf(spec.dtype, 3.0f);
  EXPECT_GT(compareWithReference(spec, p, wrong, ref).relErr(), 1e-2);

  AttentionData unwritten = data;
  unwritten.lse[7] = std::nanf("");
  EXPECT_FALSE(
      std::isfinite(compareWithReference(spec, p, unwritten, ref).relErr()));
}

/// Scores that grow along the keys at a different rate in each row, so
/// that the running max moves in most steps, by 0 to 12 (log2 units) a
/// block: O and lse still match the float64 reference. The last block's
/// scores lie up to ~195 above the first's, so never rescaling after the
/// first block overflows P (896 NaN when tried), and a rescale that
/// skipped O or l would be far off. (T28 tried FlashAttention-4's
/// conditional rescale, a max kept until a block passes it by 8, against
/// this test; on an H100 it was no faster, 0.99-1.01x, and was reverted.)
TEST(CpuForwardRescale, GrowingScoresMatchReference) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 32;
  TileConfig config;
  config.blockM = config.blockN = 16;
  Problem p;
  p.heads = 2;
  p.seqLenQ = 64;
  p.seqLenKV = 256;
  const uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  // s_ij ~ rate_i * j (+ the other coordinates' noise): per 16-key block
  // the max grows by rate_i * 16 * scale * log2(e), 0..12 for rates 0..3.
  std::uniform_real_distribution<float> rate(0.0f, 3.0f);
  for (int64_t h = 0; h < p.heads; ++h) {
    for (int64_t i = 0; i < p.seqLenQ; ++i)
      data.q.at(0, h, i, 0) = floatToHalf(spec.dtype, rate(rng));
    for (int64_t j = 0; j < p.seqLenKV; ++j) // integers: exact in bf16
      data.k.at(0, h, j, 0) = floatToHalf(spec.dtype, float(j));
  }
  auto kernel = CpuKernel::compile(spec, config);
  kernel->run(p, data, nullptr);
  ReferenceResult ref = referenceForward(spec, p, data, nullptr);
  ErrorReport err = compareWithReference(spec, p, data, ref);
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.oRelErr, errorBound(spec.dtype));
  EXPECT_LT(err.lseRelErr, errorBound(spec.dtype));
}

/// A block-sparse layout that lists nothing gives O = 0 and lse = -inf
/// everywhere, and a kernel given a wrong-sized layout is refused.
TEST(CpuForwardCheck, EmptyLayoutAndLayoutChecks) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 16;
  spec.blockSparse = true;
  spec.sparseBlock = 32;
  TileConfig config;
  config.blockM = config.blockN = 16;
  Problem p;
  p.seqLenQ = p.seqLenKV = 70;
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  auto empty =
      BlockSparseLayout::fromDense(1, 1, 3, 3, std::vector<uint8_t>(9, 0));
  auto kernel = CpuKernel::compile(spec, config);
  kernel->run(p, data, &empty);
  for (float l : data.lse)
    EXPECT_TRUE(std::isinf(l) && l < 0);
  for (uint16_t o : *data.o.buffer)
    EXPECT_EQ(halfToFloat(spec.dtype, o), 0.0f);

  auto small =
      BlockSparseLayout::fromDense(1, 1, 2, 2, std::vector<uint8_t>(4, 1));
  EXPECT_THROW(kernel->run(p, data, &small), SpecError);
  EXPECT_THROW(kernel->run(p, data, nullptr), SpecError);
}

TEST(CpuForwardCheck, RejectsInnermostStrideNotOne) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 16;
  TileConfig config;
  Problem p;
  p.seqLenQ = p.seqLenKV = 8;
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  data.k.strides[3] = 2;
  auto kernel = CpuKernel::compile(spec, config);
  try {
    kernel->run(p, data, nullptr);
    FAIL() << "expected a SpecError";
  } catch (const SpecError &e) {
    EXPECT_NE(std::string(e.what()).find("innermost"), std::string::npos);
  }
}

} // namespace
