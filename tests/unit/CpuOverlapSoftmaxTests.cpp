//===- CpuOverlapSoftmaxTests.cpp - The pipelined KV loop vs float64 ------===//
//
/// \file
/// The software-pipelined forward (TileConfig::overlapSoftmax: S of block
/// t + 1 and P_t V_t issued before the softmax of block t + 1, the first
/// block's S and softmax before the loop, the last block's P V after it) run by
/// the CPU execution mode, the program the sm_90a K/V ring's consumers run,
/// against the float64 reference on fresh inputs with poisoned outputs
/// (ForwardCheck.h). The cases cover one block and many, rows that see no key
/// (an empty loop: the first block's S and softmax are made and dropped),
/// block-sparse lists with an empty row (the first listed block is never read),
/// masks whose band starts past block 0, score modifiers that read the key
/// index, GQA, fp16, dqk != dv, Nq != Nkv and the split-KV partial; and that
/// the program is the plain loop's, op for op, but for the first block's
/// softmax before the loop and the carried P, with the plain loop's bits.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuGeometry.h"
#include "tests/unit/ForwardCheck.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

using namespace flashjit;

namespace {

using namespace flashjit::test;

class CpuOverlapSoftmax : public ::testing::TestWithParam<Case> {};

TEST_P(CpuOverlapSoftmax, MatchesFloat64Reference) {
  expectForwardMatchesReference(GetParam(), freshSeed());
}

constexpr auto DENSE = LayoutKind::Dense;
constexpr auto SEP = QKVLayout::Separate;

// clang-format off
const Case kOverlapCases[] = {
  // name          dqk  dv  dt  mask   g  Br  Bc  B  H   Nq    Nkv  L  R  layout  sb  qkv  mod  S  overlap
  {"d128_br128_bc128_n1000", 128, 128, BF, NONE, 1, 128, 128, 1, 2, 1000, 1000, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"d64_causal_nq_lt_nkv", 64, 64, BF, CAUSAL, 1, 64, 32, 2, 2, 100, 700, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"d96_causal_nq_gt_nkv_empty_rows", 96, 96, FP, CAUSAL, 1, 64, 64, 1, 2, 300, 130, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"d64_window_band_past_block0", 64, 64, BF, WIN, 1, 32, 32, 1, 1, 500, 500, 40, 10, DENSE, 128, SEP, "", 0, true},
  {"window_rows_without_keys", 64, 64, BF, WIN, 2, 16, 16, 1, 2, 20, 10, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"one_block", 32, 32, BF, NONE, 1, 64, 64, 1, 1, 50, 40, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"d80_dv48_fp16_gqa4", 80, 48, FP, NONE, 4, 32, 64, 2, 8, 128, 300, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"sparse_random_causal", 128, 128, BF, CAUSAL, 1, 64, 64, 2, 2, 520, 520, 0, 0, LayoutKind::Random, 128, SEP, "", 0, true},
  {"sparse_emptyrow", 64, 64, BF, NONE, 1, 32, 32, 1, 2, 256, 256, 0, 0, LayoutKind::EmptyRow, 64, SEP, "", 0, true},
  {"softcap", 64, 64, BF, CAUSAL, 1, 64, 64, 1, 2, 300, 300, 0, 0, DENSE, 128, SEP, "softcap:5", 0, true},
  {"alibi_gqa2", 64, 64, BF, NONE, 2, 32, 64, 1, 4, 200, 333, 0, 0, DENSE, 128, SEP, "alibi:4", 0, true},
  {"split_kv_decode_gqa8", 128, 128, BF, NONE, 8, 16, 64, 2, 16, 1, 1500, 0, 0, DENSE, 128, SEP, "", 5, true},
  // The bias product (BiasProduct.h): ALiBi's bias as one more k-step.
  {"alibi_bias_product_causal", 128, 128, BF, CAUSAL, 1, 128, 128, 1, 4, 300, 517, 0, 0, DENSE, 128, SEP, "alibi:4", 0, true},
  {"alibi_bias_product_bc80", 112, 96, BF, NONE, 1, 128, 80, 2, 2, 333, 250, 0, 0, DENSE, 128, SEP, "alibi:2", 0, true},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Cases, CpuOverlapSoftmax,
                         ::testing::ValuesIn(kOverlapCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

/// The tiled text of the default forward at d = 64 with and without the
/// overlap.
std::string tiled(bool overlap) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 64;
  spec.mask = MaskKind::Causal;
  TileConfig config;
  config.overlapSoftmax = overlap;
  return emitStage(spec, config, Stage::Tile);
}

/// The same ops but one more S = Q K^T and softmax (the first block's,
/// before the loop) and one more P V with its factor (the last block's,
/// after it); the loop carries P rounded and the previous max, not S.
TEST(OverlapSoftmax, TheLoopCarriesRoundedP) {
  const std::string plain = tiled(false), overlapped = tiled(true);
  EXPECT_EQ(occurrences(plain, "tile.dot"), 2);
  EXPECT_EQ(occurrences(overlapped, "tile.dot"), 4);
  EXPECT_EQ(occurrences(overlapped, "tile.load"),
            occurrences(plain, "tile.load") + 2);
  EXPECT_EQ(occurrences(overlapped, "math.exp2"),
            2 * occurrences(plain, "math.exp2") + 1);
  EXPECT_NE(overlapped.find("-> (tensor<64x64xf32>, tensor<64xf32>, "
                            "tensor<64xf32>, tensor<64x64xbf16>, "
                            "tensor<64xf32>)"),
            std::string::npos)
      << overlapped;
}

/// Each block's arithmetic is the plain loop's, in the same order: the
/// overlapped loop gives the plain loop's bits on the same inputs (O
/// rescaled after P V, or a block counted twice, fails it). Causal rows without
/// keys, a sparse layout, a Q block of no KV blocks (its O +0, not the -0 of
/// the epilogue's P V times l = 0), softcap.
TEST(OverlapSoftmax, SameBitsAsThePlainLoop) {
  for (int i : {2, 7, 8, 9})
    expectSameBitsAsThePlainLoop(kOverlapCases[i]);
}

/// A Q block that lists no KV block (sparse_emptyrow's block 1) gives O =
/// +0 and lse = -inf even where every V holds NaN: its program computes
/// block 0's P V anyway (the peel's epilogue) but drops it (T30), as the
/// plain loop never loads it. Every other row sees a NaN value, so the
/// rows that must stay clean are told apart from those that may not.
TEST(OverlapSoftmax, EmptyQBlockIgnoresValuesItNeverSees) {
  const Case &c = kOverlapCases[8];
  ASSERT_EQ(c.layout, LayoutKind::EmptyRow);
  AttentionSpec spec = specOf(c);
  Problem p = problemOf(c);
  const uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  std::mt19937_64 rng(seed);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlapped" : "plain");
    AttentionData data = makeRandomInputs(spec, p, c.qkv, rng);
    std::fill(data.v.buffer->begin(), data.v.buffer->end(), uint16_t(0x7fc0));
    BlockSparseLayout layout = makeLayout(c, seed);
    TileConfig config = configOf(c);
    config.overlapSoftmax = overlap;
    CpuKernel::compile(spec, config)->run(p, data, &layout);
    int64_t clean = 0, cleanLse = 0, poisoned = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.nq; ++i) {
          const bool empty = i / c.sparseBlock == 1;
          const float lse = data.lse[size_t((b * c.heads + h) * c.nq + i)];
          for (int64_t d = 0; d < c.dv; ++d) {
            const uint16_t o = data.o.at(b, h, i, d);
            if (empty)
              clean += o == 0; // +0 exactly: not -0, not NaN
            else
              poisoned += (o & 0x7f80) == 0x7f80 && (o & 0x7f) != 0;
          }
          cleanLse += empty && std::isinf(lse) && lse < 0;
        }
    EXPECT_EQ(clean, c.batch * c.heads * c.sparseBlock * c.dv);
    EXPECT_EQ(cleanLse, c.batch * c.heads * c.sparseBlock);
    EXPECT_GT(poisoned, 0);
  }
}

