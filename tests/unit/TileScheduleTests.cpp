//===- TileScheduleTests.cpp - The persistent forward's tile schedule -----===//
//
/// \file
/// kernels/TileSchedule.h, which the launcher makes for a scheduled
/// (causal) persistent kernel: every tile exactly once; the programs'
/// modelled loads within 2% of each other at issue 13's causal shapes
/// (the fixed stride over the heaviest Q blocks first is 3-6% off, the
/// one-tile-per-program order of heads far more); heads in groups whose K
/// and V fit the L2 budget, each group's tiles after the last group's in
/// every program and heaviest first within it; the causal cost of each Q
/// block, bottom-right aligned. The scheduled kernel itself, its record
/// and its argument: KernelLaunch.ScheduledCausalPersistentKernel.
//
//===----------------------------------------------------------------------===//

#include "kernels/TileSchedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

using namespace flashjit;

namespace {

/// Every tile once, the offsets in order, the words' size.
void expectEveryTileOnce(const TileSchedule &s) {
  const int64_t tiles = s.blocks * s.heads;
  ASSERT_EQ(int64_t(s.words.size()), s.programs + 1 + tiles);
  EXPECT_EQ(s.words[0], 0);
  EXPECT_EQ(s.words[size_t(s.programs)], tiles);
  std::vector<int> seen(size_t(tiles), 0);
  for (int64_t p = 0; p < s.programs; ++p) {
    ASSERT_LE(s.words[size_t(p)], s.words[size_t(p) + 1]);
    for (int32_t w : s.tilesOf(p)) {
      ASSERT_GE(w, 0);
      ASSERT_LT(w, tiles);
      ++seen[size_t(w)];
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), tiles);
}

/// The busiest program's load over the mean, of programs taking tiles
/// w = p, p + programs, ... of \p order (the fixed stride).
double strideImbalance(const std::vector<double> &costs,
                       const std::vector<int64_t> &orderBlocks,
                       int64_t programs) {
  std::vector<double> load(size_t(programs), 0);
  for (size_t i = 0; i < orderBlocks.size(); ++i)
    load[i % size_t(programs)] += costs[size_t(orderBlocks[i])];
  double total = std::accumulate(load.begin(), load.end(), 0.0);
  return *std::max_element(load.begin(), load.end()) /
         (total / double(programs));
}

} // namespace

TEST(TileSchedule, CausalCostsAreBottomRightAligned) {
  // Nq = Nkv: Q block m sees (m + 1) Br keys.
  std::vector<double> c = causalBlockCosts(512, 512, 128, 128, 0.5);
  EXPECT_EQ(c, (std::vector<double>{1.5, 2.5, 3.5, 4.5}));
  // Nkv > Nq: the first block sees Nkv - Nq more keys.
  c = causalBlockCosts(256, 1000, 128, 128, 0);
  EXPECT_EQ(c, (std::vector<double>{7, 8}));
  // Nq > Nkv: the first rows see no key (the fixed part alone); a partial
  // last Q block counts its own last row.
  c = causalBlockCosts(300, 100, 128, 64, 0.5);
  EXPECT_EQ(c, (std::vector<double>{0.5, 1.5, 2.5}));
}

TEST(TileSchedule, GroupsFitTheL2Budget) {
  // N 16K, d 128, bf16: 8 MiB of K and V a head; 25 MiB hold 3.
  EXPECT_EQ(l2GroupHeads(16384, 128, 128, 1, 2, 25 << 20), 3);
  // GQA 4: four query heads share one K and V.
  EXPECT_EQ(l2GroupHeads(16384, 128, 128, 4, 2, 25 << 20), 12);
  // More than the budget: one head a group.
  EXPECT_EQ(l2GroupHeads(1 << 20, 256, 256, 1, 2, 25 << 20), 1);
}

TEST(TileSchedule, BalancesIssue13sCausalShapes) {
  struct Shape {
    int64_t seq, heads; // batch * heads
  };
  for (Shape sh : {Shape{16384, 16}, Shape{1024, 256}, Shape{4096, 64},
                   Shape{3000, 60}}) {
    SCOPED_TRACE(::testing::Message()
                 << "N " << sh.seq << ", batch * heads " << sh.heads);
    std::vector<double> costs = causalBlockCosts(sh.seq, sh.seq, 128, 128, 0.5);
    const int64_t group = l2GroupHeads(sh.seq, 128, 128, 1, 2, 25 << 20);
    TileSchedule s = scheduleTiles(costs, sh.heads, 132, group);
    expectEveryTileOnce(s);
    EXPECT_LT(s.imbalance, 1.02);
    // The fixed stride over the heaviest Q blocks of all heads first (the
    // kernel's order without a schedule) is further off where it can be.
    std::vector<int64_t> levels;
    for (int64_t m = int64_t(costs.size()) - 1; m >= 0; --m)
      for (int64_t h = 0; h < sh.heads; ++h)
        levels.push_back(m);
    if (sh.seq == 16384)
      EXPECT_GT(strideImbalance(costs, levels, 132), 1.05);
  }
}

TEST(TileSchedule, GroupsRunInOrderHeaviestFirst) {
  std::vector<double> costs = causalBlockCosts(4096, 4096, 128, 128, 0.5);
  const int64_t blocks = int64_t(costs.size()), heads = 24, group = 5;
  TileSchedule s = scheduleTiles(costs, heads, 40, group);
  expectEveryTileOnce(s);
  for (int64_t p = 0; p < s.programs; ++p) {
    int64_t lastGroup = -1;
    double lastCost = 1e30;
    for (int32_t w : s.tilesOf(p)) {
      const int64_t g = (w / blocks) / group;
      const double cost = costs[size_t(w % blocks)];
      ASSERT_GE(g, lastGroup) << "program " << p;
      if (g == lastGroup)
        EXPECT_LE(cost, lastCost) << "program " << p;
      lastGroup = g;
      lastCost = cost;
    }
  }
}

TEST(TileSchedule, FewerTilesThanProgramsGiveEachOne) {
  std::vector<double> costs = causalBlockCosts(200, 200, 128, 128, 0.5);
  TileSchedule s = scheduleTiles(costs, 3, 132, 1);
  EXPECT_EQ(s.programs, 6);
  expectEveryTileOnce(s);
  for (int64_t p = 0; p < s.programs; ++p)
    EXPECT_EQ(s.tilesOf(p).size(), 1u);
}
