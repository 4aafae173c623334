//===- MaskModTests.cpp - Mask modifiers: the mask_mod region -------------===//
//
/// \file
/// A description's mask_mod region ((batch, head, q_idx, kv_idx, captured
/// tensors) -> i1) masks the scores where it yields false, after any
/// score_mod. Checked on the CPU mode (the tile programs the GPU compiles
/// too): forward and backward against the float64 reference, which
/// evaluates the region itself and fails the kernel under another mask; a
/// score_mod with a learned bias (and its gradient) beside a document mask
/// over captured segment ids, against the same attention written as one
/// score_mod region; rows the mask empties (0, lse -inf, no NaN); the
/// spec's name, JSON and canonical text; the named errors; and the GPU
/// kernels (sm_80, sm_90a) that read the mask's captured tensor.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "kernels/HostTensor.h"

#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace flashjit;
using namespace flashjit::test;

namespace {

/// Stripes under a causal band: keep j <= i with i = j (mod 3).
const char *kStripes = R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c3 = arith.constant 3 : index
  %a = arith.remui %i, %c3 : index
  %c = arith.remui %j, %c3 : index
  %same = arith.cmpi eq, %a, %c : index
  %le = arith.cmpi sle, %j, %i : index
  %keep = arith.andi %same, %le : i1
  attn.yield %keep : i1
})";

/// The same stripes with i = j + 1 (mod 3): another mask, for the check
/// that can fail.
const char *kOtherStripes = R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %j1 = arith.addi %j, %c1 : index
  %a = arith.remui %i, %c3 : index
  %c = arith.remui %j1, %c3 : index
  %same = arith.cmpi eq, %a, %c : index
  %le = arith.cmpi sle, %j, %i : index
  %keep = arith.andi %same, %le : i1
  attn.yield %keep : i1
})";

/// A document mask: keep where seg[i] == seg[j].
const char *kDocument = kDocumentMaskRegion;

/// s + bias[(h * Nq + i) * Nkv + j] (Nq = 70, Nkv = 90).
const char *kBias = R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %bias: memref<?xf32>):
  %nq = arith.constant 70 : index
  %nkv = arith.constant 90 : index
  %hq = arith.muli %h, %nq : index
  %row = arith.addi %hq, %i : index
  %rk = arith.muli %row, %nkv : index
  %at = arith.addi %rk, %j : index
  %x = memref.load %bias[%at] : memref<?xf32>
  %y = arith.addf %s, %x : f32
  attn.yield %y : f32
})";

Problem problem(int64_t heads, int64_t nq, int64_t nkv) {
  return makeProblem(2, heads, nq, nkv);
}

/// Segment ids for 90 positions: documents of 25, 30 and 35.
std::vector<float> segments() {
  std::vector<float> seg(90);
  for (int64_t j = 0; j < 90; ++j)
    seg[size_t(j)] = j < 25 ? 0.f : j < 55 ? 1.f : 2.f;
  return seg;
}

TEST(MaskMods, ForwardMatchesTheReferenceAndNotAnotherMask) {
  AttentionSpec spec = withMaskModRegion(AttentionSpec(), kStripes);
  ASSERT_TRUE(spec.scoreMod.empty());
  ASSERT_FALSE(spec.maskModRegion.empty());
  ASSERT_EQ(spec.captures, 0);
  spec.headDimQK = spec.headDimV = 32;
  AttentionSpec other = withMaskModRegion(spec, kOtherStripes);
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (auto [mask, gqa] : {std::pair{MaskKind::None, 1}, {MaskKind::Causal, 2}}) {
    spec.mask = other.mask = mask;
    spec.gqaGroup = other.gqaGroup = gqa;
    Problem p = problem(4, 77, 100);
    AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
    CpuKernel::compile(spec, tileConfig(32, 32))->run(p, data, nullptr);
    ErrorReport same = compareWithReference(
        spec, p, data, referenceForward(spec, p, data, nullptr));
    EXPECT_EQ(same.nanCount, 0);
    EXPECT_EQ(same.lseMismatch, 0);
    EXPECT_LT(same.relErr(), 1e-2);
    EXPECT_GT(compareWithReference(spec, p, data,
                                   referenceForward(other, p, data, nullptr))
                  .relErr(),
              1e-1);
  }
}

