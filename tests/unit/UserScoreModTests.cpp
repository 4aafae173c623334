//===- UserScoreModTests.cpp - score_mod regions written by a user --------===//
//
/// \file
/// A score_mod region that is no named variant, given by an attn-stage
/// description: the float64 reference evaluates the region itself (value
/// and, by dual numbers, its derivative: compiler/ScoreModReference.cpp),
/// so the CPU mode's forward and gradients, whose derivative the compiler
/// derives by the chain rule, are checked against it. Regions a user might
/// write: a per-head distance bias under a soft cap (heads and positions),
/// a piecewise one (comparisons, andi, select, the batch), and a steep bias
/// whose padding rows' scores overflow exp2 (kept out of dK and dV).
/// Also: the reference fails the kernel without the modifier, and a tile
/// stage of such a region (inlined there) is a named error.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"

#include "tests/unit/ForwardCheck.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace flashjit;
using namespace flashjit::test;

namespace {

/// The attn stage of \p op ("flash_fwd" or "flash_bwd") with \p mask, head
/// dims \p dqk and \p dv and score_mod body \p body (its result %y).
std::string description(const char *op, const char *mask, int dqk, int dv,
                        const char *body) {
  return std::string("module {\n  attn.") + op +
         " @attention {element_type = bf16, gqa = 2 : i64, head_dim_qk = " +
         std::to_string(dqk) + " : i64, head_dim_v = " + std::to_string(dv) +
         " : i64, mask = \"" + mask +
         "\"} score_mod {\n  ^bb0(%s: f32, %b: index, %h: index, %i: "
         "index, %j: index):\n" +
         body + "    attn.yield %y : f32\n  }\n}\n";
}

/// y = 8 tanh((s - 0.3 (h + 1) (i - j) / 100) / 8).
const char *kDistanceBias = R"(
    %d = arith.subi %i, %j : index
    %di = arith.index_cast %d : index to i32
    %df = arith.sitofp %di : i32 to f32
    %hi = arith.index_cast %h : index to i32
    %hf = arith.sitofp %hi : i32 to f32
    %one = arith.constant 1.0 : f32
    %hp = arith.addf %hf, %one : f32
    %c = arith.constant -0.003 : f32
    %slope = arith.mulf %c, %hp : f32
    %bias = arith.mulf %slope, %df : f32
    %t = arith.addf %s, %bias : f32
    %cap = arith.constant 8.0 : f32
    %u = arith.divf %t, %cap : f32
    %th = math.tanh %u : f32
    %y = arith.mulf %th, %cap : f32
)";

/// y = 2 s^2 for 0 < s < 2, else s; + 0.5 in batch 1.
const char *kPiecewise = R"(
    %zero = arith.constant 0.0 : f32
    %two = arith.constant 2.0 : f32
    %ss = arith.mulf %s, %s : f32
    %sq = arith.mulf %ss, %two : f32
    %pos = arith.cmpf ogt, %s, %zero : f32
    %small = arith.cmpf olt, %s, %two : f32
    %both = arith.andi %pos, %small : i1
    %m = arith.select %both, %sq, %s : f32
    %c1 = arith.constant 1 : index
    %isb1 = arith.cmpi eq, %b, %c1 : index
    %half = arith.constant 0.5 : f32
    %sh = arith.addf %m, %half : f32
    %y = arith.select %isb1, %sh, %m : f32
)";

/// y = s + 2 (i - j): a bias that grows with the query position, so the
/// scores of a block's padding rows (past Nq, zero rows) overflow exp2;
/// the backward must keep them out of dK and dV (maskMain).
const char *kSteepQueryBias = R"(
    %d = arith.subi %i, %j : index
    %di = arith.index_cast %d : index to i32
    %df = arith.sitofp %di : i32 to f32
    %c = arith.constant 2.0 : f32
    %bias = arith.mulf %c, %df : f32
    %y = arith.addf %s, %bias : f32
)";

struct UserCase {
  const char *name, *mask, *body;
  int dqk, dv;
  int64_t seqQ, seqKV;
  double scale;
};

const UserCase kCases[] = {
    {"distance_bias_causal", "causal", kDistanceBias, 64, 64, 150, 170, 2.0},
    {"piecewise_dv_ne_dqk", "none", kPiecewise, 32, 48, 90, 130, 1.0},
    {"steep_query_bias_causal", "causal", kSteepQueryBias, 32, 32, 150, 170,
     1.0},
};

Problem problemOf(const UserCase &c) {
  Problem p;
  p.batch = 2;
  p.heads = 4;
  p.seqLenQ = c.seqQ;
  p.seqLenKV = c.seqKV;
  p.scale = c.scale;
  return p;
}

class UserScoreMod : public ::testing::TestWithParam<UserCase> {};

