//===- MaskBlocksTests.cpp - A mask_mod's blocks, classified by a kernel --===//
//
/// \file
/// The block classification of a mask_mod region (issue 14 item 4,
/// `@f_blocks`, kernels/KernelABI.h abi::blocks), run by the CPU mode, which
/// executes the tile program the GPU compiles too: its layout equals the
/// float64 reference's classification of every element (listed where the
/// region keeps one, full where it keeps all), for masks of positions and
/// of captured tensors, per batch and head and broadcast, with padding past
/// Nq and Nkv and blocks wider than one tile; the forward with that layout
/// matches the reference and gives the same bits as with the host's; bad
/// requests are named errors; a varlen batch's sequences are classified
/// each on its own; and the GPU modules hold the function.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"
#include "kernels/Varlen.h"

#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <random>

using namespace flashjit;
using namespace flashjit::test;

namespace {

/// Keep j <= i + 40 * h where seg[i] == seg[j], and in batch 1 only the
/// even keys: depends on every argument.
const char *kEveryArgument = R"({
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %c40 = arith.constant 40 : index
  %c2 = arith.constant 2 : index
  %c1 = arith.constant 1 : index
  %reach = arith.muli %h, %c40 : index
  %top = arith.addi %i, %reach : index
  %le = arith.cmpi sle, %j, %top : index
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  %odd = arith.remui %j, %c2 : index
  %even = arith.cmpi eq, %odd, %c1 : index
  %one = arith.cmpi eq, %b, %c1 : index
  %drop = arith.andi %one, %even : i1
  %t = arith.constant true
  %keepodd = arith.xori %drop, %t : i1
  %a = arith.andi %le, %same : i1
  %keep = arith.andi %a, %keepodd : i1
  attn.yield %keep : i1
})";

/// A causal mask shifted by 50: j <= i + 50. The blocks below the diagonal
/// are full, so keys of the next block read by mistake would show.
const char *kBand = R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c50 = arith.constant 50 : index
  %top = arith.addi %i, %c50 : index
  %keep = arith.cmpi sle, %j, %top : index
  attn.yield %keep : i1
})";

/// The float64 classification; and a match of the listed entries (the
/// check also names the first row that differs).
BlockSparseLayout referenceBlocks(const AttentionSpec &spec, const Problem &p,
                                  const Captures &captures, int64_t batch,
                                  int64_t heads) {
  return referenceMaskBlocks(spec, p, captures, batch, heads);
}

void expectSameLayout(const BlockSparseLayout &got,
                      const BlockSparseLayout &want) {
  ASSERT_EQ(got.counts, want.counts);
  EXPECT_TRUE(sameListedBlocks(got, want));
  for (size_t row = 0; row < got.counts.size(); ++row)
    for (int32_t t = 0; t < got.counts[row]; ++t) {
      size_t at = row * size_t(got.kvBlocks) + size_t(t);
      EXPECT_EQ(got.indices[at], want.indices[at]) << "row " << row;
    }
}

/// Segment ids of \p n positions: documents of 37, 61, 20, then the rest.
std::vector<float> documents(int64_t n) {
  std::vector<float> seg(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    seg[size_t(j)] = j < 37 ? 0.f : j < 98 ? 1.f : j < 118 ? 2.f : 3.f;
  return seg;
}

AttentionSpec sparseMask(const char *region, int64_t sparseBlock) {
  AttentionSpec spec = withMaskModRegion(AttentionSpec(), region);
  spec.headDimQK = spec.headDimV = 32;
  spec.blockSparse = true;
  spec.sparseBlock = sparseBlock;
  return spec;
}

} // namespace