/// A learned bias (score_mod, with its gradient) beside a document mask
/// (mask_mod over captured segment ids) is the attention of the one region
/// that does both (kBiasAndDocumentsRegion, AttentionCases.h); forward, dQ, dK, dV and the bias's gradient match the
/// float64 reference, in both dQ modes (the bias's gradient with atomic
/// dQ only: it is summed by atomic adds).
TEST(MaskMods, ScoreModBesideAMaskIsTheOneRegionAttention) {
  AttentionSpec two = withMaskModRegion(
      withScoreModRegion(AttentionSpec(), kBias), kDocument);
  ASSERT_EQ(two.captures, 2);
  ASSERT_EQ(two.maskCaptures, 1);
  AttentionSpec one =
      withScoreModRegion(AttentionSpec(), kBiasAndDocumentsRegion);
  for (AttentionSpec *s : {&two, &one}) {
    s->headDimQK = s->headDimV = 32;
    s->mask = MaskKind::Causal;
    s->gqaGroup = 2;
  }
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t H = 2, Nq = 70, Nkv = 90;
  Problem p = problem(H, Nq, Nkv);
  AttentionData data = makeRandomInputs(two, p, QKVLayout::Separate, rng);
  data.captures = {uniform(rng, size_t(H * Nq * Nkv), -2.f, 2.f), segments()};
  AttentionData oneData = data;
  oneData.o = HalfTensor::packed(data.o.shape);
  oneData.lse.assign(data.lse.size(), 0.f);
  CpuKernel::compile(two, tileConfig(32, 32))->run(p, data, nullptr);
  CpuKernel::compile(one, tileConfig(32, 32))->run(p, oneData, nullptr);
  ErrorReport err = compareWithReference(
      two, p, data, referenceForward(two, p, data, nullptr));
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.relErr(), 1e-2);
  // The two descriptions compute the same scores: the same bits.
  int64_t differ = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < Nq; ++n)
        for (int64_t d = 0; d < 32; ++d)
          differ += data.o.at(b, h, n, d) != oneData.o.at(b, h, n, d);
  EXPECT_EQ(differ, 0);

  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic dQ");
    AttentionSpec bwd = two;
    bwd.direction = Direction::Backward;
    bwd.deterministic = deterministic;
    bwd.captureGrads = deterministic ? 0 : 1; // the bias, not the ids
    AttentionSpec fwd = two;
    fwd.captureGrads = bwd.captureGrads;
    AttentionGrads g = makeRandomGrads(two, p, data, rng);
    for (const std::vector<float> &c : data.captures)
      g.captureGrads.push_back(std::vector<float>(c.size()));
    CpuBackwardKernel::compile(bwd, tileConfig(32, 32))
        ->run(p, data, g, nullptr);
    BackwardErrorReport e =
        compareBackward(fwd, p, g, referenceBackward(fwd, p, data, g, nullptr));
    EXPECT_EQ(e.nanCount, 0);
    EXPECT_LT(e.relErr(), 1e-2);
    if (!deterministic) {
      EXPECT_GT(e.captureRelErr, 0);
      EXPECT_LT(e.captureRelErr, 1e-2);
    }
    for (float x : g.captureGrads[1])
      EXPECT_EQ(x, 0.f); // the segment ids take no gradient
    // Against another document layout the gradients differ.
    AttentionData shifted = data;
    std::rotate(shifted.captures[1].begin(), shifted.captures[1].begin() + 10,
                shifted.captures[1].end());
    EXPECT_GT(
        compareBackward(fwd, p, g,
                        referenceBackward(fwd, p, shifted, g, nullptr))
            .relErr(),
        1e-2);
  }
}