/// Forward only: the backward has no such loop.
TEST(OverlapSoftmax, BackwardRefusesIt) {
  AttentionSpec spec;
  spec.direction = Direction::Backward;
  TileConfig config;
  config.overlapSoftmax = true;
  EXPECT_THROW(config.validate(spec), SpecError);
  EXPECT_NE(config.toJson().find("\"overlap_softmax\":true"),
            std::string::npos);
  config.overlapSoftmax = false;
  EXPECT_EQ(config.toJson().find("overlap"), std::string::npos);
}

/// On the GPU it needs the K/V ring with two consumer warpgroups: 128 x
/// 128 on 8 warps (2 stages) passes; 12 warps (three consumer warpgroups,
/// a ring), 4 warps and no ring (stages 1, or a target without it) are
/// named errors.
TEST(OverlapSoftmax, GpuNeedsTheRingOnTwoConsumerWarpgroups) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 64;
  TileConfig config;
  config.blockM = config.blockN = 128;
  config.warps = 8;
  config.stages = 2;
  config.overlapSoftmax = true;
  EXPECT_EQ(gpuConfigProblem(spec, config, 227 * 1024, true), "");
  EXPECT_NE(gpuConfigProblem(spec, config, 227 * 1024, false), "");
  TileConfig three = config;
  three.blockM = 192;
  three.warps = 12;
  ASSERT_GT(gpuGeometry(spec, three, true).ringStages, 0);
  EXPECT_NE(gpuConfigProblem(spec, three, 227 * 1024, true)
                .find("two consumer warpgroups"),
            std::string::npos);
  TileConfig one = config;
  one.blockM = 64;
  one.warps = 4;
  EXPECT_NE(gpuConfigProblem(spec, one, 227 * 1024, true), "");
  TileConfig noRing = config;
  noRing.stages = 1;
  EXPECT_NE(gpuConfigProblem(spec, noRing, 227 * 1024, true), "");
}

} // namespace

