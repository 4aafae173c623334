//===- TanhPolynomialTests.cpp - A score tile's tanh on the FMA pipe ------===//
//
/// \file
/// kernels/TanhPolynomial.h's polynomial (the reference performs the GPU's
/// steps) against float64 on its range, and the `tanh-polynomial` lowering
/// (TileToGPUTanh.cpp, FLASHJIT_TANH_POLYNOMIAL=K eighths): the PTX of a
/// softcap forward and backward guards the share of each 2-D tanh with one
/// warp vote and keeps tanh.approx for the other side and the other
/// registers; unset and 0 are the default kernel, and a kernel without
/// tanh does not change. No GPU needed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/TanhPolynomial.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

using namespace flashjit;
using flashjit::test::occurrences;
using flashjit::test::ScopedEnv;

/// Within the bound on [-1, 1] (better than tanh.approx.f32's 2^-10.987),
/// odd, monotone, 0 at +-0, NaN stays NaN.
TEST(TanhPolynomial, ReferenceMatchesFloat64) {
  double worst = 0;
  float last = -1;
  for (double x = -1.0; x <= 1.0; x += 1.0 / 65536) {
    const float xf = float(x);
    const float r = tanhpoly::reference(xf);
    if (xf != 0)
      worst = std::max(worst,
                       std::fabs(double(r) / std::tanh(double(xf)) - 1));
    EXPECT_EQ(tanhpoly::reference(-xf), -r) << "not odd at " << x;
    EXPECT_GE(r, last) << "not monotone at " << x;
    last = r;
  }
  EXPECT_LE(worst, tanhpoly::kMaxRelativeError);
  EXPECT_LT(worst, std::exp2(-10.987));
  EXPECT_GT(worst, 1e-6) << "a polynomial this exact is not this one";
  for (float tiny : {1e-30f, 1e-20f, 1e-8f})
    EXPECT_EQ(tanhpoly::reference(tiny), tiny);
  EXPECT_EQ(tanhpoly::reference(0.0f), 0.0f);
  EXPECT_EQ(tanhpoly::reference(-0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(tanhpoly::reference(std::nanf(""))));
  // Past the bound the polynomial leaves tanh: the lowering's vote is
  // what keeps it off those scores.
  EXPECT_GT(std::fabs(tanhpoly::reference(3.0f) - std::tanh(3.0)), 0.1);
}

namespace {

std::string softcapPtx(const char *poly, Direction direction,
                       const char *scoreMod = "softcap:30",
                       const char *arch = nullptr) {
  ScopedEnv env("FLASHJIT_TANH_POLYNOMIAL", poly);
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 128;
  spec.scoreMod = scoreMod;
  spec.direction = direction;
  TileConfig config = test::tileConfig(128, 128, 8);
  config.overlapSoftmax = direction == Direction::Forward && !arch;
  GpuTarget target;
  if (arch)
    target.arch = arch;
  return compileToPtx(spec, config, target);
}

} // namespace

/// Each 2-D tanh tile (the forward's: one before the loop, one in it)
/// gets one vote and a polynomial for each of its registers (c3 =
/// -0.0274230577, 0fBCE0A652, the first multiply-add's constant);
/// tanh.approx stays on the other side of the branch, the exponentials
/// unchanged. Off unless asked (unset and 0 are one kernel).
TEST(TanhPolynomial, ForwardVotesOncePerTanhTile) {
  const std::string none = softcapPtx(nullptr, Direction::Forward);
  EXPECT_EQ(softcapPtx("0", Direction::Forward), none);
  const int tanh = occurrences(none, "tanh.approx");
  ASSERT_EQ(tanh, 128);
  EXPECT_EQ(occurrences(none, "vote.sync.all"), 0);
  EXPECT_EQ(occurrences(none, ", 0fBCE0A652,"), 0);
  const std::string poly = softcapPtx("8", Direction::Forward);
  EXPECT_EQ(occurrences(poly, "vote.sync.all"), 2);
  EXPECT_EQ(occurrences(poly, "tanh.approx"), tanh);
  EXPECT_EQ(occurrences(poly, "ex2.approx"), occurrences(none, "ex2.approx"));
  EXPECT_EQ(occurrences(poly, ", 0fBCE0A652,"), tanh);
  EXPECT_EQ(occurrences(poly, "abs.f32"), tanh);
  EXPECT_GE(occurrences(poly, "setp.le.f32"), 2);
}

/// sm_80 (mma.sync) takes it too when asked.
TEST(TanhPolynomial, Sm80TakesItWhenAsked) {
  const std::string plain =
      softcapPtx(nullptr, Direction::Forward, "softcap:30", "sm_80");
  EXPECT_EQ(occurrences(plain, "vote.sync.all"), 0);
  EXPECT_GT(occurrences(plain, "tanh.approx"), 0);
  EXPECT_GT(
      occurrences(softcapPtx("8", Direction::Forward, "softcap:30", "sm_80"),
                  "vote.sync.all"),
      0);
}

/// k eighths: the registers i % 8 < k of each tile take the branch (one
/// vote each, over those registers alone), the others stay on the unit
/// outside it: the forward's 128 tanh registers give 16 k polynomials
/// and 128 tanh.approx (those outside plus the branch's other side).
TEST(TanhPolynomial, TakesTheAskedShare) {
  for (int k : {1, 2, 4}) {
    SCOPED_TRACE(k);
    const std::string ptx =
        softcapPtx(std::to_string(k).c_str(), Direction::Forward);
    EXPECT_EQ(occurrences(ptx, "vote.sync.all"), 2);
    EXPECT_EQ(occurrences(ptx, ", 0fBCE0A652,"), 16 * k);
    EXPECT_EQ(occurrences(ptx, "abs.f32"), 16 * k);
    EXPECT_EQ(occurrences(ptx, "tanh.approx"), 128);
  }
}

/// The backward recomputes softcap's tanh for P and for the chain's
/// 1 - t^2: its 2-D tanh tiles take the same branch.
TEST(TanhPolynomial, BackwardVotesToo) {
  const std::string none = softcapPtx("0", Direction::Backward);
  const std::string poly = softcapPtx("8", Direction::Backward);
  const int tanh = occurrences(none, "tanh.approx");
  ASSERT_GT(tanh, 0);
  EXPECT_EQ(occurrences(none, "vote.sync.all"), 0);
  EXPECT_GT(occurrences(poly, "vote.sync.all"), 0);
  EXPECT_EQ(occurrences(poly, "tanh.approx"), tanh);
  EXPECT_EQ(occurrences(poly, ", 0fBCE0A652,"), tanh);
}

/// A kernel without a 2-D tanh is the same with or without the option.
TEST(TanhPolynomial, LeavesOtherKernelsAlone) {
  for (const char *mod : {"alibi:8", ""}) {
    SCOPED_TRACE(mod);
    EXPECT_EQ(softcapPtx("8", Direction::Forward, mod),
              softcapPtx("0", Direction::Forward, mod));
  }
}

/// The pipeline text (so the cache key) names the option where it is on.
TEST(TanhPolynomial, PipelineTextNamesIt) {
  AttentionSpec spec;
  spec.scoreMod = "softcap:30";
  TileConfig config = test::tileConfig(128, 128, 8);
  {
    ScopedEnv env("FLASHJIT_TANH_POLYNOMIAL", "3");
    EXPECT_NE(
        gpuPipelineText(config, GpuTarget(), &spec).find(" tanh-polynomial=3"),
        std::string::npos);
  }
  for (const char *off : {"0", "9", "x", static_cast<const char *>(nullptr)}) {
    ScopedEnv env("FLASHJIT_TANH_POLYNOMIAL", off);
    EXPECT_EQ(
        gpuPipelineText(config, GpuTarget(), &spec).find("tanh-polynomial"),
        std::string::npos);
  }
}