/// Rows whose mask keeps no key: O = 0 and lse = -inf, forward; their
/// gradients are finite (0) too.
TEST(MaskMods, RowsTheMaskEmptiesGiveZeroAndMinusInfinity) {
  // Queries below 20 see nothing; the others see keys j <= i.
  AttentionSpec spec = withMaskModRegion(AttentionSpec(), R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c20 = arith.constant 20 : index
  %late = arith.cmpi sge, %i, %c20 : index
  %le = arith.cmpi sle, %j, %i : index
  %keep = arith.andi %late, %le : i1
  attn.yield %keep : i1
})");
  spec.headDimQK = spec.headDimV = 32;
  std::mt19937_64 rng(freshSeed());
  Problem p = problem(2, 50, 50);
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  CpuKernel::compile(spec, tileConfig(32, 32))->run(p, data, nullptr);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t n = 0; n < 50; ++n) {
      float lse = data.lse[size_t(h * 50 + n)];
      if (n < 20) {
        EXPECT_TRUE(std::isinf(lse) && lse < 0) << "row " << n;
        for (int64_t d = 0; d < 32; ++d)
          EXPECT_EQ(data.o.at(0, h, n, d) & 0x7fff, 0) << "row " << n;
      } else {
        EXPECT_TRUE(std::isfinite(lse)) << "row " << n;
      }
    }
  ErrorReport err = compareWithReference(
      spec, p, data, referenceForward(spec, p, data, nullptr));
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.relErr(), 1e-2);
  AttentionSpec bwd = spec;
  bwd.direction = Direction::Backward;
  AttentionGrads g = makeRandomGrads(spec, p, data, rng);
  CpuBackwardKernel::compile(bwd, tileConfig(32, 32))->run(p, data, g, nullptr);
  BackwardErrorReport e =
      compareBackward(spec, p, g, referenceBackward(spec, p, data, g, nullptr));
  EXPECT_EQ(e.nanCount, 0);
  EXPECT_LT(e.relErr(), 1e-2);
}

TEST(MaskMods, TheRegionIsPartOfTheNameJsonAndDescription) {
  AttentionSpec a = withMaskModRegion(AttentionSpec(), kStripes);
  // Another spelling of the same region (names, a constant written twice).
  AttentionSpec b = withMaskModRegion(AttentionSpec(), R"({
^bb0(%batch: index, %head: index, %q: index, %k: index):
  %three = arith.constant 3 : index
  %again = arith.constant 3 : index
  %x = arith.remui %q, %three : index
  %y = arith.remui %k, %again : index
  %eq = arith.cmpi eq, %x, %y : index
  %causal = arith.cmpi sle, %k, %q : index
  %keep = arith.andi %eq, %causal : i1
  attn.yield %keep : i1
})");
  AttentionSpec c = withMaskModRegion(AttentionSpec(), kOtherStripes);
  EXPECT_EQ(a.maskModRegion, b.maskModRegion);
  EXPECT_EQ(a.name(), b.name());
  EXPECT_NE(a.name(), c.name());
  EXPECT_NE(a.name(), AttentionSpec().name());
  EXPECT_NE(a.toJson().find("\"mask_mod_region\":"), std::string::npos);
  // The description round-trips: its text read back is the same spec.
  KernelSource src;
  src.text = attnModuleText(a, "attention");
  src.name = "described";
  SourceInfo info = inspectSource(src);
  EXPECT_EQ(info.spec.toJson(), a.toJson());
  EXPECT_NE(src.text.find("mask_mod {"), std::string::npos);
}

