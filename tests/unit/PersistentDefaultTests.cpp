//===- PersistentDefaultTests.cpp - Where the forward is persistent -------===//
//
/// \file
/// The K/V ring's forward runs as a persistent kernel with Q by its tensor
/// map where its tiling says so (TileConfig::persistent, queryByTensorMap):
/// by default only the unmasked d = 128 tiling (kernels/GpuDefaults.h; T31
/// measured it faster there and slower causal). FLASHJIT_PERSISTENT and
/// FLASHJIT_TMA override the tiling. Checked on the defaults, on the
/// pipeline text (the cache key) and on the kernel itself, no GPU needed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <string>

using namespace flashjit;
using flashjit::test::ScopedEnv;

namespace {

AttentionSpec forward(int64_t d, MaskKind mask = MaskKind::None) {
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = d;
  spec.mask = mask;
  return spec;
}

bool contains(const std::string &text, const std::string &what) {
  return text.find(what) != std::string::npos;
}

} // namespace

/// Only the plain d in 113..128 forward takes it: not causal, not a
/// sliding window, not block-sparse, not with a score or mask modifier,
/// not varlen, at no other head dim; and never without warpgroup MMAs and the
/// ring.
TEST(PersistentDefault, OnlyThePlainD128TilingTakesIt) {
  for (int64_t d : {32, 64, 96, 112, 113, 128, 192, 256})
    for (MaskKind mask :
         {MaskKind::None, MaskKind::Causal, MaskKind::SlidingWindow}) {
      AttentionSpec spec = forward(d, mask);
      const bool expected = d > 112 && d <= 128 && mask == MaskKind::None;
      const TileConfig ring = defaultGpuConfig(spec, true, true);
      SCOPED_TRACE(spec.name() + " " + ring.toJson());
      EXPECT_EQ(ring.persistent, expected);
      EXPECT_EQ(ring.queryByTensorMap, expected);
      EXPECT_FALSE(defaultGpuConfig(spec, true, false).persistent);
      EXPECT_FALSE(defaultGpuConfig(spec).persistent);
      EXPECT_NO_THROW(ring.validate(spec));
    }
  AttentionSpec sparse = forward(128);
  sparse.blockSparse = true;
  sparse.sparseBlock = 128;
  EXPECT_FALSE(defaultGpuConfig(sparse, true, true).persistent);
  AttentionSpec softcap = forward(128);
  softcap.scoreMod = "softcap:30";
  EXPECT_FALSE(defaultGpuConfig(softcap, true, true).persistent);
  AttentionSpec maskMod = forward(128);
  maskMod.maskModRegion = "(any mask_mod region)";
  EXPECT_FALSE(defaultGpuConfig(maskMod, true, true).persistent);
  AttentionSpec varlen = forward(128);
  varlen.varlen = true;
  EXPECT_FALSE(defaultGpuConfig(varlen, true, true).persistent);
  EXPECT_FALSE(defaultGpuConfig(varlen, true, true).queryByTensorMap);
}

/// Past d = 128 the ring's forward takes Bc = 80 (T37), plain and masked,
/// with the overlapped loop; where a sparse block of 128 needs a divisor of
/// it, T34's Bc = 64 on the same ring instead of the tilings without one.
TEST(PersistentDefault, PastD128TheRingTakesBc80) {
  for (int64_t d : {144, 192, 256})
    for (MaskKind mask :
         {MaskKind::None, MaskKind::Causal, MaskKind::SlidingWindow}) {
      AttentionSpec spec = forward(d, mask);
      const TileConfig ring = defaultGpuConfig(spec, true, true);
      SCOPED_TRACE(spec.name() + " " + ring.toJson());
      EXPECT_EQ(ring.blockM, 128);
      EXPECT_EQ(ring.blockN, 80);
      EXPECT_TRUE(ring.overlapSoftmax);
      spec.blockSparse = true;
      spec.sparseBlock = 128;
      const TileConfig sparse = defaultGpuConfig(spec, true, true);
      EXPECT_EQ(sparse.blockN, 64) << sparse.toJson();
      EXPECT_EQ(sparse.blockM, 128) << sparse.toJson();
      EXPECT_TRUE(sparse.overlapSoftmax) << sparse.toJson();
    }
  EXPECT_EQ(defaultGpuConfig(forward(128), true, true).blockN, 128);
  EXPECT_NE(defaultGpuConfig(forward(256), true, false).blockN, 80);
}

