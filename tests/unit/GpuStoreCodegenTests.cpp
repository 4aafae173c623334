//===- GpuStoreCodegenTests.cpp - The forward's O stores, in the PTX ------===//
//
/// \file
/// The forward's output tile goes through the dead Q slot
/// (KernelPlacement::stagedStores) wherever its conditions hold, and is
/// stored element by element elsewhere: checked on the PTX, no GPU needed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "tests/unit/AttentionCases.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

using namespace flashjit;
using flashjit::test::tileConfig;

namespace {

/// How often \p needle occurs in \p text.
size_t occurrences(const std::string &text, const std::string &needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size()))
    ++n;
  return n;
}

/// The forward stores O through the dead Q slot (KernelPlacement::
/// stagedStores): one 16-byte vector store per 8 columns of a row and no
/// 2-byte stores, on every forward path with 16-byte copies (mma.sync, the
/// warpgroup tiles, the ring with two and three consumer warpgroups);
/// element by element where the copies are narrower (O's rows may be
/// unaligned), where grid.z splits O's columns (dv > 256) and with
/// FLASHJIT_STAGED_STORES=0.
TEST(GpuStoreCodegen, ForwardStoresWholeRowsThroughShared) {
  struct Case {
    int64_t d, dv;
    MaskKind mask;
    TileConfig config;
    const char *arch;
    int64_t copyBytes;
    size_t vectorStores; ///< 0: the element-wise store
  };
  TileConfig ring = tileConfig(128, 128, 8);
  ring.stages = 2;
  ring.overlapSoftmax = true;
  TileConfig three = tileConfig(192, 128, 12);
  three.stages = 2;
  // Per thread: the warp's 16 rows x dv / 8 chunks over 32 lanes (rounded
  // up: one guarded round for the rest).
  const Case cases[] = {
      {128, 128, MaskKind::None, ring, "sm_90a", 16, 8},
      {128, 128, MaskKind::Causal, ring, "sm_90a", 16, 8},
      {96, 96, MaskKind::None, three, "sm_90a", 16, 6},
      {64, 64, MaskKind::None, tileConfig(64, 128, 4), "sm_90a", 16, 4},
      {64, 64, MaskKind::SlidingWindow, tileConfig(128, 64, 4), "sm_80", 16, 8},
      {200, 72, MaskKind::None, tileConfig(64, 64, 4), "sm_80", 16, 5},
      {128, 128, MaskKind::None, ring, "sm_90a", 8, 0},
      {64, 512, MaskKind::None, tileConfig(64, 32, 4), "sm_80", 16, 0},
  };
  for (const Case &c : cases) {
    AttentionSpec spec;
    spec.headDimQK = c.d;
    spec.headDimV = c.dv;
    spec.mask = c.mask;
    GpuTarget target;
    target.arch = c.arch;
    target.copyBytes = c.copyBytes;
    SCOPED_TRACE(spec.name() + " " + c.config.toJson() + " " + c.arch +
                 " copy " + std::to_string(c.copyBytes));
    std::string ptx = compileToPtx(spec, c.config, target);
    EXPECT_EQ(occurrences(ptx, "st.global.v4.b32"), c.vectorStores);
    EXPECT_EQ(occurrences(ptx, "st.global.b16") == 0, c.vectorStores > 0);
  }
  AttentionSpec spec;
  GpuTarget target;
  ASSERT_EQ(setenv("FLASHJIT_STAGED_STORES", "0", 1), 0);
  std::string text = gpuPipelineText(ring, target);
  std::string ptx = compileToPtx(spec, ring, target);
  unsetenv("FLASHJIT_STAGED_STORES");
  EXPECT_NE(text.find("staged-stores=false"), std::string::npos) << text;
  EXPECT_EQ(occurrences(ptx, "st.global.v4.b32"), 0u);
  EXPECT_GT(occurrences(ptx, "st.global.b16"), 0u);
  EXPECT_EQ(gpuPipelineText(ring, target).find("staged-stores"),
            std::string::npos);
}

} // namespace
