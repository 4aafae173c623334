//===- HalfSoftmaxTests.cpp - softcap's tanh and P in f16 -----------------===//
//
/// \file
/// The half-precision softmax (the `half-softmax` tiling option, on with the
/// overlapped loop unless FLASHJIT_HALF_SOFTMAX=0): a bf16 softcap's tanh,
/// P's exponent and exp2 in f16, the row max an f16 tile's (widened) and
/// rounded to f16, P widened for the row sum. The CPU execution mode runs
/// the program the GPU runs (the GPU two scores an instruction), so these
/// check the tile IR's shape and its numbers against the float64 reference,
/// on fresh inputs, as the other forward cases do.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "tests/unit/ForwardCheck.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <sstream>

using namespace flashjit;
using namespace flashjit::test;

namespace {

constexpr auto DENSE = LayoutKind::Dense;
constexpr auto SEP = QKVLayout::Separate;

class HalfSoftmax : public ::testing::TestWithParam<Case> {};

TEST_P(HalfSoftmax, MatchesFloat64Reference) {
  expectForwardMatchesReference(GetParam(), freshSeed());
}

// clang-format off
const Case kHalfCases[] = {
  // name          dqk  dv  dt  mask   g  Br  Bc  B  H   Nq    Nkv  L  R  layout  sb  qkv  mod  S  overlap
  {"softcap30_d128", 128, 128, BF, NONE, 1, 128, 128, 1, 2, 700, 700, 0, 0, DENSE, 128, SEP, "softcap:30", 0, true},
  {"softcap50_causal_nq_lt_nkv", 128, 128, BF, CAUSAL, 1, 128, 128, 2, 2, 300, 517, 0, 0, DENSE, 128, SEP, "softcap:50", 0, true},
  {"softcap20_window_gqa2", 64, 64, BF, WIN, 2, 64, 64, 1, 4, 333, 250, 30, 5, DENSE, 128, SEP, "softcap:20", 0, true},
  {"softcap2_bc80_nq_gt_nkv", 112, 96, BF, CAUSAL, 1, 128, 80, 1, 2, 400, 190, 0, 0, DENSE, 128, SEP, "softcap:2", 0, true},
  {"softcap30_sparse", 64, 64, BF, NONE, 1, 64, 64, 1, 2, 256, 256, 0, 0, LayoutKind::EmptyRow, 64, SEP, "softcap:30", 0, true},
  // fp16 keeps the f32 softmax (P is the element type there).
  {"softcap30_fp16_f32_softmax", 64, 64, FP, CAUSAL, 1, 64, 64, 1, 2, 300, 300, 0, 0, DENSE, 128, SEP, "softcap:30", 0, true},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Cases, HalfSoftmax, ::testing::ValuesIn(kHalfCases),
                         [](const auto &info) {
                           return std::string(info.param.name);
                         });

/// The tiled text of \p c's forward.
std::string tiledText(const Case &c) {
  return emitStage(specOf(c), configOf(c), Stage::Tile);
}

/// Lines of \p text holding \p op whose type (the text after the last
/// ':') holds \p type.
int linesOf(const std::string &text, const std::string &op,
            const std::string &type) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(op) != std::string::npos &&
        line.substr(line.rfind(':')).find(type) != std::string::npos)
      ++n;
  return n;
}

/// A bf16 softcap on the overlapped loop: tanh, the product with the factor
/// less the row max, exp2 and the row max on f16 tiles (the first block's,
/// before the loop, and the loop's), no f32 tanh left. Not with
/// FLASHJIT_HALF_SOFTMAX=0, fp16, or the plain loop: their softmax is f32.
TEST(HalfSoftmax, TileIrTakesF16WhereItApplies) {
  const Case &c = kHalfCases[0];
  const std::string half = tiledText(c);
  for (const char *op : {"math.tanh", "math.fma", "math.exp2"}) {
    SCOPED_TRACE(op);
    EXPECT_EQ(linesOf(half, op, "tensor<128x128xf16>"), 2) << half;
    EXPECT_EQ(linesOf(half, op, "tensor<128x128xf32>"), 0) << half;
  }
  EXPECT_EQ(linesOf(half, "tile.reduce \"max\"", "tensor<128x128xf16>"), 2);
  EXPECT_EQ(linesOf(half, "tile.reduce \"sum\"", "tensor<128x128xf32>"), 2);
  Case fp16 = kHalfCases[5];
  Case plain = c;
  plain.overlap = false;
  std::string off;
  {
    ScopedEnv env("FLASHJIT_HALF_SOFTMAX", "0");
    off = tiledText(c);
  }
  for (const std::string &f32 : {off, tiledText(fp16), tiledText(plain)}) {
    EXPECT_GT(linesOf(f32, "math.tanh", "xf32>"), 0) << f32;
    EXPECT_EQ(linesOf(f32, "math.tanh", "xf16>"), 0) << f32;
    EXPECT_EQ(linesOf(f32, "math.exp2", "xf16>"), 0) << f32;
  }
}

/// The pipeline text (so the cache key) names the option where the loop is
/// overlapped, and FLASHJIT_HALF_SOFTMAX=0 takes it out.
TEST(HalfSoftmax, PipelineTextNamesIt) {
  TileConfig config = configOf(kHalfCases[0]);
  EXPECT_NE(cpuPipelineText(config).find(" half-softmax=true"),
            std::string::npos);
  EXPECT_NE(gpuPipelineText(config, GpuTarget()).find(" half-softmax=true"),
            std::string::npos);
  config.overlapSoftmax = false;
  EXPECT_EQ(cpuPipelineText(config).find("half-softmax"), std::string::npos);
  config.overlapSoftmax = true;
  ScopedEnv off("FLASHJIT_HALF_SOFTMAX", "0");
  EXPECT_EQ(cpuPipelineText(config).find("half-softmax"), std::string::npos);
}

/// Sharp attention (scale 1 at d = 128: scores of standard deviation about
/// 11, well into tanh's curve at C = 30): O and lse within bf16's bound of
/// the float64 reference, and O within 2x the f32 softmax's error on the
/// same inputs plus P's own bf16 rounding (2^-9): the f16 steps cost at
/// most about one more rounding of P.
TEST(HalfSoftmax, SharpScoresStayNearTheF32Softmax) {
  const Case &c = kHalfCases[0];
  AttentionSpec spec = specOf(c);
  Problem p = problemOf(c);
  p.scale = 1.0;
  const uint64_t seed = freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  double errs[2];
  for (int f32 = 0; f32 < 2; ++f32) {
    ScopedEnv env("FLASHJIT_HALF_SOFTMAX", f32 ? "0" : nullptr);
    std::mt19937_64 rng(seed);
    AttentionData data = makeRandomInputs(spec, p, c.qkv, rng);
    CpuKernel::compile(spec, configOf(c))->run(p, data, nullptr);
    ErrorReport err = compareWithReference(
        spec, p, data, referenceForward(spec, p, data, nullptr));
    EXPECT_EQ(err.nanCount, 0);
    EXPECT_LT(err.oRelErr, errorBound(spec.dtype));
    EXPECT_LT(err.lseRelErr, errorBound(spec.dtype));
    errs[f32] = err.oRelErr;
  }
  EXPECT_LT(errs[0], 2 * errs[1] + 0x1p-9) << "f16 " << errs[0] << ", f32 "
                                           << errs[1];
}

} // namespace
