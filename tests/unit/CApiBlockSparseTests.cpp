//===- CApiBlockSparseTests.cpp - The C API's block-sparse backward -------===//
//
/// \file
/// The block-sparse backward through libflashjit.so on the CPU: against
/// float64 per batch and head and broadcast, and with the layout's KV-major
/// transpose given by the caller (flashjit_backward_kv_major): the same
/// bits as flashjit_backward, and a transpose that is not the layout's
/// refused with its place named.
//
//===----------------------------------------------------------------------===//

#include "CApiTestUtil.h"
#include "flashjit.h"

#include "kernels/HostTensor.h"

#include <algorithm>
#include <cstdint>
#include <gtest/gtest.h>
#include <random>
#include <string>
#include <vector>

using namespace flashjit;
using namespace flashjit::capitest;

TEST(CApi, BlockSparseBackwardOnTheCpu) {
  Handle h;
  SmallProblem sp;
  makeBlockSparse(sp, 16);
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Per batch and head, and broadcast over both.
  for (auto [batch, heads] : {std::pair<int64_t, int64_t>{2, 4}, {1, 1}}) {
    BlockSparseLayout l =
        BlockSparseLayout::random(batch, heads, 2, 3, 0.5, seed + batch);
    flashjit_layout cl = toC(l);
    ASSERT_EQ(sp.run(h, &cl), FLASHJIT_OK) << lastError();
    std::mt19937_64 rng(seed);
    AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
    ASSERT_EQ(sp.backward(h, g, &cl), FLASHJIT_OK) << lastError();
    expectGradsMatch(sp, g, &l);
  }
}
/// flashjit_backward_kv_major: with the layout's transpose (full pairs
/// marked) the gradients are flashjit_backward's, bit for bit; a transpose
/// that differs in a count or an entry, or has the wrong dimensions, or none,
/// is refused with its place named.
TEST(CApi, BackwardWithTheCallersTranspose) {
  Handle h;
  SmallProblem sp;
  makeBlockSparse(sp, 16);
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 pick(seed);
  std::vector<uint8_t> dense(size_t(2 * 4 * 2 * 3));
  for (uint8_t &cell : dense)
    cell = uint8_t(pick() % 3); // 0 none, 1 listed, 2 listed and full
  BlockSparseLayout l = BlockSparseLayout::fromDense(2, 4, 2, 3, dense);
  BlockSparseLayout t = l.transposed();
  flashjit_layout cl = toC(l), ct = toC(t);
  ASSERT_EQ(sp.run(h, &cl), FLASHJIT_OK) << lastError();
  // The same d_o twice (the tensors own their buffers: two draws).
  std::mt19937_64 rng(seed), rng2(seed);
  AttentionGrads g = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng);
  AttentionGrads given = makeRandomGrads(sp.specCpp, sp.p, sp.d, rng2);
  ASSERT_EQ(sp.backward(h, g, &cl), FLASHJIT_OK) << lastError();
  ASSERT_EQ(sp.backwardKvMajor(h, given, &cl, &ct), FLASHJIT_OK) << lastError();
  EXPECT_EQ(*given.dq.buffer, *g.dq.buffer);
  EXPECT_EQ(*given.dk.buffer, *g.dk.buffer);
  EXPECT_EQ(*given.dv.buffer, *g.dv.buffer);
  expectGradsMatch(sp, given, &l);

  auto refused = [&](const flashjit_layout *kv, const std::string &what) {
    EXPECT_EQ(sp.backwardKvMajor(h, given, &cl, kv),
              FLASHJIT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find(what), std::string::npos) << lastError();
  };
  refused(nullptr, "kv_layout is NULL");
  // A listed KV block whose row counts one Q block less.
  int64_t row = std::find_if(t.counts.begin(), t.counts.end(),
                             [](int32_t n) { return n > 0; }) -
                t.counts.begin();
  ASSERT_LT(row, int64_t(t.counts.size()));
  BlockSparseLayout fewer = t;
  fewer.counts[size_t(row)] -= 1;
  flashjit_layout cf = toC(fewer);
  refused(&cf, "not the layout's KV-major transpose");
  // The same entries with a full pair's mark flipped.
  BlockSparseLayout flipped = t;
  int32_t &entry = flipped.indices[size_t(row * t.kvBlocks)];
  entry = ~entry;
  flashjit_layout cm = toC(flipped);
  refused(&cm, "entry 0 is");
  // The layout itself in place of its transpose (2 x 3 blocks, not 3 x 2).
  refused(&cl, "the KV-major transpose of layout is 2 x 4 x 3 x 2");
}