TEST(MaskMods, BadRegionsAreNamedErrors) {
  auto message = [](const std::string &region) -> std::string {
    try {
      withMaskModRegion(AttentionSpec(), region);
    } catch (const SpecError &e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 1.0 : f32
  attn.yield %c : f32
})")
                .find("must yield an i1"),
            std::string::npos);
  EXPECT_NE(message(R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant true
  attn.yield %c : i1
})")
                .find("'f32' for batch"),
            std::string::npos);
  EXPECT_NE(message("stripes").find("expected its text"), std::string::npos);
  EXPECT_NE(message(R"({
^bb0(%b: index, %h: index, %i: index, %j: index, %t: memref<?xf32>):
  %c = arith.constant 0 : index
  %x = memref.load %t[%c, %c] : memref<?xf32>
  %k = arith.cmpf ogt, %x, %x : f32
  attn.yield %k : i1
})")
                .find("at one index"),
            std::string::npos);
  // The mask's captured tensors take no gradient; the data must match the
  // count.
  AttentionSpec spec = withMaskModRegion(AttentionSpec(), kDocument);
  spec.direction = Direction::Backward;
  spec.captureGrads = 1;
  EXPECT_THROW(spec.validate(), SpecError);
  spec.direction = Direction::Forward;
  spec.captureGrads = 0;
  Problem p = problem(1, 20, 20);
  std::mt19937_64 rng(1);
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  EXPECT_THROW(CpuKernel::compile(spec, tileConfig(32, 32))
                   ->run(p, data, nullptr),
               SpecError);
  // A tile stage that has inlined a mask cannot be checked: a named error.
  KernelSource tiled;
  tiled.text = emitStage(spec, tileConfig(32, 32), Stage::Tile);
  tiled.name = "tiled";
  EXPECT_THROW(inspectSource(tiled), CompileError);
}

TEST(MaskMods, GpuKernelsReadTheMasksCapturedTensor) {
  AttentionSpec spec = withMaskModRegion(
      withScoreModRegion(AttentionSpec(), kBias), kDocument);
  TileConfig tiling = tileConfig(64, 64);
  tiling.warps = 4;
  for (const char *arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    GpuTarget target;
    target.arch = arch;
    std::string ptx = compileToPtx(spec, tiling, target);
    // Two captured pointers after the f32 scale argument.
    const std::string f32 = ".param .f32 attention_param_32,";
    size_t at = ptx.find(f32);
    ASSERT_NE(at, std::string::npos);
    EXPECT_NE(ptx.find("attention_param_34\n", at), std::string::npos);
    EXPECT_EQ(ptx.find("attention_param_35"), std::string::npos);
    EXPECT_NE(ptx.find("setp.eq.f32"), std::string::npos);
  }
}

/// The GPU's default kernels of a block-sparse mask (the ring on sm_90a,
/// a branch around the mask for full blocks) and of a bounded mask of
/// positions compile to PTX, forward and backward: the scf.if on the
/// decoded entry or the bounds lowers on every path.
TEST(MaskMods, GpuKernelsWithFullBlocksCompile) {
  AttentionSpec sparse = withMaskModRegion(AttentionSpec(), kDocument);
  sparse.blockSparse = true;
  sparse.sparseBlock = 128;
  // A mask of positions, bounded per block without a layout.
  AttentionSpec bounded = withMaskModRegion(AttentionSpec(), R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c256 = arith.constant 256 : index
  %d = arith.subi %i, %j : index
  %near = arith.cmpi slt, %d, %c256 : index
  %past = arith.cmpi sle, %j, %i : index
  %keep = arith.andi %near, %past : i1
  attn.yield %keep : i1
})");
  for (const AttentionSpec &spec : {sparse, bounded})
  for (Direction dir : {Direction::Forward, Direction::Backward})
    for (const char *arch : {"sm_80", "sm_90a"}) {
      SCOPED_TRACE(::testing::Message()
                   << arch << (dir == Direction::Forward ? " fwd" : " bwd"));
      AttentionSpec s = spec;
      s.direction = dir;
      GpuTarget target;
      target.arch = arch;
      const bool hopper = std::string(arch) == "sm_90a";
      std::string ptx = compileToPtx(
          s,
          dir == Direction::Forward ? defaultGpuConfig(s, hopper, hopper)
                                    : defaultGpuBackwardConfig(s),
          target);
      if (spec.blockSparse) {
        EXPECT_NE(ptx.find("shr.s32"), std::string::npos);
        EXPECT_NE(ptx.find("setp.eq.f32"), std::string::npos);
      } else {
        EXPECT_NE(ptx.find(".entry attention"), std::string::npos);
      }
    }
}