/// Every argument of the region matters: per batch and head the layout is
/// the reference's (and another region's is not), at a sparse block that
/// divides neither Nq nor Nkv.
TEST(MaskBlocks, EqualTheReferencePerBatchAndHead) {
  AttentionSpec spec = sparseMask(kEveryArgument, 32);
  Problem p = makeProblem(2, 2, 150, 130);
  AttentionData data;
  data.captures = {documents(150)};
  auto kernel = CpuKernel::compile(spec, tileConfig(32, 32));
  BlockSparseLayout got = kernel->classifyBlocks(p, data, 2, 2);
  BlockSparseLayout want = referenceBlocks(spec, p, data.captures, 2, 2);
  expectSameLayout(got, want);
  // Lists and full marks both occur, and differ between batches and heads.
  int fulls = 0;
  for (int32_t e : want.indices)
    fulls += e < 0;
  EXPECT_GT(fulls, 0);
  EXPECT_NE(want.density(), 1.0);
  EXPECT_NE(
      std::vector<int32_t>(want.counts.begin(), want.counts.begin() + 5),
      std::vector<int32_t>(want.counts.begin() + 5, want.counts.begin() + 10));
  // The check can fail: the band's blocks are not these.
  AttentionSpec band = sparseMask(kBand, 32);
  BlockSparseLayout other = CpuKernel::compile(band, tileConfig(32, 32))
                                ->classifyBlocks(p, AttentionData(), 2, 2);
  EXPECT_NE(other.counts, want.counts);
  expectSameLayout(other, referenceBlocks(band, p, {}, 2, 2));
}

/// A mask of positions broadcast over batch and heads (a 1 x 1 layout);
/// sparse blocks of 160 keys span two tiles of the evaluation (128 + 32).
TEST(MaskBlocks, BroadcastAndBlocksWiderThanATile) {
  for (int64_t block : {int64_t(32), int64_t(160)}) {
    SCOPED_TRACE(block);
    AttentionSpec spec = sparseMask(kBand, block);
    Problem p = makeProblem(3, 2, 700, 500);
    BlockSparseLayout got = CpuKernel::compile(spec, tileConfig(32, 32))
                                ->classifyBlocks(p, AttentionData(), 1, 1);
    EXPECT_EQ(got.batch, 1);
    EXPECT_EQ(got.heads, 1);
    expectSameLayout(got, referenceBlocks(spec, p, {}, 1, 1));
  }
}

/// The forward on the classified layout: within the reference's bound and
/// the same bits as on the host's layout (the kernel reads only the entries
/// up to each count).
TEST(MaskBlocks, TheForwardRunsOnTheClassifiedLayout) {
  AttentionSpec spec = sparseMask(kEveryArgument, 32);
  Problem p = makeProblem(2, 2, 150, 130);
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  data.captures = {documents(150)};
  auto kernel = CpuKernel::compile(spec, tileConfig(32, 32));
  BlockSparseLayout got = kernel->classifyBlocks(p, data, 2, 2);
  BlockSparseLayout host = referenceBlocks(spec, p, data.captures, 2, 2);
  got.checkFits(p, spec.sparseBlock);
  AttentionData a = data, b = data;
  kernel->run(p, a, &got);
  kernel->run(p, b, &host);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(*a.o.buffer, *b.o.buffer);
  ReferenceResult ref = referenceForward(spec, p, a, &got);
  EXPECT_LT(compareWithReference(spec, p, a, ref).relErr(), 1e-2);
}

/// A varlen batch: each sequence (a row of the layout) classified on its
/// own lengths and positions, as the forward sees them: the reference's
/// per-sequence classification, count 0 past a sequence's Q blocks, the
/// attention on that layout the mask's with no layout; over the longest
/// sequence's lengths the layout would differ (the check can fail).
TEST(MaskBlocks, VarlenSequencesAreClassifiedAlone) {
  AttentionSpec spec = sparseMask(kBand, 32);
  spec.varlen = true;
  const std::vector<int64_t> lensQ = {150, 1, 70, 33},
                             lensKV = {130, 40, 200, 1};
  Problem p = varlenProblem(makeProblem(1, 2, 1, 1), lensQ, lensKV);
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionData data = makeRandomVarlenInputs(spec, p, lensQ, lensKV, rng);
  auto kernel = CpuKernel::compile(spec, tileConfig(32, 32));
  for (int64_t heads : {int64_t(2), int64_t(1)}) {
    SCOPED_TRACE(heads);
    BlockSparseLayout got = kernel->classifyBlocks(p, data, 4, heads);
    expectSameLayout(got, referenceMaskBlocks(spec, p, {}, 4, heads,
                                              data.cuSeqQ, data.cuSeqKV));
    // Sequence 1 has one query: one Q block; the others count 0.
    for (int64_t qb = 1; qb < got.qBlocks; ++qb)
      EXPECT_EQ(got.counts[size_t((1 * heads) * got.qBlocks + qb)], 0);
    AttentionSpec dense = spec;
    dense.varlen = false;
    EXPECT_NE(referenceMaskBlocks(dense, p, {}, 4, heads).counts, got.counts);
  }
  BlockSparseLayout layout = kernel->classifyBlocks(p, data, 4, 2);
  layout.checkFits(p, spec.sparseBlock);
  kernel->run(p, data, &layout);
  AttentionSpec maskOnly = spec;
  maskOnly.blockSparse = false;
  ErrorReport err = checkVarlenForward(maskOnly, p, data);
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.relErr(), 1e-2);
  // A row per sequence: no broadcast over them.
  EXPECT_THROW(kernel->classifyBlocks(p, data, 1, 2), SpecError);
  AttentionData noOffsets = data;
  noOffsets.cuSeqKV.clear();
  EXPECT_THROW(kernel->classifyBlocks(p, noOffsets, 4, 2), SpecError);
}

