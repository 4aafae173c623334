//===- ScoreModTests.cpp - Score modifiers on the CPU vs float64 ----------===//
//
/// \file
/// The named score modifiers, carried by the description's score_mod region
/// and inlined by the tiling pass, run through the CPU execution mode and
/// compared with the float64 reference, which applies the same modifier:
/// softcap (C * tanh(scale * q.k / C)) and ALiBi (scale * q.k + slope_h *
/// (kv_idx - q_idx), which reads the tile's index arguments). Also: the
/// check fails for a kernel without the modifier, both stages read back
/// keep the modifier, the spec refuses a bad modifier, and the backward's
/// description carries the region (CpuBackwardTests runs its gradients).
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

struct ScoreModCase {
  const char *name;
  const char *scoreMod;
  int64_t headDim, blockM, blockN, seqQ, seqKV;
  MaskKind mask;
  double scale; ///< 0: 1 / sqrt(d)
  int64_t heads = 2, gqa = 1;
};

class CpuScoreMod : public ::testing::TestWithParam<ScoreModCase> {};

/// Runs \p c on the CPU; returns the relative error against the reference
/// with the modifier (\p referenceWithMod) or without it. With
/// \p negativeFirstBatch, batch 0's queries are all negative and its keys
/// all positive, so that every score of its rows is below 0.
double relErrAgainst(const ScoreModCase &c, bool referenceWithMod,
                     bool negativeFirstBatch = false) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = c.headDim;
  spec.mask = c.mask;
  spec.gqaGroup = c.gqa;
  spec.scoreMod = c.scoreMod;
  spec.validate();
  TileConfig config;
  config.blockM = c.blockM;
  config.blockN = c.blockN;
  Problem p;
  p.batch = 2;
  p.heads = c.heads;
  p.seqLenQ = c.seqQ;
  p.seqLenKV = c.seqKV;
  p.scale = c.scale;
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  if (negativeFirstBatch)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t d = 0; d < c.headDim; ++d) {
        for (int64_t n = 0; n < c.seqQ; ++n)
          data.q.at(0, h, n, d) |= 0x8000; // the sign bit
        for (int64_t n = 0; n < c.seqKV; ++n)
          if (h < c.heads / c.gqa)
            data.k.at(0, h, n, d) &= 0x7fff;
      }
  CpuKernel::compile(spec, config)->run(p, data, nullptr);
  AttentionSpec refSpec = spec;
  if (!referenceWithMod)
    refSpec.scoreMod.clear();
  ReferenceResult ref = referenceForward(refSpec, p, data, nullptr);
  return compareWithReference(spec, p, data, ref).relErr();
}

TEST_P(CpuScoreMod, MatchesFloat64Reference) {
  EXPECT_LT(relErrAgainst(GetParam(), /*referenceWithMod=*/true), 1e-2);
}

// Caps small against the scores (scale 4 makes |s| reach ~10) so that the
// modifier changes the softmax well past the bound.
const ScoreModCase kCases[] = {
    {"d64_cap20_n100", "softcap:20", 64, 64, 64, 100, 100, MaskKind::None, 0},
    {"d64_cap2_causal_n130", "softcap:2", 64, 32, 64, 130, 130,
     MaskKind::Causal, 4.0},
    {"d32_cap1p5_nq_lt_nkv", "softcap:1.5", 32, 16, 32, 17, 200, MaskKind::None,
     4.0},
    {"d128_cap5_causal_nq_gt_nkv", "softcap:5", 128, 64, 32, 150, 70,
     MaskKind::Causal, 2.0},
};

auto caseName = [](const auto &info) { return std::string(info.param.name); };

INSTANTIATE_TEST_SUITE_P(Softcap, CpuScoreMod, ::testing::ValuesIn(kCases),
                         caseName);

