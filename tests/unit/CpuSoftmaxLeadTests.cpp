//===- CpuSoftmaxLeadTests.cpp - S two blocks ahead of the softmax --------===//
//
/// \file
/// The overlapped loop with `softmax-lead=2` (FLASHJIT_SOFTMAX_LEAD=2,
/// TiledForwardBuilder::buildLeadTwoLoop): S = Q K^T of block t + 2 is
/// issued before the softmax of block t + 1, which reads the raw S the
/// loop carried from the iteration before, so that on the GPU a softmax
/// never waits for its own product. Run by the CPU execution mode (the
/// program the sm_90a consumers run) against the float64 reference on
/// fresh inputs with poisoned outputs: no block, one, two, three and many;
/// rows without keys; sparse lists with an empty row; bands past block 0;
/// score modifiers; GQA, fp16, dqk != dv, Nq != Nkv, split KV. Each
/// block's arithmetic is the plain loop's, so the bits are too; the loop
/// carries S; the pipeline text (the cache key) names the lead; the pass
/// refuses a lead other than 1 or 2.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "compiler/Pipelines/Pipelines.h"
#include "tests/unit/ForwardCheck.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

using namespace flashjit;

namespace {

using namespace flashjit::test;

/// FLASHJIT_SOFTMAX_LEAD=2 for the scope.
struct LeadTwo : ScopedEnv {
  LeadTwo() : ScopedEnv("FLASHJIT_SOFTMAX_LEAD", "2") {}
};

class CpuSoftmaxLead : public ::testing::TestWithParam<Case> {};

TEST_P(CpuSoftmaxLead, MatchesFloat64Reference) {
  LeadTwo lead;
  expectForwardMatchesReference(GetParam(), freshSeed());
}

constexpr auto DENSE = LayoutKind::Dense;
constexpr auto SEP = QKVLayout::Separate;

// clang-format off
const Case kLeadCases[] = {
  // name          dqk  dv  dt  mask   g  Br  Bc  B  H   Nq    Nkv  L  R  layout  sb  qkv  mod  S  overlap
  {"d128_many_blocks", 128, 128, BF, NONE, 1, 128, 128, 1, 2, 1000, 1000, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"one_block", 32, 32, BF, NONE, 1, 64, 64, 1, 1, 50, 40, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"two_blocks", 64, 64, BF, NONE, 1, 64, 64, 1, 2, 70, 128, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"three_blocks", 64, 64, FP, NONE, 1, 64, 64, 1, 2, 90, 150, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"d96_causal_nq_gt_nkv_empty_rows", 96, 96, FP, CAUSAL, 1, 64, 64, 1, 2, 300, 130, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"d64_window_band_past_block0", 64, 64, BF, WIN, 1, 32, 32, 1, 1, 500, 500, 40, 10, DENSE, 128, SEP, "", 0, true},
  {"window_rows_without_keys", 64, 64, BF, WIN, 2, 16, 16, 1, 2, 20, 10, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"d80_dv48_fp16_gqa4", 80, 48, FP, NONE, 4, 32, 64, 2, 8, 128, 300, 0, 0, DENSE, 128, SEP, "", 0, true},
  {"sparse_random_causal", 128, 128, BF, CAUSAL, 1, 64, 64, 2, 2, 520, 520, 0, 0, LayoutKind::Random, 128, SEP, "", 0, true},
  {"sparse_emptyrow", 64, 64, BF, NONE, 1, 32, 32, 1, 2, 256, 256, 0, 0, LayoutKind::EmptyRow, 64, SEP, "", 0, true},
  {"softcap_causal", 64, 64, BF, CAUSAL, 1, 64, 64, 1, 2, 300, 300, 0, 0, DENSE, 128, SEP, "softcap:5", 0, true},
  {"alibi_without_bias_product", 128, 128, BF, CAUSAL, 1, 128, 128, 1, 4, 300, 517, 0, 0, DENSE, 128, SEP, "alibi:4", 0, true},
  {"split_kv_decode_gqa8", 128, 128, BF, NONE, 8, 16, 64, 2, 16, 1, 1500, 0, 0, DENSE, 128, SEP, "", 5, true},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Cases, CpuSoftmaxLead, ::testing::ValuesIn(kLeadCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

/// The tile stage of a causal d = 64 forward on the overlapped loop.
std::string tiled() {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 64;
  spec.mask = MaskKind::Causal;
  TileConfig config;
  config.overlapSoftmax = true;
  return emitStage(spec, config, Stage::Tile);
}

} // namespace

/// The loop carries the next block's raw S (f32) beside the rounded P, and
/// makes one S = Q K^T a block as the lead-1 loop does, plus one before it
/// (block tLo + 1's) and one softmax after it (the last block's).
TEST(SoftmaxLead, TheLoopCarriesTheNextBlocksScores) {
  const std::string one = tiled();
  std::string two;
  {
    LeadTwo lead;
    two = tiled();
  }
  const std::string carried = "-> (tensor<64x64xf32>, tensor<64xf32>, "
                              "tensor<64xf32>, tensor<64x64xbf16>, "
                              "tensor<64xf32>";
  EXPECT_NE(one.find(carried + ")"), std::string::npos) << one;
  EXPECT_NE(two.find(carried + ", tensor<64x64xf32>)"), std::string::npos)
      << two;
  EXPECT_EQ(occurrences(two, "tile.dot"), occurrences(one, "tile.dot") + 2);
  EXPECT_EQ(occurrences(two, "math.exp2"),
            occurrences(one, "math.exp2") + 2);
}

/// Each block's arithmetic is the plain loop's in the same order, so the
/// lead-2 loop gives the plain loop's bits: a block counted twice or
/// skipped, or O rescaled by the wrong max, fails it. Two and three
/// blocks, rows without keys, a sparse layout with an empty Q block,
/// softcap.
TEST(SoftmaxLead, SameBitsAsThePlainLoop) {
  for (int i : {2, 3, 4, 9, 10})
    expectSameBitsAsThePlainLoop(kLeadCases[i], "FLASHJIT_SOFTMAX_LEAD", "2");
}

/// The lead is part of both pipeline texts (so of the cache keys) only
/// where it is taken: FLASHJIT_SOFTMAX_LEAD=2 on the overlapped loop.
TEST(SoftmaxLead, PipelineTextsNameIt) {
  TileConfig overlapped;
  overlapped.overlapSoftmax = true;
  TileConfig plain;
  EXPECT_EQ(softmaxLead(overlapped), 1);
  EXPECT_EQ(cpuPipelineText(overlapped).find("softmax-lead"),
            std::string::npos);
  LeadTwo lead;
  EXPECT_EQ(softmaxLead(overlapped), 2);
  EXPECT_EQ(softmaxLead(plain), 1);
  EXPECT_NE(cpuPipelineText(overlapped).find(" softmax-lead=2"),
            std::string::npos);
  EXPECT_NE(gpuPipelineText(overlapped, GpuTarget()).find(" softmax-lead=2"),
            std::string::npos);
  EXPECT_EQ(cpuPipelineText(plain).find("softmax-lead"), std::string::npos);
  ScopedEnv other("FLASHJIT_SOFTMAX_LEAD", "3");
  EXPECT_EQ(softmaxLead(overlapped), 1);
}
