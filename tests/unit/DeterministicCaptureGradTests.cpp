//===- DeterministicCaptureGradTests.cpp - Captured gradients, same bits --===//
//
/// \file
/// A deterministic backward (AttentionSpec::deterministic) with captured
/// tensors' gradients (capture_grads) sums each contribution in 64-bit
/// fixed point (kernels/KernelABI.h, abi::bwd::fixedPointCaptureGrads):
/// two words per element, integer adds, then a conversion per tensor.
/// Checked on the CPU, whose grid runs programs on several threads at once:
/// the gradients are the same bits whatever the tiling (which changes every
/// program and the order of the adds) and from run to run, where the
/// atomic f32 adds give other bits; they match the float64 reference, and
/// the reference on other data fails them; gradients far below 2^-24 keep
/// their value (the second word); and the GPU kernels add the words with
/// red.global.add.u64 and convert each tensor's in a kernel of its own.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "kernels/HalfFloat.h"
#include "kernels/HostTensor.h"
#include "kernels/KernelABI.h"
#include "kernels/Varlen.h"

#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

using namespace flashjit;
using namespace flashjit::test;

namespace {

/// kLearnedRegion's problem (Nq 50, Nkv 70 are written in it): causal,
/// GQA 2, d 32, two batches (so each bias element takes two
/// contributions).
struct LearnedCase {
  AttentionSpec spec;
  Problem p;
  AttentionData data;

  explicit LearnedCase(std::mt19937_64 &rng)
      : spec(withScoreModRegion(AttentionSpec(), kLearnedRegion)),
        p(makeProblem(2, 4, 50, 70)) {
    spec.mask = MaskKind::Causal;
    spec.gqaGroup = 2;
    spec.headDimQK = spec.headDimV = 32;
    data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
    data.captures = {{0.8f},
                     uniform(rng, 4, -0.2f, 0.2f),
                     uniform(rng, size_t(4 * 50 * 70), -1.f, 1.f)};
    CpuKernel::compile(spec, tileConfig(32, 32))->run(p, data, nullptr);
  }

  /// The backward of \p g's dO on the CPU with \p tiling: \p g's captured
  /// gradients (zeroed first) of every captured tensor.
  void backward(AttentionGrads &g, bool deterministic,
                const TileConfig &tiling) const {
    AttentionSpec bwd = spec;
    bwd.direction = Direction::Backward;
    bwd.deterministic = deterministic;
    bwd.captureGrads = 0b111;
    g.captureGrads.clear();
    for (const std::vector<float> &c : data.captures)
      g.captureGrads.push_back(std::vector<float>(c.size()));
    CpuBackwardKernel::compile(bwd, tiling)->run(p, data, g, nullptr);
  }

