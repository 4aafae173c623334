//===- TileEditTests.cpp - An edit of the tile stage reaches both paths ---===//
//
/// \file
/// The tile stage is what the CPU and the GPU both compile: an edit of it
/// (here a tanh soft-cap on the scores, S -> c * tanh(S / c)) must change
/// the PTX and the CPU's numbers alike, and the CPU's numbers must match a
/// float64 reference of the edited attention, not of the original. An
/// emptied kernel is a named error on both paths.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"

#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>

using namespace flashjit;
using flashjit::test::tileConfig;

namespace {

constexpr double kCap = 2.0;

AttentionSpec plainSpec() {
  AttentionSpec spec;
  spec.headDimQK = 64;
  spec.headDimV = 48;
  return spec;
}

/// The tile stage with S = tile.dot(Q, K^T) soft-capped right after the
/// product: every later use of S sees c * tanh(S / c).
std::string softCapped(const std::string &tile) {
  std::regex dot(R"((%\w+) = (tile\.dot .*\{transpose_rhs\} .*))");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(tile, m, dot)) << tile;
  std::string name = m[1], ty = "tensor<64x32xf32>";
  std::string edit = "%raw_s = " + m[2].str() + "\n" +
                     "    %cap = arith.constant dense<2.0> : " + ty + "\n" +
                     "    %inv = arith.constant dense<0.5> : " + ty + "\n" +
                     "    %sd = arith.mulf %raw_s, %inv : " + ty + "\n" +
                     "    %th = math.tanh %sd : " + ty + "\n" + "    " + name +
                     " = arith.mulf %th, %cap : " + ty;
  return m.prefix().str() + edit + m.suffix().str();
}

/// O of the soft-capped attention in float64 (dense, no mask).
std::vector<double> softCapReference(const AttentionSpec &spec,
                                     const Problem &p, const AttentionData &d) {
  const double scale = p.effectiveScale(spec);
  std::vector<double> out;
  auto f = [&](const HalfTensor &t, int64_t n, int64_t c) {
    return double(halfToFloat(spec.dtype, t.at(0, 0, n, c)));
  };
  for (int64_t i = 0; i < p.seqLenQ; ++i) {
    std::vector<double> s(p.seqLenKV);
    double mx = -INFINITY;
    for (int64_t j = 0; j < p.seqLenKV; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < spec.headDimQK; ++c)
        dot += f(d.q, i, c) * f(d.k, j, c);
      s[j] = scale * kCap * std::tanh(dot / kCap);
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (double &x : s)
      sum += x = std::exp(x - mx);
    for (int64_t c = 0; c < spec.headDimV; ++c) {
      double o = 0;
      for (int64_t j = 0; j < p.seqLenKV; ++j)
        o += s[j] * f(d.v, j, c);
      out.push_back(o / sum);
    }
  }
  return out;
}

