//===- TileSchedule.cpp - The persistent forward's tile schedule ----------===//

#include "kernels/TileSchedule.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

namespace flashjit {

std::vector<double> causalBlockCosts(int64_t seqQ, int64_t seqKV,
                                     int64_t blockM, int64_t blockN,
                                     double fixed) {
  const int64_t blocks = (seqQ + blockM - 1) / blockM;
  std::vector<double> costs(size_t(blocks), fixed);
  for (int64_t m = 0; m < blocks; ++m) {
    // Row i sees keys j <= i + seqKV - seqQ: the block's last row the most.
    const int64_t lastRow = std::min(seqQ, (m + 1) * blockM) - 1;
    const int64_t keys =
        std::clamp<int64_t>(lastRow + seqKV - seqQ + 1, 0, seqKV);
    costs[size_t(m)] += double((keys + blockN - 1) / blockN);
  }
  return costs;
}

int64_t l2GroupHeads(int64_t seqKV, int64_t headDimQK, int64_t headDimV,
                     int64_t gqa, int64_t elementBytes, int64_t l2Bytes) {
  const int64_t kvBytes = seqKV * (headDimQK + headDimV) * elementBytes;
  const int64_t perQueryHead =
      std::max<int64_t>(1, kvBytes / std::max<int64_t>(gqa, 1));
  return std::max<int64_t>(1, l2Bytes / perQueryHead);
}

TileSchedule scheduleTiles(const std::vector<double> &costs, int64_t heads,
                           int64_t programs, int64_t groupHeads) {
  TileSchedule s;
  s.blocks = int64_t(costs.size());
  s.heads = heads;
  const int64_t tiles = s.blocks * heads;
  s.programs = std::max<int64_t>(1, std::min(programs, tiles));
  groupHeads = std::clamp<int64_t>(groupHeads, 1, std::max<int64_t>(heads, 1));

  // The Q blocks, heaviest first (stable: the earlier one on a tie).
  std::vector<int64_t> byCost(size_t(s.blocks));
  std::iota(byCost.begin(), byCost.end(), 0);
  std::stable_sort(byCost.begin(), byCost.end(), [&](int64_t a, int64_t b) {
    return costs[size_t(a)] > costs[size_t(b)];
  });

  // Longest processing time first, over the grouped order: a min-heap of
  // (modelled load, program).
  using Slot = std::pair<double, int64_t>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> free;
  for (int64_t p = 0; p < s.programs; ++p)
    free.push({0.0, p});
  std::vector<std::vector<int32_t>> lists(size_t(s.programs));
  std::vector<double> load(size_t(s.programs), 0.0);
  // Groups as even as possible: a small last group would leave its
  // heaviest tile alone at the end (16 heads by 3: 1.048 of the mean
  // against 1.003 by 3, 3, 3, 3, 2, 2).
  const int64_t groups = (heads + groupHeads - 1) / groupHeads;
  for (int64_t g = 0, first = 0; g < groups; ++g) {
    const int64_t size = heads / groups + (g < heads % groups ? 1 : 0);
    for (int64_t m : byCost)
      for (int64_t bh = first; bh < first + size; ++bh) {
        auto [at, p] = free.top();
        free.pop();
        lists[size_t(p)].push_back(int32_t(bh * s.blocks + m));
        load[size_t(p)] = at + costs[size_t(m)];
        free.push({load[size_t(p)], p});
      }
    first += size;
  }

  s.words.reserve(size_t(s.programs + 1 + tiles));
  int32_t at = 0;
  for (const std::vector<int32_t> &l : lists) {
    s.words.push_back(at);
    at += int32_t(l.size());
  }
  s.words.push_back(at);
  for (const std::vector<int32_t> &l : lists)
    s.words.insert(s.words.end(), l.begin(), l.end());
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (total > 0)
    s.imbalance = *std::max_element(load.begin(), load.end()) /
                  (total / double(s.programs));
  return s;
}

} // namespace flashjit