TEST_P(UserScoreMod, ForwardMatchesFloat64Reference) {
  const UserCase &c = GetParam();
  KernelSource source{description("flash_fwd", c.mask, c.dqk, c.dv, c.body),
                      "user.mlir"};
  SourceInfo info = inspectSource(source);
  ASSERT_EQ(info.spec.scoreMod, kCustomScoreMod);
  ASSERT_TRUE(info.spec.scoreFunction);
  Problem p = problemOf(c);
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(info.spec, p, QKVLayout::Separate, rng);
  CpuKernel::compile(info.spec, tileConfig(32, 32), source)
      ->run(p, data, nullptr);
  ReferenceResult ref = referenceForward(info.spec, p, data, nullptr);
  EXPECT_LT(compareWithReference(info.spec, p, data, ref).relErr(), 1e-2);
  // The check sees the region: against plain attention's reference the
  // kernel fails the bound.
  AttentionSpec plain = info.spec;
  plain.scoreMod.clear();
  plain.scoreFunction.reset();
  ReferenceResult off = referenceForward(plain, p, data, nullptr);
  EXPECT_GT(compareWithReference(info.spec, p, data, off).relErr(), 1e-2);
}

TEST_P(UserScoreMod, GradientsMatchFloat64Reference) {
  const UserCase &c = GetParam();
  KernelSource source{description("flash_bwd", c.mask, c.dqk, c.dv, c.body),
                      "user_bwd.mlir"};
  SourceInfo info = inspectSource(source);
  ASSERT_EQ(info.spec.direction, Direction::Backward);
  ASSERT_EQ(info.spec.scoreMod, kCustomScoreMod);
  KernelSource forward = forwardSourceOf(source);
  SourceInfo fwdInfo = inspectSource(forward);
  ASSERT_EQ(fwdInfo.spec.direction, Direction::Forward);
  ASSERT_EQ(fwdInfo.spec.scoreMod, kCustomScoreMod);
  Problem p = problemOf(c);
  std::mt19937_64 rng(freshSeed());
  AttentionData data =
      makeRandomInputs(fwdInfo.spec, p, QKVLayout::Separate, rng);
  CpuKernel::compile(fwdInfo.spec, tileConfig(32, 32), forward)
      ->run(p, data, nullptr);
  AttentionGrads grads = makeRandomGrads(fwdInfo.spec, p, data, rng);
  CpuBackwardKernel::compile(info.spec, tileConfig(32, 32), source)
      ->run(p, data, grads, nullptr);
  BackwardReference ref =
      referenceBackward(fwdInfo.spec, p, data, grads, nullptr);
  BackwardErrorReport err = compareBackward(fwdInfo.spec, p, grads, ref);
  EXPECT_EQ(err.nanCount, 0);
  const double bound = errorBound(fwdInfo.spec.dtype);
  EXPECT_LT(err.dqRelErr, bound);
  EXPECT_LT(err.dkRelErr, bound);
  EXPECT_LT(err.dvRelErr, bound);
}