// ALiBi: the bias reaches slope_0 * |kv_idx - q_idx| = 2^(-8 / H) * 200
// (~ 100 at H = 4): far past the bound if a position, the head or the
// slope were wrong. Causal and not, Nq < Nkv and Nq > Nkv (the bias is
// top-left aligned: the offset Nkv - Nq shifts lse), GQA (the slope is the
// query head's), several KV blocks and ragged edges.
const ScoreModCase kAlibiCases[] = {
    {"h4_d64_n100", "alibi:4", 64, 64, 64, 100, 100, MaskKind::None, 0, 4},
    {"h8_gqa4_causal_n130", "alibi:8", 64, 32, 64, 130, 130, MaskKind::Causal,
     0, 8, 4},
    {"h2_d32_nq_lt_nkv", "alibi:2", 32, 16, 32, 17, 200, MaskKind::None, 1.0,
     2},
    {"h4_gqa2_d128_causal_nq_gt_nkv", "alibi:4", 128, 64, 32, 150, 70,
     MaskKind::Causal, 0, 4, 2},
    {"h1_d16_causal_nq_lt_nkv", "alibi:1", 16, 32, 16, 45, 99, MaskKind::Causal,
     0, 1},
};

INSTANTIATE_TEST_SUITE_P(Alibi, CpuScoreMod, ::testing::ValuesIn(kAlibiCases),
                         caseName);

/// Rows whose every score lies far below the cap (scale 8: the scores of
/// batch 0 reach about -C, tanh saturates at -1): P against the top of
/// softcap's range is exp2(-2 C log2(e)), which the kernel takes as every
/// row's max where that stays a normal number (C = 40: 2^-115.4) and
/// reduces where it would not (C = 50: 2^-144 flushes to 0, the row would
/// read as empty); either way the rows keep their mass (uniform
/// attention), and batch 1's random rows match too.
TEST(CpuScoreModCheck, RowsFarBelowTheCapKeepTheirMass) {
  for (const char *cap : {"softcap:40", "softcap:50"}) {
    SCOPED_TRACE(cap);
    ScoreModCase c{"", cap, 64, 64, 32, 70, 100, MaskKind::None, 8.0};
    EXPECT_LT(relErrAgainst(c, /*referenceWithMod=*/true,
                            /*negativeFirstBatch=*/true),
              1e-2);
  }
}

/// The reference check sees the modifier: a softcapped kernel is far from
/// the reference of plain attention.
TEST(CpuScoreModCheck, PlainReferenceRejectsSoftcappedKernel) {
  ScoreModCase c{"", "softcap:1", 64, 64, 64, 128, 128, MaskKind::None, 4.0};
  EXPECT_GT(relErrAgainst(c, /*referenceWithMod=*/false), 1e-1);
}

/// The same for ALiBi.
TEST(CpuScoreModCheck, PlainReferenceRejectsAlibiKernel) {
  ScoreModCase c{"", "alibi:2", 64, 64, 64, 100, 100, MaskKind::None, 0, 2};
  EXPECT_GT(relErrAgainst(c, /*referenceWithMod=*/false), 1e-1);
}

/// ScoreMod::apply, the reference's formulas, at hand-computed points.
TEST(ScoreModSpec, ReferenceFormulas) {
  ScoreMod alibi = ScoreMod::parse("alibi:8");
  EXPECT_EQ(alibi.kind, ScoreMod::Kind::Alibi);
  EXPECT_EQ(alibi.heads, 8);
  // slope_0 = 2^-1, slope_7 = 2^-8: exact in float64.
  EXPECT_EQ(alibi.apply(1.0, 0, 3, 5), 1.0 + 0.5 * 2);
  EXPECT_EQ(alibi.apply(1.0, 7, 10, 2), 1.0 - 8.0 / 256);
  EXPECT_EQ(alibi.apply(-2.5, 3, 4, 4), -2.5);
  ScoreMod three = ScoreMod::parse("alibi:3");
  EXPECT_DOUBLE_EQ(three.apply(0.0, 1, 0, 1), std::exp2(-16.0 / 3));
  ScoreMod cap = ScoreMod::parse("softcap:2");
  EXPECT_DOUBLE_EQ(cap.apply(1.0, 0, 0, 0), 2 * std::tanh(0.5));
  EXPECT_EQ(ScoreMod::parse("").kind, ScoreMod::Kind::None);
  EXPECT_EQ(ScoreMod::parse("").apply(1.25, 3, 1, 2), 1.25);
}

