//===- ScoreModTests.cpp - Score modifiers on the CPU vs float64 ----------===//
//
/// \file
/// The softcap score modifier (C * tanh(scale * q.k / C)), carried by the
/// description's score_mod region and inlined by the tiling pass, run
/// through the CPU execution mode and compared with the float64 reference,
/// which applies the same modifier. Also: the check fails for a kernel
/// without the modifier, and the spec refuses a bad modifier or one with
/// the backward.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"

#include "tests/unit/ForwardCheck.h"

#include <gtest/gtest.h>

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
};

class CpuScoreMod : public ::testing::TestWithParam<ScoreModCase> {};

/// Runs \p c on the CPU; returns the relative error against the reference
/// with the modifier (\p referenceWithMod) or without it.
double relErrAgainst(const ScoreModCase &c, bool referenceWithMod) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = c.headDim;
  spec.mask = c.mask;
  spec.scoreMod = c.scoreMod;
  spec.validate();
  TileConfig config;
  config.blockM = c.blockM;
  config.blockN = c.blockN;
  Problem p;
  p.batch = 2;
  p.heads = 2;
  p.seqLenQ = c.seqQ;
  p.seqLenKV = c.seqKV;
  p.scale = c.scale;
  std::mt19937_64 rng(freshSeed());
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
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

INSTANTIATE_TEST_SUITE_P(Softcap, CpuScoreMod, ::testing::ValuesIn(kCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

/// The reference check sees the modifier: a softcapped kernel is far from
/// the reference of plain attention.
TEST(CpuScoreModCheck, PlainReferenceRejectsSoftcappedKernel) {
  ScoreModCase c{"", "softcap:1", 64, 64, 64, 128, 128, MaskKind::None, 4.0};
  EXPECT_GT(relErrAgainst(c, /*referenceWithMod=*/false), 1e-1);
}

TEST(ScoreModSpec, BadModifiersAndBackwardAreNamedErrors) {
  AttentionSpec spec;
  for (const char *bad : {"softcap", "softcap:", "softcap:0", "softcap:-3",
                          "softcap:inf", "softcap:1e60", "alibi:2"}) {
    spec.scoreMod = bad;
    EXPECT_THROW(spec.validate(), SpecError) << bad;
  }
  spec.scoreMod = "softcap:30";
  EXPECT_NO_THROW(spec.validate());
  EXPECT_NE(spec.toJson().find("\"score_mod\":\"softcap:30\""),
            std::string::npos);
  EXPECT_NE(attnModuleText(spec, "k").find("math.tanh"), std::string::npos);
  spec.direction = Direction::Backward;
  try {
    spec.validate();
    ADD_FAILURE() << "the backward of a score modifier was accepted";
  } catch (const SpecError &e) {
    EXPECT_NE(std::string(e.what()).find("not derived yet"),
              std::string::npos);
  }
}

} // namespace
