//===- Exp2EmulationTests.cpp - The softmax's exp2 on the FMA pipe --------===//
//
/// \file
/// kernels/Exp2Emulation.h's arithmetic 2^x (the reference performs the
/// GPU's steps) against float64, and the `exp2-emulation` lowering
/// (TileToGPUExp2.cpp, FLASHJIT_EXP2_EMULATION): the PTX of a softcap
/// forward trades exactly the asked share of the P tile's ex2.approx for
/// that arithmetic, leaves tanh and the row rescale alone, and is the
/// default kernel when the share is 0. No GPU needed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/Exp2Emulation.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

using namespace flashjit;
using flashjit::test::occurrences;
using flashjit::test::ScopedEnv;

/// Within the bound over the softmax's range of normal results, monotone,
/// exact at integers near 0; +0 for -inf and far below; NaN stays NaN.
TEST(Exp2Emulation, ReferenceMatchesFloat64) {
  double worst = 0;
  float last = 0;
  for (double x = -126.0; x <= 0.0; x += 1.0 / 1024) {
    const float xf = float(x);
    const float r = exp2emu::reference(xf);
    worst = std::max(worst, std::fabs(double(r) / std::exp2(double(xf)) - 1));
    EXPECT_GE(r, last) << "not monotone at " << x;
    last = r;
  }
  EXPECT_LE(worst, exp2emu::kMaxRelativeError);
  EXPECT_GT(worst, 1e-6) << "an emulation this exact is not this one";
  for (int j : {0, -1, -2, -10})
    EXPECT_FLOAT_EQ(exp2emu::reference(float(j)), std::ldexp(1.0f, j));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp2emu::reference(-inf), 0.0f);
  EXPECT_FALSE(std::signbit(exp2emu::reference(-inf)));
  EXPECT_EQ(exp2emu::reference(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp2emu::reference(std::nanf(""))));
  // A little above 0 (fma(s, scale, -max) can round up by an ulp).
  EXPECT_NEAR(exp2emu::reference(1e-7f), 1.0f, 1e-4);
}

namespace {

std::string softcapPtx(const char *eighths) {
  ScopedEnv env("FLASHJIT_EXP2_EMULATION", eighths);
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 128;
  spec.scoreMod = "softcap:30";
  TileConfig config = test::tileConfig(128, 128, 8);
  config.overlapSoftmax = true;
  return compileToPtx(spec, config, GpuTarget());
}

} // namespace

/// k eighths of the P tile's registers (64 a thread, in the loop and
/// before it: 128) leave ex2.approx for max.NaN's arithmetic; tanh.approx
/// and the rank-1 exponentials stay; unset and 0 are the same kernel.
TEST(Exp2Emulation, TradesTheAskedShareOfThePTile) {
  const std::string none = softcapPtx(nullptr);
  EXPECT_EQ(softcapPtx("0"), none);
  const int ex2 = occurrences(none, "ex2.approx");
  const int tanh = occurrences(none, "tanh.approx");
  ASSERT_GE(ex2, 128);
  EXPECT_EQ(occurrences(none, "max.NaN"), 0);
  for (int k : {2, 4, 8}) {
    SCOPED_TRACE(k);
    const std::string ptx = softcapPtx(std::to_string(k).c_str());
    EXPECT_EQ(occurrences(ptx, "ex2.approx"), ex2 - 16 * k);
    EXPECT_EQ(occurrences(ptx, "max.NaN"), 16 * k);
    EXPECT_EQ(occurrences(ptx, "tanh.approx"), tanh);
  }
  // A value it does not know is none.
  EXPECT_EQ(softcapPtx("9"), none);
}

/// The pipeline text (so the cache key) names the share; sm_80 takes none.
TEST(Exp2Emulation, PipelineTextNamesTheShare) {
  TileConfig config = test::tileConfig(128, 128, 8);
  {
    ScopedEnv env("FLASHJIT_EXP2_EMULATION", "3");
    EXPECT_NE(gpuPipelineText(config, GpuTarget()).find(" exp2-emulation=3"),
              std::string::npos);
    GpuTarget ampere;
    ampere.arch = "sm_80";
    EXPECT_EQ(exp2EmulationEighths(ampere), 0);
  }
  ScopedEnv unset("FLASHJIT_EXP2_EMULATION", nullptr);
  EXPECT_EQ(gpuPipelineText(config, GpuTarget()).find("exp2-emulation"),
            std::string::npos);
}

/// The default share: a softcap forward with a causal mask takes
/// kSoftcapCausalExp2Eighths on sm_90a (the pipeline text, so the cache
/// key, names it; its PTX trades that share); a sliding window, the full
/// softcap, ALiBi, the backward and sm_80 take none;
/// FLASHJIT_EXP2_EMULATION overrides it.
TEST(Exp2Emulation, CausalSoftcapTakesItsDefaultShare) {
  ScopedEnv unset("FLASHJIT_EXP2_EMULATION", nullptr);
  TileConfig config = test::tileConfig(128, 128, 8);
  config.overlapSoftmax = true;
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 128;
  spec.scoreMod = "softcap:30";
  const std::string share =
      " exp2-emulation=" + std::to_string(kSoftcapCausalExp2Eighths);
  auto text = [&](const AttentionSpec &s, const GpuTarget &t) {
    return gpuPipelineText(config, t, &s);
  };
  GpuTarget ampere;
  ampere.arch = "sm_80";
  AttentionSpec causal = spec;
  causal.mask = MaskKind::Causal;
  EXPECT_NE(text(causal, GpuTarget()).find(share), std::string::npos);
  EXPECT_EQ(exp2EmulationEighths(ampere, &causal), 0);
  AttentionSpec backward = causal;
  backward.direction = Direction::Backward;
  EXPECT_EQ(exp2EmulationEighths(GpuTarget(), &backward), 0);
  AttentionSpec alibi = causal;
  alibi.scoreMod = "alibi:16";
  EXPECT_EQ(exp2EmulationEighths(GpuTarget(), &alibi), 0);
  AttentionSpec window = spec;
  window.mask = MaskKind::SlidingWindow;
  EXPECT_EQ(text(window, GpuTarget()).find("exp2-emulation"),
            std::string::npos);
  {
    ScopedEnv off("FLASHJIT_EXP2_EMULATION", "0");
    EXPECT_EQ(text(causal, GpuTarget()).find("exp2-emulation"),
              std::string::npos);
  }
  {
    ScopedEnv three("FLASHJIT_EXP2_EMULATION", "3");
    EXPECT_EQ(exp2EmulationEighths(GpuTarget(), &window), 3);
  }
  EXPECT_EQ(text(spec, GpuTarget()).find("exp2-emulation"), std::string::npos);
  EXPECT_EQ(gpuPipelineText(config, GpuTarget()).find("exp2-emulation"),
            std::string::npos);
  const std::string ptx = compileToPtx(causal, config, GpuTarget());
  EXPECT_EQ(occurrences(ptx, "max.NaN"), 16 * kSoftcapCausalExp2Eighths);
}