/// A layout's full blocks (entries ~k, abi::fullBlockEntry): the kernel
/// skips the mask_mod there. A causal mask_mod over 4 x 4 blocks of 32
/// with the blocks below the diagonal full and the diagonal partial: the
/// same bits as every block partial (forward, both backward modes; the
/// mask is the identity on a full block), matching the reference; the
/// diagonal marked full too goes unmasked (the check can fail). The full
/// marks survive the backward's transposition.
TEST(MaskMods, FullBlocksSkipTheMaskBitForBit) {
  AttentionSpec spec = withMaskModRegion(AttentionSpec(), R"({
^bb0(%b: index, %h: index, %i: index, %j: index):
  %le = arith.cmpi sle, %j, %i : index
  attn.yield %le : i1
})");
  spec.headDimQK = spec.headDimV = 32;
  spec.blockSparse = true;
  spec.sparseBlock = 32;
  auto layout = [](uint8_t below, uint8_t diagonal) {
    std::vector<uint8_t> dense(16, 0);
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c <= r; ++c)
        dense[size_t(r * 4 + c)] = c == r ? diagonal : below;
    return BlockSparseLayout::fromDense(1, 1, 4, 4, dense);
  };
  BlockSparseLayout full = layout(2, 1), partial = layout(1, 1),
                    lie = layout(2, 2);
  EXPECT_LT(full.indices[4], 0); // row 1 lists block 0 as ~0
  EXPECT_TRUE(full.contains(0, 0, 1, 0));
  BlockSparseLayout t = full.transposed();
  EXPECT_LT(t.indices[0 * 4 + 1], 0); // KV block 0: Q block 1, full
  EXPECT_GE(t.indices[0 * 4 + 0], 0); // ... Q block 0, the diagonal
  std::mt19937_64 rng(freshSeed());
  Problem p = problem(2, 128, 128);
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  auto forward = [&](const BlockSparseLayout &l) {
    AttentionData d = data;
    d.o = HalfTensor::packed(data.o.shape);
    CpuKernel::compile(spec, tileConfig(32, 32))->run(p, d, &l);
    return d;
  };
  AttentionData a = forward(full), b = forward(partial), c = forward(lie);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(*a.o.buffer, *b.o.buffer);
  ReferenceResult ref = referenceForward(spec, p, a, &full);
  EXPECT_LT(compareWithReference(spec, p, a, ref).relErr(), 1e-2);
  EXPECT_GT(compareWithReference(spec, p, c, ref).relErr(), 1e-1);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic dQ");
    AttentionSpec bwd = spec;
    bwd.direction = Direction::Backward;
    bwd.deterministic = deterministic;
    AttentionGrads g = makeRandomGrads(spec, p, a, rng);
    auto backward = [&](const BlockSparseLayout &l) {
      AttentionGrads out = g;
      for (HalfTensor *x : {&out.dq, &out.dk, &out.dv})
        *x = HalfTensor::packed(x->shape);
      CpuBackwardKernel::compile(bwd, tileConfig(32, 32))
          ->run(p, a, out, &l);
      return out;
    };
    AttentionGrads ga = backward(full), gc = backward(lie);
    BackwardReference want = referenceBackward(spec, p, a, g, &full);
    EXPECT_LT(compareBackward(spec, p, ga, want).relErr(), 1e-2);
    EXPECT_GT(compareBackward(spec, p, gc, want).relErr(), 1e-1);
    if (deterministic) {
      AttentionGrads gb = backward(partial);
      EXPECT_EQ(*ga.dq.buffer, *gb.dq.buffer);
      EXPECT_EQ(*ga.dk.buffer, *gb.dk.buffer);
      EXPECT_EQ(*ga.dv.buffer, *gb.dv.buffer);
    }
  }
}