/// The H of alibi:H is the problem's query head count.
TEST(ScoreModSpec, AlibiNeedsItsHeadCount) {
  AttentionSpec spec;
  spec.scoreMod = "alibi:4";
  Problem p;
  p.heads = 4;
  EXPECT_NO_THROW(p.validate(spec));
  p.heads = 8;
  try {
    p.validate(spec);
    ADD_FAILURE() << "alibi:4 ran on 8 heads";
  } catch (const SpecError &e) {
    EXPECT_NE(std::string(e.what()).find("heads (8) must be the H of score "
                                         "modifier 'alibi:4' (4)"),
              std::string::npos)
        << e.what();
  }
}

/// inspectSource reads the modifier back from both stages: the attn stage
/// by its region, the tile stage by #attn.kernel's score_mod; a CPU kernel
/// compiled from the tile stage matches the reference of the spec read.
TEST(ScoreModStages, ReadBackKeepsTheModifier) {
  for (const char *mod : {"softcap:3", "alibi:4"}) {
    SCOPED_TRACE(mod);
    AttentionSpec spec;
    spec.headDimQK = spec.headDimV = 32;
    spec.mask = MaskKind::Causal;
    spec.gqaGroup = 2;
    spec.scoreMod = mod;
    TileConfig config;
    config.blockM = 32;
    config.blockN = 16;
    for (Stage stage : {Stage::Attn, Stage::Tile}) {
      KernelSource source{emitStage(spec, config, stage), "stage.mlir"};
      SourceInfo info = inspectSource(source);
      EXPECT_EQ(info.stage, stage);
      EXPECT_EQ(info.spec.scoreMod, mod);
      EXPECT_EQ(info.spec.toJson(), spec.toJson());
      if (stage != Stage::Tile)
        continue;
      EXPECT_NE(source.text.find(std::string("score_mod = \"") + mod + "\""),
                std::string::npos);
      Problem p;
      p.heads = 4;
      p.seqLenQ = 50;
      p.seqLenKV = 70;
      p.scale = 1.0;
      std::mt19937_64 rng(freshSeed());
      AttentionData data =
          makeRandomInputs(info.spec, p, QKVLayout::Separate, rng);
      CpuKernel::compile(info.spec, config, source)->run(p, data, nullptr);
      ReferenceResult ref = referenceForward(info.spec, p, data, nullptr);
      EXPECT_LT(compareWithReference(info.spec, p, data, ref).relErr(), 1e-2);
    }
  }
}

/// Canonical names, and the attn stage read back at arguments whose
/// shortest text is not the plain one (1e+05, 0.1 as an f32).
TEST(ScoreModStages, NamesAreCanonicalAndReadBack) {
  EXPECT_EQ(ScoreMod::parse("softcap:20.0").name(), "softcap:20");
  EXPECT_EQ(ScoreMod::parse("softcap:0.1").name(), "softcap:0.1");
  EXPECT_EQ(ScoreMod::parse("alibi:08").name(), "alibi:8");
  EXPECT_EQ(ScoreMod::parse("").name(), "");
  EXPECT_EQ(ScoreMod::of(ScoreMod::Kind::Alibi, 12).name(), "alibi:12");
  EXPECT_THROW(ScoreMod::of(ScoreMod::Kind::Alibi, 2.5), SpecError);
  EXPECT_THROW(ScoreMod::of(ScoreMod::Kind::Softcap, -1), SpecError);
  for (const char *mod : {"softcap:0.1", "softcap:1e-05", "softcap:3e+30",
                          "alibi:100000", "alibi:1048576", "alibi:1"}) {
    AttentionSpec spec;
    spec.scoreMod = ScoreMod::parse(mod).name();
    SourceInfo info =
        inspectSource({emitStage(spec, TileConfig(), Stage::Attn), "a.mlir"});
    EXPECT_EQ(info.spec.scoreMod, spec.scoreMod) << mod;
  }
}