INSTANTIATE_TEST_SUITE_P(Regions, UserScoreMod, ::testing::ValuesIn(kCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

/// The reference's evaluation of a region: values and derivatives at
/// points, on each side of the piecewise region's pieces.
TEST(UserScoreModReference, EvaluatesTheRegionAndItsDerivative) {
  SourceInfo info = inspectSource(
      {description("flash_fwd", "none", 32, 32, kPiecewise), "p.mlir"});
  const ScoreFunction &f = *info.spec.scoreFunction;
  double d = 0;
  EXPECT_DOUBLE_EQ(f.apply(1.5, 0, 0, 3, 4, nullptr, &d), 4.5);
  EXPECT_DOUBLE_EQ(d, 6.0);
  EXPECT_DOUBLE_EQ(f.apply(1.5, 1, 0, 3, 4, nullptr, &d), 5.0);
  EXPECT_DOUBLE_EQ(d, 6.0);
  EXPECT_DOUBLE_EQ(f.apply(3.0, 1, 2, 0, 0, nullptr, &d), 3.5);
  EXPECT_DOUBLE_EQ(d, 1.0);
  EXPECT_DOUBLE_EQ(f.apply(-1.0, 0, 0, 0, 0, nullptr, &d), -1.0);
  EXPECT_DOUBLE_EQ(d, 1.0);
  SourceInfo bias = inspectSource(
      {description("flash_fwd", "none", 32, 32, kDistanceBias), "b.mlir"});
  // h = 2, i - j = 50: t = s - 0.003 * 3 * 50 = s - 0.45.
  const double s = 1.0, t = s - 0.003 * 3 * 50;
  const double y = bias.spec.scoreFunction->apply(s, 0, 2, 60, 10, nullptr, &d);
  EXPECT_NEAR(y, 8 * std::tanh(t / 8), 1e-6);
  EXPECT_NEAR(d, 1 - std::tanh(t / 8) * std::tanh(t / 8), 1e-6);
}

/// A tile stage of a custom region has it inlined: the reference has
/// nothing to evaluate, a named error that points at the attn stage.
TEST(UserScoreModReference, TileStageOfACustomRegionIsRefused) {
  KernelSource attn{description("flash_fwd", "none", 32, 32, kPiecewise),
                    "p.mlir"};
  SourceInfo info = inspectSource(attn);
  KernelSource tile{
      emitStage(info.spec, tileConfig(32, 32), Stage::Tile, {}, attn),
      "p.tile.mlir"};
  ASSERT_NE(tile.text.find("score_mod = \"custom\""), std::string::npos);
  try {
    inspectSource(tile);
    ADD_FAILURE() << "a tile stage of a custom region was read";
  } catch (const CompileError &e) {
    EXPECT_NE(std::string(e.what()).find("give the attn stage"),
              std::string::npos)
        << e.what();
  }
}

/// A region given as text (withScoreModRegion, the C API's and the CLI's
/// way): the spec carries its printed text, in its JSON (so in every cache
/// key) and its name; the kernel compiled from the spec alone (no source
/// file) matches the reference; the same region read from a description
/// is the same spec; two regions are two specs; canonicalisation makes
/// `C * tanh(s / C)` with C first the named softcap:C.
TEST(UserScoreModText, TheSpecCarriesTheRegion) {
  const std::string text = std::string("{\n  ^bb0(%s: f32, %b: index, %h: "
                                       "index, %i: index, %j: index):\n") +
                           kDistanceBias + "    attn.yield %y : f32\n  }";
  AttentionSpec base;
  base.headDimQK = base.headDimV = 64;
  base.gqaGroup = 2;
  base.mask = MaskKind::Causal;
  AttentionSpec spec = withScoreModRegion(base, text);
  EXPECT_EQ(spec.scoreMod, kCustomScoreMod);
  ASSERT_TRUE(spec.scoreFunction);
  EXPECT_NE(spec.scoreModRegion.find("math.tanh"), std::string::npos);
  EXPECT_NE(spec.toJson().find("\"score_mod_region\":\"{\\n"),
            std::string::npos)
      << spec.toJson();
  SourceInfo read = inspectSource(
      {description("flash_fwd", "causal", 64, 64, kDistanceBias), "u.mlir"});
  EXPECT_EQ(read.spec.toJson(), spec.toJson());
  EXPECT_EQ(read.spec.name(), spec.name());
  AttentionSpec other = withScoreModRegion(
      base, std::string("{\n  ^bb0(%s: f32, %b: index, %h: index, %i: "
                        "index, %j: index):\n") +
                kPiecewise + "    attn.yield %y : f32\n  }");
  EXPECT_NE(other.toJson(), spec.toJson());
  EXPECT_NE(other.name(), spec.name());

  UserCase c = kCases[0];
  Problem p = problemOf(c);
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  CpuKernel::compile(spec, tileConfig(32, 32), {})->run(p, data, nullptr);
  ReferenceResult ref = referenceForward(spec, p, data, nullptr);
  EXPECT_LT(compareWithReference(spec, p, data, ref).relErr(), 1e-2);

  AttentionSpec softcap = withScoreModRegion(
      base, "{ ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):\n"
            "  %c = arith.constant 12.5 : f32\n"
            "  %x = arith.divf %s, %c : f32\n  %t = math.tanh %x : f32\n"
            "  %y = arith.mulf %c, %t : f32\n  attn.yield %y : f32 }");
  EXPECT_EQ(softcap.scoreMod, "softcap:12.5");
  EXPECT_TRUE(softcap.scoreModRegion.empty());
}

/// Bad region text: a named SpecError for each way it can be wrong.
TEST(UserScoreModText, BadRegionsAreNamedErrors) {
  const std::pair<const char *, const char *> cases[] = {
      {"{ ^bb0(%s: f32): attn.yield %s : f32 }", "must take (score: f32"},
      {"{ ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):\n"
       "  %c = arith.constant 4294967296 : index\n"
       "  %d = arith.addi %i, %c : index\n"
       "  %di = arith.index_cast %d : index to i32\n"
       "  %f = arith.sitofp %di : i32 to f32\n"
       "  %y = arith.addf %s, %f : f32\n  attn.yield %y : f32 }",
       "does not fit in i32"},
      {"{ ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):\n"
       "  attn.yield %s : f32 } } func.func @f() { return }",
       "score_mod region"},
      {"softcap:3", "expected its text"},
      {"{ ^bb0(", "score_mod region"},
  };
  AttentionSpec base;
  for (auto [text, want] : cases) {
    try {
      withScoreModRegion(base, text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const SpecError &e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
          << text << ": " << e.what();
    }
  }
}

} // namespace