/// A mask_mod of positions only is bounded on each block pair
/// (MaskModBounds.cpp): where it surely keeps the whole block the mask is
/// skipped, with no layout. Each mask below matches the float64 reference
/// (forward, both backward modes; GQA, Nq != Nkv), and gives the same bits
/// as the same predicate computed on i32 (which the bounds do not take, so
/// the mask runs everywhere): the skipped blocks are exactly the ones the
/// mask keeps whole. A mask that lies about nothing cannot show a wrong
/// proof; the reference would.
TEST(MaskMods, BoundedMasksSkipTheBlocksTheyKeepWhole) {
  struct Mask {
    const char *name, *body;
  };
  // Each body computes %keep from %i, %j, %h (index); the i32 twin
  // compares the same values after index_cast.
  const Mask masks[] = {
      {"window", R"(
  %c40 = arith.constant 40 : index
  %d = arith.subi %i, %j : index
  %near = arith.cmpi sle, %d, %c40 : index
  %past = arith.cmpi sle, %j, %i : index
  %keep = arith.andi %near, %past : i1)"},
      {"prefix-lm", R"(
  %c50 = arith.constant 50 : index
  %past = arith.cmpi sle, %j, %i : index
  %prefix = arith.cmpi slt, %j, %c50 : index
  %keep = arith.ori %past, %prefix : i1)"},
      {"not-before-twice-head", R"(
  %c2 = arith.constant -2 : index
  %m = arith.muli %h, %c2 : index
  %x = arith.addi %j, %m : index
  %y = arith.maxsi %x, %i : index
  %eq = arith.cmpi eq, %y, %i : index
  %t = arith.constant true
  %keep = arith.xori %eq, %t : i1)"},
  };
  std::mt19937_64 rng(freshSeed());
  for (const Mask &m : masks) {
    SCOPED_TRACE(m.name);
    std::string region = std::string("{\n^bb0(%b: index, %h: index, %i: "
                                     "index, %j: index):") +
                         m.body + "\n  attn.yield %keep : i1\n}";
    // The twin: the mask on i32 copies of the positions.
    std::string twin = region;
    auto at = twin.find("):") + 2;
    twin.insert(at, "\n  %ii = arith.index_cast %i : index to i32\n"
                    "  %jj = arith.index_cast %j : index to i32\n"
                    "  %z = arith.cmpi sle, %jj, %ii : i32\n"
                    "  %zz = arith.cmpi sgt, %jj, %ii : i32\n"
                    "  %any = arith.ori %z, %zz : i1");
    twin.replace(twin.find("attn.yield %keep"), 16,
                 "%both = arith.andi %keep, %any : i1\n  attn.yield %both");
    AttentionSpec spec = withMaskModRegion(AttentionSpec(), region);
    AttentionSpec unbounded = withMaskModRegion(AttentionSpec(), twin);
    for (AttentionSpec *s : {&spec, &unbounded}) {
      s->headDimQK = s->headDimV = 32;
      s->gqaGroup = 2;
    }
    Problem p = problem(4, 150, 170);
    AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
    AttentionData twinData = data;
    twinData.o = HalfTensor::packed(data.o.shape);
    CpuKernel::compile(spec, tileConfig(32, 32))->run(p, data, nullptr);
    CpuKernel::compile(unbounded, tileConfig(32, 32))
        ->run(p, twinData, nullptr);
    EXPECT_EQ(*data.o.buffer, *twinData.o.buffer);
    EXPECT_EQ(data.lse, twinData.lse);
    EXPECT_LT(compareWithReference(spec, p, data,
                                   referenceForward(spec, p, data, nullptr))
                  .relErr(),
              1e-2);
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(deterministic ? "deterministic" : "atomic dQ");
      AttentionSpec bwd = spec, twinBwd = unbounded;
      bwd.direction = twinBwd.direction = Direction::Backward;
      bwd.deterministic = twinBwd.deterministic = deterministic;
      AttentionGrads g = makeRandomGrads(spec, p, data, rng);
      AttentionGrads h = g;
      for (HalfTensor *x : {&h.dq, &h.dk, &h.dv})
        *x = HalfTensor::packed(x->shape);
      CpuBackwardKernel::compile(bwd, tileConfig(32, 32))
          ->run(p, data, g, nullptr);
      CpuBackwardKernel::compile(twinBwd, tileConfig(32, 32))
          ->run(p, data, h, nullptr);
      EXPECT_LT(compareBackward(spec, p, g,
                                referenceBackward(spec, p, data, g, nullptr))
                    .relErr(),
                1e-2);
      if (deterministic) {
        EXPECT_EQ(*g.dq.buffer, *h.dq.buffer);
        EXPECT_EQ(*g.dk.buffer, *h.dk.buffer);
        EXPECT_EQ(*g.dv.buffer, *h.dv.buffer);
      }
    }
  }
}

} // namespace