/// The backward takes neither: a named error.
TEST(PersistentDefault, TheBackwardRefusesIt) {
  AttentionSpec bwd = forward(128);
  bwd.direction = Direction::Backward;
  TileConfig config = test::tileConfig(64, 64);
  config.persistent = true;
  EXPECT_THROW(config.validate(bwd), SpecError);
  config.persistent = false;
  config.queryByTensorMap = true;
  EXPECT_THROW(config.validate(bwd), SpecError);
}

/// The pipeline text (so the cache key) follows the tiling; the
/// environment wins over it either way; 8-byte copies take no tensor maps
/// (the kernel stays persistent), sm_80 neither.
TEST(PersistentDefault, PipelineTextFollowsTheTilingAndTheEnvironment) {
  ScopedEnv p("FLASHJIT_PERSISTENT", nullptr), t("FLASHJIT_TMA", nullptr);
  GpuTarget hopper;
  const TileConfig d128 = defaultGpuConfig(forward(128), true, true);
  const TileConfig causal =
      defaultGpuConfig(forward(128, MaskKind::Causal), true, true);
  EXPECT_TRUE(contains(gpuPipelineText(d128, hopper), " persistent=true"));
  EXPECT_TRUE(contains(gpuPipelineText(d128, hopper), " tma=2"));
  EXPECT_FALSE(contains(gpuPipelineText(causal, hopper), " persistent=true"));
  EXPECT_TRUE(contains(gpuPipelineText(causal, hopper), " tma=1"));
  {
    ScopedEnv off("FLASHJIT_PERSISTENT", "0"), kv("FLASHJIT_TMA", "kv");
    EXPECT_FALSE(contains(gpuPipelineText(d128, hopper), " persistent=true"));
    EXPECT_TRUE(contains(gpuPipelineText(d128, hopper), " tma=1"));
  }
  {
    ScopedEnv on("FLASHJIT_PERSISTENT", "1"), qkv("FLASHJIT_TMA", "qkv");
    EXPECT_TRUE(contains(gpuPipelineText(causal, hopper), " persistent=true"));
    EXPECT_TRUE(contains(gpuPipelineText(causal, hopper), " tma=2"));
  }
  {
    ScopedEnv none("FLASHJIT_TMA", "0");
    EXPECT_FALSE(contains(gpuPipelineText(d128, hopper), " tma="));
  }
  GpuTarget narrow;
  narrow.copyBytes = 8;
  EXPECT_TRUE(usesPersistentKernel(narrow, d128));
  EXPECT_EQ(tensorMapMode(narrow, d128), 0);
  GpuTarget ampere;
  ampere.arch = "sm_80";
  EXPECT_FALSE(usesPersistentKernel(ampere, d128));
  EXPECT_EQ(tensorMapMode(ampere, d128), 0);
}

/// The default d = 128 kernel is the one the switches force on the same
/// tiling without the flags (a persistent grid, Q by its tensor map), and
/// not the one-tile-per-program kernel.
TEST(PersistentDefault, DefaultKernelIsTheSwitchedOne) {
  ScopedEnv p("FLASHJIT_PERSISTENT", nullptr), t("FLASHJIT_TMA", nullptr);
  GpuTarget hopper;
  AttentionSpec spec = forward(128);
  const TileConfig d128 = defaultGpuConfig(spec, true, true);
  TileConfig bare = d128;
  bare.persistent = bare.queryByTensorMap = false;
  const GpuCompilation byDefault = compileForGpu(spec, d128, hopper);
  const GpuCompilation once = compileForGpu(spec, bare, hopper);
  GpuCompilation forced;
  {
    ScopedEnv on("FLASHJIT_PERSISTENT", "1"), qkv("FLASHJIT_TMA", "qkv");
    forced = compileForGpu(spec, bare, hopper);
  }
  ASSERT_EQ(byDefault.kernels.size(), 1u);
  ASSERT_EQ(once.kernels.size(), 1u);
  EXPECT_TRUE(byDefault.kernels[0].persistent);
  EXPECT_FALSE(once.kernels[0].persistent);
  EXPECT_EQ(byDefault.ptx, forced.ptx);
  EXPECT_NE(byDefault.ptx, once.ptx);
  // Q's map besides K's and V's.
  EXPECT_EQ(byDefault.kernels[0].tensorMaps.size(),
            once.kernels[0].tensorMaps.size() + 1);
}
