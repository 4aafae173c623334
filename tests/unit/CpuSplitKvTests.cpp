//===- CpuSplitKvTests.cpp - The split-KV forward on the CPU vs float64 ---===//
//
/// \file
/// The split-KV forward (kernels/KernelABI.h abi::split): the partial
/// program over one of S runs of the KV blocks, GQA-packed where gqa > 1
/// and dense, and the lse merge, run by the CPU execution mode and checked
/// against the float64 reference on fresh inputs with poisoned outputs
/// (ForwardCheck.h). The cases cover decode (Nq = 1), short queries whose
/// packed rows span two row blocks, masks whose band depends on the packed
/// row's query, more splits than blocks (empty runs), block-sparse layouts
/// (no packing), score modifiers that read the head and the query index
/// (unpacked ALiBi with its bias split out of the KV loop, softcap with a
/// fixed row max),
/// fp16, dqk != dv, rows that see no key, the auto split count, split
/// counts that fill the merge's whole steps of 32 runs exactly (no last
/// step), leave only a last step, or both, and V head dims whose merge
/// takes 1, 2 (of 40 and 50 columns), 4 and 8 column chunks
/// (abi::split::combineChunks).
//
//===----------------------------------------------------------------------===//

#include "kernels/KernelABI.h"
#include "tests/unit/ForwardCheck.h"

#include <gtest/gtest.h>

using namespace flashjit;

