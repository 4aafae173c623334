//===- DqQuadOrderTests.cpp - dq_accum's rows in quad order
//----------------===//
//
/// \file
/// The backward tiling's `dq-quad-order` (the default since T41;
/// FLASHJIT_DQ_QUAD_ORDER=0 turns it off): atomic dQ keeps dq_accum's rows
/// in quad order, each 16-column group's columns
/// 2i, 2i+1, 2i+8, 2i+9 adjacent (tile.atomic_add's and the conversion's
/// tile.load's `quad_order`), so that a thread of a warpgroup MMA adds its
/// four values of a row with one red.global.add.v4.f32. The CPU runs the
/// same tile IR: its gradients match float64 and its dq_accum is in quad
/// order (read back from a caller's workspace); the pipeline texts record
/// the option; head dims that are not a multiple of 16 and the
/// deterministic dQ keep column order; the Hopper PTX adds quads where the
/// workspace is 16-byte aligned and pairs where not (on warpgroup MMAs and
/// on mma.sync), sm_80 scalars.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "dialects/Tile/IR/TileDialect.h"
#include "kernels/HostTensor.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace flashjit;
using flashjit::test::ScopedEnv;

namespace {

/// The spec of a backward of head dims \p dqk / \p dv with \p mask.
AttentionSpec backwardSpec(int64_t dqk, int64_t dv, MaskKind mask) {
  AttentionSpec spec;
  spec.direction = Direction::Backward;
  spec.headDimQK = dqk;
  spec.headDimV = dv;
  spec.mask = mask;
  return spec;
}

/// Runs the forward and the backward of \p spec on the CPU with dq_accum in
/// a caller's workspace, returns the workspace and checks the gradients
/// against float64 (fresh inputs, NaN-poisoned gradients).
std::vector<float> runAndCheck(const AttentionSpec &spec, const Problem &p,
                               AttentionGrads &grads) {
  uint64_t seed = test::freshSeed();
  SCOPED_TRACE(::testing::Message() << "input seed " << seed);
  std::mt19937_64 rng(seed);
  AttentionSpec forward = spec;
  forward.direction = Direction::Forward;
  TileConfig config = test::tileConfig(64, 64, 4);
  AttentionData data = makeRandomInputs(forward, p, QKVLayout::Separate, rng);
  CpuKernel::compile(forward, config)->run(p, data, nullptr);
  grads = makeRandomGrads(forward, p, data, rng);
  const int64_t bytes = backwardWorkspaceBytes(spec, p);
  std::vector<float> workspace(size_t(bytes / 4), std::nanf(""));
  CpuBackwardKernel::compile(spec, config)
      ->run(p, data, grads, nullptr, workspace.data(), bytes);
  BackwardReference ref = referenceBackward(forward, p, data, grads, nullptr);
  BackwardErrorReport err = compareBackward(forward, p, grads, ref);
  EXPECT_EQ(err.nanCount, 0);
  EXPECT_LT(err.dqRelErr, errorBound(spec.dtype));
  EXPECT_LT(err.dkRelErr, errorBound(spec.dtype));
  EXPECT_LT(err.dvRelErr, errorBound(spec.dtype));
  return workspace;
}

/// Whether dQ is dq_accum * scale read at \p column(d) of each row, for
/// every element; the count of nonzero accumulators in \p nonzero.
bool dqReadsAccumAt(const AttentionSpec &spec, const Problem &p,
                    const AttentionGrads &grads,
                    const std::vector<float> &workspace,
                    int64_t (*column)(int64_t), int64_t &nonzero) {
  const int64_t rows = p.batch * p.heads * p.seqLenQ;
  const float *acc = workspace.data() + 2 * rows;
  const float scale = float(p.effectiveScale(spec));
  nonzero = 0;
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
    for (int64_t i = 0; i < p.seqLenQ; ++i)
      for (int64_t d = 0; d < spec.headDimQK; ++d) {
        float a = acc[(bh * p.seqLenQ + i) * spec.headDimQK + column(d)];
        nonzero += a != 0.0f;
        if (grads.dq.at(bh / p.heads, bh % p.heads, i, d) !=
            floatToHalf(spec.dtype, a * scale))
          return false;
      }
  return true;
}

int64_t identity(int64_t c) { return c; }
int64_t quads(int64_t c) { return tile::quadColumn(c); }

} // namespace