double relErr(const AttentionSpec &spec, const HalfTensor &o,
              const std::vector<double> &ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    int64_t n = int64_t(i) / spec.headDimV, c = int64_t(i) % spec.headDimV;
    double x = halfToFloat(spec.dtype, o.at(0, 0, n, c));
    num += (x - ref[i]) * (x - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

TEST(TileEdit, SoftCapReachesTheCpuAndThePtx) {
  AttentionSpec spec = plainSpec();
  TileConfig config = tileConfig(64, 32);
  std::string tile = emitStage(spec, config, Stage::Tile);
  KernelSource edited{softCapped(tile), "softcap.mlir"};

  Problem p;
  p.seqLenQ = 77;
  p.seqLenKV = 100;
  uint64_t seed = test::freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionData data = makeRandomInputs(spec, p, QKVLayout::Separate, rng);
  CpuKernel::compile(spec, config, edited)->run(p, data, nullptr);
  std::vector<double> capped = softCapReference(spec, p, data);
  EXPECT_LT(relErr(spec, data.o, capped), errorBound(spec.dtype))
      << "the CPU does not compute the edited attention";
  // The edit matters: the original attention's reference is far off.
  ReferenceResult plain = referenceForward(spec, p, data, nullptr);
  ErrorReport err = compareWithReference(spec, p, data, plain);
  EXPECT_GT(err.oRelErr, 10 * errorBound(spec.dtype))
      << "the soft-cap changed nothing: the edit did not reach the CPU";

  GpuTarget target;
  target.arch = "sm_90a";
  std::string before = compileToPtx(spec, config, target);
  std::string after = compileToPtx(spec, config, target, edited);
  EXPECT_EQ(before.find("tanh.approx.f32"), std::string::npos);
  EXPECT_NE(after.find("tanh.approx.f32"), std::string::npos)
      << "the edit did not reach the GPU kernel";
}

/// The unedited tile stage read back from text compiles to the very PTX
/// flashjit makes from the description.
TEST(TileEdit, TileStageRoundTripsToTheSamePtx) {
  AttentionSpec spec = plainSpec();
  spec.mask = MaskKind::Causal;
  TileConfig config = tileConfig(64, 32);
  KernelSource tile{emitStage(spec, config, Stage::Tile), "tile.mlir"};
  GpuTarget target;
  target.arch = "sm_90a";
  EXPECT_EQ(compileToPtx(spec, config, target),
            compileToPtx(spec, config, target, tile));
  SourceInfo info = inspectSource(tile);
  EXPECT_EQ(info.stage, Stage::Tile);
  EXPECT_EQ(info.spec.toJson(), spec.toJson());
  ASSERT_TRUE(info.tiling);
  EXPECT_EQ(info.tiling->blockM, 64);
  EXPECT_EQ(info.tiling->blockN, 32);
}

/// A kernel whose body was emptied is a named error on both paths.
TEST(TileEdit, EmptiedKernelIsANamedError) {
  AttentionSpec spec = plainSpec();
  TileConfig config = tileConfig(64, 32);
  std::string tile = emitStage(spec, config, Stage::Tile);
  size_t open = tile.find("{\n", tile.find("func.func @attention"));
  size_t close = tile.rfind("return");
  ASSERT_NE(open, std::string::npos);
  ASSERT_NE(close, std::string::npos);
  KernelSource empty{tile.substr(0, open + 2) + "    " + tile.substr(close),
                     "empty.mlir"};
  auto expectNamed = [](auto &&compile) {
    try {
      compile();
      ADD_FAILURE() << "an emptied kernel compiled";
    } catch (const CompileError &e) {
      EXPECT_NE(std::string(e.what()).find("writes no output"),
                std::string::npos)
          << e.what();
    }
  };
  expectNamed([&] { CpuKernel::compile(spec, config, empty); });
  GpuTarget target;
  target.arch = "sm_90a";
  expectNamed([&] { compileToPtx(spec, config, target, empty); });
}

} // namespace

/// The backward's kernels come from their tile IR too: replacing exp2 by
/// exp in the dK/dV function changes its PTX (exp becomes ex2 of x * log2
/// e: the constant appears), and emptying that function is a named error.
TEST(TileEdit, BackwardEditReachesThePtx) {
  AttentionSpec spec = plainSpec();
  spec.direction = Direction::Backward;
  TileConfig config = defaultGpuBackwardConfig(spec);
  std::string tile = emitStage(spec, config, Stage::Tile);
  size_t main = tile.find("func.func @attention(");
  ASSERT_NE(main, std::string::npos);
  size_t end = tile.find("func.func @attention_dq", main);
  std::string edited = tile;
  size_t at = edited.find("math.exp2", main);
  ASSERT_TRUE(at != std::string::npos && at < end);
  edited.replace(at, 9, "math.exp");
  GpuTarget target;
  target.arch = "sm_90a";
  auto kernel = [](const std::string &ptx) {
    size_t a = ptx.find(".entry attention(");
    return ptx.substr(a, ptx.find(".entry", a + 1) - a);
  };
  std::string before = kernel(compileToPtx(spec, config, target));
  std::string after =
      kernel(compileToPtx(spec, config, target, {edited, "exp.mlir"}));
  EXPECT_EQ(before.find("0f3FB8AA3B"), std::string::npos);
  EXPECT_NE(after.find("0f3FB8AA3B"), std::string::npos)
      << "the edit did not reach the dK/dV kernel";

  size_t open = tile.find("{\n", main);
  size_t close = tile.find("return", open);
  KernelSource empty{tile.substr(0, open + 2) + "    " + tile.substr(close),
                     "empty.mlir"};
  try {
    compileToPtx(spec, config, target, empty);
    ADD_FAILURE() << "an emptied dK/dV kernel compiled";
  } catch (const CompileError &e) {
    EXPECT_NE(std::string(e.what()).find("writes no output"),
              std::string::npos)
        << e.what();
  }
}