TEST(MaskBlocks, BadRequestsAreNamedErrors) {
  AttentionSpec spec = sparseMask(kBand, 32);
  Problem p = makeProblem(2, 2, 64, 64);
  auto kernel = CpuKernel::compile(spec, tileConfig(32, 32));
  EXPECT_THROW(kernel->classifyBlocks(p, AttentionData(), 3, 1), SpecError);
  EXPECT_THROW(kernel->classifyBlocks(p, AttentionData(), 1, 4), SpecError);
  AttentionSpec dense = withMaskModRegion(AttentionSpec(), kBand);
  dense.headDimQK = dense.headDimV = 32;
  EXPECT_THROW(CpuKernel::compile(dense, tileConfig(32, 32))
                   ->classifyBlocks(p, AttentionData(), 1, 1),
               SpecError);
  // Past the i32 the classification addresses its layout with.
  Problem huge = makeProblem(64, 64, 1 << 20, 1 << 20);
  try {
    kernel->classifyBlocks(huge, AttentionData(), 64, 64);
    ADD_FAILURE() << "a layout past 2^31 entries was classified";
  } catch (const SpecError &e) {
    EXPECT_NE(std::string(e.what()).find("past the classification's 2^31"),
              std::string::npos)
        << e.what();
  }
  // The mask's captured tensor is required.
  AttentionSpec seg = sparseMask(kEveryArgument, 32);
  EXPECT_THROW(CpuKernel::compile(seg, tileConfig(32, 32))
                   ->classifyBlocks(p, AttentionData(), 2, 2),
               SpecError);
}

/// Which of batch and head a mask reads decides whether its layout may
/// broadcast over them (`--mask-blocks`).
TEST(MaskBlocks, TheRegionSaysWhetherItReadsBatchAndHead) {
  using Reads = std::pair<bool, bool>;
  EXPECT_EQ(maskModReadsBatchHead(sparseMask(kEveryArgument, 32)),
            Reads(true, true));
  EXPECT_EQ(maskModReadsBatchHead(sparseMask(kBand, 32)), Reads(false, false));
  EXPECT_EQ(maskModReadsBatchHead(sparseMask(R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %k = arith.cmpi sle, %j, %h : index
  attn.yield %k : i1
})",
                                             32)),
            Reads(false, true));
  EXPECT_EQ(maskModReadsBatchHead(AttentionSpec()), Reads(false, false));
}

/// The GPU modules (sm_80's mma.sync and sm_90a's wgmma forwards) hold the
/// classification beside the forward, a row kernel of a warp per Q block.
TEST(MaskBlocks, GpuModulesHoldTheClassification) {
  AttentionSpec spec = sparseMask(kEveryArgument, 64);
  spec.headDimQK = spec.headDimV = 128;
  for (bool varlen : {false, true}) {
    spec.varlen = varlen;
    for (const char *arch : {"sm_80", "sm_90a"}) {
      SCOPED_TRACE(::testing::Message() << arch << (varlen ? " varlen" : ""));
      GpuTarget target;
      target.arch = arch;
      std::string ptx = emitStage(spec, tileConfig(64, 64), Stage::Ptx, target);
      EXPECT_NE(ptx.find(".entry attention_blocks("), std::string::npos);
      EXPECT_NE(ptx.find(".entry attention_blocks_list("), std::string::npos);
      EXPECT_NE(ptx.find(".entry attention("), std::string::npos);
    }
  }
}