/// On the CPU, by default: dQ, dK and dV match float64 (causal, Nq !=
/// Nkv, d 96; d 80 with dv 64), and dq_accum holds row i's column d at
/// quadColumn(d) (not at d); with FLASHJIT_DQ_QUAD_ORDER=0, at d.
TEST(DqQuadOrder, CpuAccumulatesInQuadOrder) {
  Problem p;
  p.heads = 2;
  p.seqLenQ = 90;
  p.seqLenKV = 150;
  for (auto [dqk, dv] : {std::pair(96, 96), std::pair(80, 64)}) {
    SCOPED_TRACE(::testing::Message() << "d " << dqk << " dv " << dv);
    AttentionSpec spec = backwardSpec(dqk, dv, MaskKind::Causal);
    AttentionGrads grads;
    int64_t nonzero = 0;
    {
      ScopedEnv on("FLASHJIT_DQ_QUAD_ORDER", nullptr);
      std::vector<float> ws = runAndCheck(spec, p, grads);
      EXPECT_TRUE(dqReadsAccumAt(spec, p, grads, ws, quads, nonzero));
      EXPECT_GT(nonzero, 0);
      EXPECT_FALSE(dqReadsAccumAt(spec, p, grads, ws, identity, nonzero));
    }
    ScopedEnv off("FLASHJIT_DQ_QUAD_ORDER", "0");
    std::vector<float> ws = runAndCheck(spec, p, grads);
    EXPECT_TRUE(dqReadsAccumAt(spec, p, grads, ws, identity, nonzero));
    EXPECT_FALSE(dqReadsAccumAt(spec, p, grads, ws, quads, nonzero));
  }
}

/// The tile IR: the main loop's tile.atomic_add and the conversion's
/// tile.load carry quad_order by default, where dqk is a multiple of 16 and
/// dQ is atomic; the pipeline texts (cache keys) record it.
TEST(DqQuadOrder, TileIrAndPipelineTexts) {
  TileConfig config = test::tileConfig(64, 128, 8);
  AttentionSpec spec = backwardSpec(128, 128, MaskKind::None);
  auto marks = [&](const AttentionSpec &s) {
    return test::occurrences(emitStage(s, config, Stage::Tile), "quad_order");
  };
  const std::string option = " dq-quad-order=true";
  {
    ScopedEnv off("FLASHJIT_DQ_QUAD_ORDER", "0");
    EXPECT_EQ(marks(spec), 0);
    EXPECT_EQ(cpuPipelineText(config).find(option), std::string::npos);
  }
  ScopedEnv on("FLASHJIT_DQ_QUAD_ORDER", nullptr);
  EXPECT_EQ(marks(spec), 2);
  EXPECT_NE(cpuPipelineText(config).find(option), std::string::npos);
  EXPECT_NE(gpuPipelineText(config, GpuTarget()).find(option),
            std::string::npos);
  AttentionSpec odd = backwardSpec(100, 100, MaskKind::None);
  EXPECT_EQ(marks(odd), 0);
  AttentionSpec deterministic = spec;
  deterministic.deterministic = true;
  EXPECT_EQ(marks(deterministic), 0);
}

/// The Hopper PTX (a driver with PTX ISA 8.1): in quad order the dK/dV
/// kernel adds each thread's quad of a row with one red.global.add.v4.f32
/// where dq_accum's base is 16-byte aligned, and pairs where not; in column
/// order pairs only. On warpgroup MMAs (d 128, 64 x 128, two warpgroups of
/// 64 columns: 4 groups x 2 rows) and on mma.sync (d 64, 128 x 128: half
/// as many quads as pairs). sm_80 adds scalars either way, as many.
TEST(DqQuadOrder, HopperAddsQuads) {
  GpuTarget hopper;
  hopper.arch = "sm_90a";
  hopper.driverVersion = 12080;
  GpuTarget ampere;
  ampere.arch = "sm_80";
  /// The main kernel's reductions of `kind` for d = \p d at \p config on
  /// \p t, in quad order or not.
  auto count = [](int64_t d, const TileConfig &config, const GpuTarget &t,
                  bool quads, const char *kind) {
    ScopedEnv env("FLASHJIT_DQ_QUAD_ORDER", quads ? nullptr : "0");
    std::string module =
        compileToPtx(backwardSpec(d, d, MaskKind::None), config, t);
    size_t begin = module.find(".entry attention(");
    EXPECT_NE(begin, std::string::npos);
    std::string ptx =
        module.substr(begin, module.find(".entry", begin + 1) - begin);
    EXPECT_EQ(test::occurrences(ptx, "wgmma.mma_async") > 0,
              d == 128 && t.arch == "sm_90a");
    return test::occurrences(ptx, std::string("red.global.add.") + kind);
  };
  const TileConfig wgmma = test::tileConfig(64, 128, 8);
  EXPECT_EQ(count(128, wgmma, hopper, false, "v4.f32"), 0);
  EXPECT_EQ(count(128, wgmma, hopper, false, "v2.f32"), 16);
  EXPECT_EQ(count(128, wgmma, hopper, true, "v4.f32"), 8);
  EXPECT_EQ(count(128, wgmma, hopper, true, "v2.f32"), 16);
  const int scalars = count(128, wgmma, ampere, false, "f32");
  EXPECT_GT(scalars, 0);
  EXPECT_EQ(count(128, wgmma, ampere, true, "f32"), scalars);
  const TileConfig sync = test::tileConfig(128, 128, 8);
  const int pairs = count(64, sync, hopper, false, "v2.f32");
  EXPECT_GT(pairs, 0);
  EXPECT_EQ(count(64, sync, hopper, false, "v4.f32"), 0);
  EXPECT_EQ(count(64, sync, hopper, true, "v4.f32") * 2, pairs);
  EXPECT_EQ(count(64, sync, hopper, true, "v2.f32"), pairs);
}