namespace {

/// The tiled text of ALiBi (alibi:4) at d = 128 on the overlapped loop with
/// \p stages ring stages, or on the plain loop.
std::string alibiTiled(bool overlap, int64_t stages = 2) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 128;
  spec.scoreMod = "alibi:4";
  TileConfig config = tileConfig(128, 128, 8);
  config.stages = stages;
  config.overlapSoftmax = overlap;
  return emitStage(spec, config, Stage::Tile);
}

} // namespace

/// Lines of \p text that are an fma on score tiles (128 x 128).
int scoreFmas(const std::string &text) {
  int n = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    n += line.find("math.fma") != std::string::npos &&
         line.find(": tensor<128x128xf32>") != std::string::npos;
  return n;
}

/// On the overlapped loop with a ring of up to two stages, ALiBi's bias is
/// one more product step on the same accumulator (Br x 16 by 16 x Bc, for
/// the first block and in the loop) and no score adds it: each block's one
/// fma a score is the exponent's, as without a modifier. A deeper ring
/// keeps the fma (the operand's slot would not fit beside its stages), as
/// does the plain loop.
TEST(BiasProduct, AlibiTakesOneMoreProductStep) {
  const std::string bias = "tensor<128x16xbf16>, tensor<16x128xbf16>";
  const std::string product = alibiTiled(true), deep = alibiTiled(true, 3),
                    plain = alibiTiled(false);
  EXPECT_EQ(occurrences(product, bias), 2) << product;
  EXPECT_EQ(occurrences(product, "tile.dot"),
            occurrences(deep, "tile.dot") + 2);
  EXPECT_EQ(scoreFmas(product), 2) << product;
  EXPECT_EQ(scoreFmas(deep), 4) << deep;
  EXPECT_EQ(occurrences(deep, bias), 0);
  EXPECT_EQ(occurrences(plain, bias), 0);
}