namespace {

using namespace flashjit::test;

class CpuSplitKv : public ::testing::TestWithParam<Case> {};

TEST_P(CpuSplitKv, MatchesFloat64Reference) {
  expectForwardMatchesReference(GetParam(), freshSeed());
}

constexpr auto DENSE = LayoutKind::Dense;
constexpr auto SEP = QKVLayout::Separate;

// clang-format off
const Case kSplitCases[] = {
  // name          dqk  dv  dt  mask   g  Br  Bc  B  H   Nq    Nkv  L  R  layout  sb  qkv  mod  S
  {"decode_d128_gqa8", 128, 128, BF, NONE, 8, 16, 64, 2, 16, 1, 2000, 0, 0, DENSE, 128, SEP, "", 5},
  {"decode_d64_gqa4_causal_auto", 64, 64, BF, CAUSAL, 4, 16, 64, 1, 8, 1, 1500, 0, 0, DENSE, 128, SEP, "", -1},
  {"short_q_gqa4_causal_two_row_blocks", 64, 64, BF, CAUSAL, 4, 16, 32, 2, 8, 5, 700, 0, 0, DENSE, 128, SEP, "", 4},
  {"short_q_gqa4_window", 64, 64, FP, WIN, 4, 16, 32, 1, 4, 7, 500, 100, 3, DENSE, 128, SEP, "", 3},
  {"more_splits_than_blocks_dv40", 96, 40, FP, NONE, 3, 16, 32, 1, 6, 3, 300, 0, 0, DENSE, 128, SEP, "", 50},
  {"alibi_heads_packed", 64, 64, BF, CAUSAL, 2, 16, 64, 2, 4, 9, 1024, 0, 0, DENSE, 128, SEP, "alibi:4", 3},
  {"alibi_unpacked_causal_bias_out_of_the_loop", 64, 64, BF, CAUSAL, 1, 32, 32, 1, 4, 40, 900, 0, 0, DENSE, 128, SEP, "alibi:4", 3},
  {"softcap_unpacked_br64", 64, 64, BF, NONE, 1, 64, 64, 2, 4, 70, 300, 0, 0, DENSE, 128, SEP, "softcap:5", 2},
  {"sparse_gqa2_no_packing", 64, 64, BF, CAUSAL, 2, 64, 64, 2, 4, 200, 1024, 0, 0, LayoutKind::Random, 128, SEP, "", 3},
  {"empty_rows_window", 64, 64, BF, WIN, 2, 16, 16, 1, 2, 20, 10, 0, 0, DENSE, 128, SEP, "", 5},
  {"one_split", 32, 32, BF, NONE, 2, 16, 16, 1, 2, 1, 100, 0, 0, DENSE, 128, SEP, "", 1},
  {"thirty_two_splits_one_whole_step", 64, 64, BF, CAUSAL, 4, 16, 32, 1, 4, 2, 1100, 0, 0, DENSE, 128, SEP, "", 32},
  {"d256_eight_chunks_whole_step_and_one", 256, 256, BF, NONE, 2, 16, 32, 1, 2, 1, 2100, 0, 0, DENSE, 128, SEP, "", 33},
  {"dv80_two_chunks_of_40_two_whole_steps", 96, 80, FP, NONE, 2, 16, 16, 1, 2, 3, 1100, 0, 0, DENSE, 128, SEP, "", 64},
  {"dv100_chunks_of_50_and_a_last_step", 64, 100, BF, CAUSAL, 1, 16, 16, 1, 2, 2, 700, 0, 0, DENSE, 128, SEP, "", 40},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Cases, CpuSplitKv, ::testing::ValuesIn(kSplitCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

/// The merge's column chunks: the most of at least 32 columns that divide
/// dv equally.
TEST(SplitKv, CombineChunks) {
  using flashjit::abi::split::combineChunks;
  EXPECT_EQ(combineChunks(1), 1);
  EXPECT_EQ(combineChunks(40), 1);
  EXPECT_EQ(combineChunks(64), 2);
  EXPECT_EQ(combineChunks(80), 2);  // 40 columns
  EXPECT_EQ(combineChunks(97), 1);  // prime
  EXPECT_EQ(combineChunks(100), 2); // 50 (3 does not divide)
  EXPECT_EQ(combineChunks(128), 4);
  EXPECT_EQ(combineChunks(256), 8);
  EXPECT_EQ(combineChunks(512), 16);
}

/// The launcher's split rule: four programs per processor, at least one KV
/// block per split, within kMaxSplits, 1 when the grid is already full.
TEST(SplitKv, ChooseKvSplits) {
  using flashjit::abi::split::chooseKvSplits;
  EXPECT_EQ(chooseKvSplits(64, 512, 132), 9);   // ceil(528 / 64)
  EXPECT_EQ(chooseKvSplits(64, 3, 132), 3);     // at most the blocks
  EXPECT_EQ(chooseKvSplits(1000, 512, 132), 1); // the grid fills the device
  EXPECT_EQ(chooseKvSplits(1, 100000, 132), TileConfig::kMaxSplits);
}

/// The packed grid: Nq * gqa rows over batch * KV heads; unpacked with a
/// layout (its lists are per query head) or without GQA.
TEST(SplitKv, SplitGrid) {
  AttentionSpec spec;
  spec.gqaGroup = 8;
  Problem p;
  p.batch = 2;
  p.heads = 32;
  p.seqLenQ = 3;
  auto g = flashjit::abi::split::splitGrid(spec, p, 16);
  EXPECT_EQ(g[0], 2); // ceil(24 / 16)
  EXPECT_EQ(g[1], 8); // 2 * 4 KV heads
  spec.blockSparse = true;
  g = flashjit::abi::split::splitGrid(spec, p, 16);
  EXPECT_EQ(g[0], 1);
  EXPECT_EQ(g[1], 64);
}

/// The config's splits: validated, and in its JSON only when set.
TEST(SplitKv, ConfigSplits) {
  AttentionSpec spec;
  TileConfig c;
  EXPECT_EQ(c.toJson().find("splits"), std::string::npos);
  c.splits = TileConfig::kAutoSplits;
  EXPECT_NE(c.toJson().find("\"splits\":\"auto\""), std::string::npos);
  c.splits = 7;
  EXPECT_NE(c.toJson().find("\"splits\":7"), std::string::npos);
  EXPECT_NO_THROW(c.validate(spec));
  c.splits = TileConfig::kMaxSplits + 1;
  EXPECT_THROW(c.validate(spec), SpecError);
  c.splits = -2;
  EXPECT_THROW(c.validate(spec), SpecError);
  c.splits = 2;
  spec.direction = Direction::Backward;
  EXPECT_THROW(c.validate(spec), SpecError);
}

/// The decode rule: split where the packed rows fit one tile and the keys
/// are many; one pass otherwise.
TEST(SplitKv, DecodeConfig) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 128;
  spec.gqaGroup = 8;
  Problem p;
  p.heads = 32;
  p.seqLenQ = 1;
  p.seqLenKV = 32768;
  std::optional<TileConfig> c = decodeGpuConfig(spec, p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->blockM, 16);
  EXPECT_EQ(c->warps, 1);
  EXPECT_EQ(c->splits, TileConfig::kAutoSplits);
  p.seqLenQ = 8; // 64 packed rows: 4 warps
  c = decodeGpuConfig(spec, p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->blockM, 64);
  EXPECT_EQ(c->warps, 4);
  p.seqLenQ = 9; // 72 rows
  EXPECT_FALSE(decodeGpuConfig(spec, p));
  p.seqLenQ = 1;
  p.seqLenKV = 512;
  EXPECT_FALSE(decodeGpuConfig(spec, p));
  p.seqLenKV = 4096;
  spec.headDimV = 512;
  EXPECT_FALSE(decodeGpuConfig(spec, p));
}

} // namespace