  /// \p g against the float64 gradients of \p on (this case's data, or
  /// other data).
  BackwardErrorReport compare(const AttentionGrads &g,
                              const AttentionData &on) const {
    AttentionSpec fwd = spec;
    fwd.captureGrads = 0b111;
    return compareBackward(fwd, p, g,
                           referenceBackward(fwd, p, on, g, nullptr));
  }
};

bool sameBits(const Captures &a, const Captures &b) {
  if (a.size() != b.size())
    return false;
  for (size_t c = 0; c < a.size(); ++c)
    if (a[c].size() != b[c].size() ||
        std::memcmp(a[c].data(), b[c].data(), 4 * a[c].size()) != 0)
      return false;
  return true;
}

TEST(DeterministicCaptureGrads, SameBitsWhateverTheTilingAndTheRun) {
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  LearnedCase lc(rng);
  AttentionGrads g = makeRandomGrads(lc.spec, lc.p, lc.data, rng);
  const TileConfig tilings[] = {tileConfig(32, 32), tileConfig(32, 32),
                                tileConfig(16, 64), tileConfig(64, 16)};
  Captures first;
  for (const TileConfig &t : tilings) {
    SCOPED_TRACE(::testing::Message() << t.blockM << " x " << t.blockN);
    lc.backward(g, /*deterministic=*/true, t);
    BackwardErrorReport err = lc.compare(g, lc.data);
    EXPECT_EQ(err.nanCount, 0);
    EXPECT_TRUE(err.capturesChecked);
    EXPECT_LT(err.relErr(), 1e-2);
    EXPECT_LT(err.captureRelErr, 1e-2);
    if (first.empty())
      first = g.captureGrads;
    EXPECT_TRUE(sameBits(first, g.captureGrads));
  }
  // The check can fail: other data's reference, and the atomic adds, whose
  // order the tiling changes (the temperature's gradient alone sums every
  // score of every head).
  AttentionData other = lc.data;
  other.captures[1] = uniform(rng, 4, -0.2f, 0.2f);
  other.captures[2] = uniform(rng, size_t(4 * 50 * 70), -1.f, 1.f);
  EXPECT_GT(lc.compare(g, other).captureRelErr, 1e-2);
  lc.backward(g, /*deterministic=*/false, tileConfig(32, 32));
  Captures atomic = g.captureGrads;
  lc.backward(g, /*deterministic=*/false, tileConfig(64, 16));
  EXPECT_FALSE(sameBits(atomic, g.captureGrads));
}

/// dO scaled by 2^-40: every gradient (and so every contribution) lies far
/// below the first word's 2^-24, so it lives in the second word (2^-56)
/// alone.
TEST(DeterministicCaptureGrads, TinyGradientsKeepTheirValue) {
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  LearnedCase lc(rng);
  AttentionGrads g = makeRandomGrads(lc.spec, lc.p, lc.data, rng);
  ASSERT_EQ(lc.spec.dtype, DType::BF16);
  for (uint16_t &x : *g.dO.buffer) // exact: a power of two, bf16's range
    x = floatToBf16(std::ldexp(bf16ToFloat(x), -40));
  lc.backward(g, /*deterministic=*/true, tileConfig(32, 32));
  float largest = 0;
  for (const std::vector<float> &c : g.captureGrads)
    for (float x : c)
      largest = std::max(largest, std::fabs(x));
  EXPECT_GT(largest, 0.f);
  EXPECT_LT(largest, std::ldexp(1.f, -25));
  BackwardErrorReport err = lc.compare(g, lc.data);
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.captureRelErr, 1e-2);
}

/// A NaN row of dO makes that row's contributions NaN, to every captured
/// tensor (the temperature and the slope read by every score, the bias
/// elements of the row): the integer words cannot carry a NaN, so the
/// deterministic gradients are NaN throughout (loud, where the saturated
/// words would give a finite wrong value), as the atomic ones are NaN
/// where the row added.
TEST(DeterministicCaptureGrads, NonFiniteContributionsMakeTheGradientNaN) {
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  LearnedCase lc(rng);
  AttentionGrads g = makeRandomGrads(lc.spec, lc.p, lc.data, rng);
  const uint16_t nanBits = 0x7fc0; // bf16 quiet NaN
  for (int64_t c = 0; c < g.dO.shape[3]; ++c)
    g.dO.at(1, 2, 7, c) = nanBits;
  for (bool deterministic : {true, false}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic");
    lc.backward(g, deterministic, tileConfig(32, 32));
    int64_t nans = 0;
    for (const std::vector<float> &c : g.captureGrads)
      for (float x : c)
        nans += std::isnan(x);
    EXPECT_GT(nans, 0);
    if (deterministic)
      for (const std::vector<float> &c : g.captureGrads)
        EXPECT_EQ(std::count_if(c.begin(), c.end(),
                                [](float x) { return std::isnan(x); }),
                  int64_t(c.size()));
  }
}

