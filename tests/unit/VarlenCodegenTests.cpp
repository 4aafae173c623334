//===- VarlenCodegenTests.cpp - Variable-length kernels in the PTX --------===//
//
/// \file
/// The GPU lowering of varlen kernels (AttentionSpec::varlen), no GPU
/// needed: every forward path (the sm_90a default with the K/V ring,
/// warpgroup tiles without it, mma.sync, the split-KV partial and its
/// combine, a row kernel whose accesses must share their rows) and both
/// backward modes compile to PTX that assembles; a sequence's rows are no
/// tensor map's (the ring copies by cp.async); the offsets are read.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "runtime/NvJitLink.h"
#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <string>

using namespace flashjit;
using flashjit::test::tileConfig;

namespace {

AttentionSpec varlenSpec(int64_t d, MaskKind mask, int64_t gqa) {
  AttentionSpec s;
  s.headDimQK = s.headDimV = d;
  s.mask = mask;
  s.gqaGroup = gqa;
  s.varlen = true;
  return s;
}

/// Compiles \p spec with \p config for \p arch and checks the result.
void checkCompiles(const AttentionSpec &spec, const TileConfig &config,
                   const char *arch) {
  GpuTarget target;
  target.arch = arch;
  SCOPED_TRACE(spec.name() + " " + config.toJson() + " " + arch);
  GpuCompilation c = compileForGpu(spec, config, target);
  ASSERT_FALSE(c.kernels.empty());
  for (const KernelLaunch &k : c.kernels)
    EXPECT_TRUE(k.tensorMaps.empty()) << k.name;
  // The kernels read cu_seqlens_q (parameter 7 of the forward's ABI, 15
  // of the backward's); a dense kernel never does.
  const bool backward = spec.direction == Direction::Backward;
  EXPECT_NE(c.ptx.find(backward ? "_param_15]" : "_param_7]"),
            std::string::npos);
  if (rt::NvJitLink::get().available())
    EXPECT_NO_THROW(rt::ptxToCubin(c.ptx, arch));
}

TEST(VarlenCodegen, ForwardPathsCompile) {
  for (const char *arch : {"sm_90a", "sm_80"}) {
    GpuTarget target;
    target.arch = arch;
    for (MaskKind mask : {MaskKind::None, MaskKind::Causal}) {
      AttentionSpec spec = varlenSpec(128, mask, 2);
      // The default: on sm_90a the K/V ring.
      checkCompiles(spec,
                    defaultGpuConfig(spec, usesWgmma(target),
                                     usesKvRing(target)),
                    arch);
    }
    // Split-KV decode: GQA-packed partial and the combine (a row kernel).
    TileConfig split = tileConfig(16, 64);
    split.warps = 1;
    split.splits = TileConfig::kAutoSplits;
    checkCompiles(varlenSpec(128, MaskKind::None, 8), split, arch);
    TileConfig narrow = tileConfig(64, 64);
    narrow.warps = 4;
    checkCompiles(varlenSpec(96, MaskKind::SlidingWindow, 1), narrow, arch);
    // Without varlen the offsets are never read.
    AttentionSpec dense = varlenSpec(96, MaskKind::SlidingWindow, 1);
    dense.varlen = false;
    EXPECT_EQ(compileToPtx(dense, narrow, target).find("_param_7]"),
              std::string::npos);
  }
}

TEST(VarlenCodegen, BackwardModesCompile) {
  for (const char *arch : {"sm_90a", "sm_80"})
    for (bool deterministic : {false, true}) {
      AttentionSpec spec = varlenSpec(64, MaskKind::Causal, 2);
      spec.direction = Direction::Backward;
      spec.deterministic = deterministic;
      checkCompiles(spec, defaultGpuBackwardConfig(spec), arch);
    }
}

} // namespace