/// An edited region is no named variant: the attn stage reads it as a
/// custom one, which the reference evaluates as edited (slopes 2^(-4 (h +
/// 1) / H) instead of ALiBi's -8: UserScoreModTests.cpp runs such regions).
TEST(ScoreModStages, EditedRegionIsNoNamedVariant) {
  AttentionSpec spec;
  spec.scoreMod = "alibi:4";
  std::string text = emitStage(spec, TileConfig(), Stage::Attn);
  size_t at = text.find("-8.000000e+00");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 13, "-4.000000e+00");
  SourceInfo info = inspectSource({text, "edited.mlir"});
  EXPECT_EQ(info.spec.scoreMod, kCustomScoreMod);
  ASSERT_TRUE(info.spec.scoreFunction);
  double d = 0;
  // Head 1 of 4, kv_idx - q_idx = 10: slope 2^(-4 * 2 / 4) = 1/4.
  EXPECT_DOUBLE_EQ(
      info.spec.scoreFunction->apply(1.0, 0, 1, 5, 15, nullptr, &d),
      1.0 + 0.25 * 10);
  EXPECT_DOUBLE_EQ(d, 1.0);
  // A custom modifier has no name to be given by.
  AttentionSpec named;
  named.scoreMod = kCustomScoreMod;
  EXPECT_THROW(named.validate(), SpecError);
}

TEST(ScoreModSpec, BadModifiersAreNamedErrorsAndTheBackwardCarriesThem) {
  AttentionSpec spec;
  for (const char *bad :
       {"softcap",    "softcap:",      "softcap:0",
        "softcap:-3", "softcap:inf",   "softcap:1e60",
        "alibi",      "alibi:",        "alibi:0",
        "alibi:-2",   "alibi:2.5",     "alibi:+2",
        "alibi:4x",   "alibi:1048577", "alibi:99999999999999999999",
        "alibis:2",   "relpos:1",      "SOFTCAP:2",
        ":2",         "custom"}) {
    spec.scoreMod = bad;
    EXPECT_THROW(spec.validate(), SpecError) << bad;
  }
  spec.scoreMod = "alibi:1048576";
  EXPECT_NO_THROW(spec.validate());
  spec.scoreMod = "alibi:16";
  EXPECT_NO_THROW(spec.validate());
  EXPECT_NE(spec.toJson().find("\"score_mod\":\"alibi:16\""),
            std::string::npos);
  EXPECT_NE(spec.name().find("_alibi_16"), std::string::npos);
  EXPECT_NE(attnModuleText(spec, "k").find("math.exp2"), std::string::npos);
  spec.scoreMod = "softcap:30";
  EXPECT_NO_THROW(spec.validate());
  EXPECT_NE(spec.toJson().find("\"score_mod\":\"softcap:30\""),
            std::string::npos);
  EXPECT_NE(attnModuleText(spec, "k").find("math.tanh"), std::string::npos);
  // The backward carries the same region (its derivative: the tiling's).
  spec.direction = Direction::Backward;
  EXPECT_NO_THROW(spec.validate());
  std::string bwd = attnModuleText(spec, "k");
  EXPECT_NE(bwd.find("attn.flash_bwd @k"), std::string::npos) << bwd;
  EXPECT_NE(bwd.find("score_mod {"), std::string::npos) << bwd;
  EXPECT_NE(bwd.find("math.tanh"), std::string::npos) << bwd;
}

} // namespace

/// On the GPU a division by a constant (softcap's s / C) is a multiply by
/// its reciprocal, not IEEE division (div.rn.f32, a subroutine: T19-C's
/// softcap forward ran at 44% of the plain kernel's speed with it); a
/// division by anything else stays IEEE.
TEST(ScoreModGpu, DivisionByAConstantIsAMultiply) {
  TileConfig c;
  c.blockM = c.blockN = 128;
  c.warps = 8;
  GpuTarget target;
  target.arch = "sm_90a";
  for (Direction d : {Direction::Forward, Direction::Backward}) {
    AttentionSpec softcap;
    softcap.scoreMod = "softcap:30";
    softcap.direction = d;
    TileConfig config = c;
    if (d == Direction::Backward)
      config.blockM = 64;
    std::string ptx = compileToPtx(softcap, config, target);
    EXPECT_EQ(occurrences(ptx, "div.rn.f32"), 0);
    EXPECT_GT(occurrences(ptx, "tanh.approx.f32"), 0);
  }
  // s / (1 + |s|): the divisor is no constant.
  AttentionSpec ratio = withScoreModRegion(AttentionSpec(), R"({
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %one = arith.constant 1.0 : f32
  %a = math.absf %s : f32
  %d = arith.addf %one, %a : f32
  %y = arith.divf %s, %d : f32
  attn.yield %y : f32
})");
  EXPECT_GE(occurrences(compileToPtx(ratio, c, target), "div.rn.f32"), 64);
}