/// A varlen batch (sequences of 50, 7 and 30 queries, 70, 1 and 44 keys)
/// with kLearnedRegion: each captured tensor's gradient sums over the
/// sequences, checked against the sum of every sequence's float64 ones
/// (checkVarlenBackward), atomic and deterministic (the same bits for two
/// tilings); the reference on other data fails them.
TEST(DeterministicCaptureGrads, VarlenGradientsSumOverTheSequences) {
  uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionSpec spec = withScoreModRegion(AttentionSpec(), kLearnedRegion);
  spec.mask = MaskKind::Causal;
  spec.gqaGroup = 2;
  spec.headDimQK = spec.headDimV = 32;
  spec.varlen = true;
  spec.captureGrads = 0b111;
  const std::vector<int64_t> lensQ = {50, 7, 30}, lensKV = {70, 1, 44};
  Problem p = varlenProblem(makeProblem(1, 4, 1, 1), lensQ, lensKV);
  AttentionData data = makeRandomVarlenInputs(spec, p, lensQ, lensKV, rng);
  data.captures = {{0.8f},
                   uniform(rng, 4, -0.2f, 0.2f),
                   uniform(rng, size_t(4 * 50 * 70), -1.f, 1.f)};
  AttentionSpec fwd = spec;
  fwd.captureGrads = 0;
  CpuKernel::compile(fwd, tileConfig(32, 32))->run(p, data, nullptr);
  AttentionGrads g = makeRandomGrads(spec, p, data, rng);
  Captures fixed;
  for (int run = 0; run < 3; ++run) {
    const bool deterministic = run > 0;
    SCOPED_TRACE(::testing::Message() << "run " << run);
    AttentionSpec bwd = spec;
    bwd.direction = Direction::Backward;
    bwd.deterministic = deterministic;
    g.captureGrads.clear();
    for (const std::vector<float> &c : data.captures)
      g.captureGrads.push_back(std::vector<float>(c.size()));
    CpuBackwardKernel::compile(bwd, run == 2 ? tileConfig(16, 64)
                                             : tileConfig(32, 32))
        ->run(p, data, g, nullptr);
    BackwardErrorReport err = checkVarlenBackward(spec, p, data, g);
    EXPECT_EQ(err.nanCount, 0);
    EXPECT_TRUE(err.capturesChecked);
    EXPECT_LT(err.relErr(), 1e-2);
    EXPECT_LT(err.captureRelErr, 1e-2);
    if (run == 1)
      fixed = g.captureGrads;
    if (run == 2)
      EXPECT_TRUE(sameBits(fixed, g.captureGrads));
  }
  AttentionData other = data;
  other.captures[2] = uniform(rng, size_t(4 * 50 * 70), -1.f, 1.f);
  EXPECT_GT(checkVarlenBackward(spec, p, other, g).captureRelErr, 1e-2);
}

/// The kernels of a deterministic backward with the gradients of captured
/// tensors 0 and 2 (of 3): the words by integer reductions, no f32 atomic
/// for them (the atomic backward's count), one conversion kernel per
/// gradient with the accumulators' pointers and the sizes as parameters.
TEST(DeterministicCaptureGrads, GpuKernelsSumWordsAndConvert) {
  AttentionSpec bwd = withScoreModRegion(AttentionSpec(), kLearnedRegion);
  bwd.direction = Direction::Backward;
  bwd.deterministic = true;
  const TileConfig config = defaultGpuBackwardConfig(bwd);
  for (const char *arch : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(arch);
    GpuTarget target;
    target.arch = arch;
    std::string none = compileToPtx(bwd, config, target);
    AttentionSpec grads = bwd;
    grads.captureGrads = 0b101;
    std::string ptx = compileToPtx(grads, config, target);
    EXPECT_EQ(occurrences(ptx, "red.global.add.f32"),
              occurrences(none, "red.global.add.f32"));
    EXPECT_GE(occurrences(ptx, "red.global.add.u64"), 4); // two words, two tensors
    EXPECT_NE(ptx.find(".entry attention_capture_grad0("), std::string::npos);
    EXPECT_EQ(ptx.find(".entry attention_capture_grad1("), std::string::npos);
    EXPECT_NE(ptx.find(".entry attention_capture_grad2("), std::string::npos);
    // Buffers, captured tensors, gradients and words: pointers; then the
    // three sizes after the f32 arguments and everything else.
    size_t at = ptx.find(".entry attention_capture_grad2(");
    std::string params = ptx.substr(at, ptx.find(")", at) - at);
    EXPECT_EQ(occurrences(params, ".param .u64 .ptr"),
              flashjit::abi::bwd::NumBuffers + 4 * bwd.captures);
    EXPECT_EQ(occurrences(params, ".param .u64 attention_capture_grad2_param_"),
              flashjit::abi::bwd::NumIndexArgs + bwd.captures);
    EXPECT_NE(ptx.find("cvt.rni.f32.f32"), std::string::npos);
    // The launcher's record: a program per 64 rows of 32 elements, grid.x
    // the program count (rows 1), one row of programs.
    bool found = false;
    for (const KernelLaunch &k : gpuKernelLaunches(grads, config, target))
      if (k.name == "attention_capture_grad2") {
        found = true;
        EXPECT_EQ(k.rows, 1);
        EXPECT_EQ(k.threads, 128);
        Problem programs = makeProblem(
            1, 1, flashjit::abi::bwd::captureConvertPrograms(4 * 50 * 70), 1);
        EXPECT_EQ(k.grid(programs, 1),
                  (std::array<int64_t, 3>{(4 * 50 * 70 + 2047) / 2048, 1, 1}));
      }
    EXPECT_TRUE(found);
  }
}

} // namespace
