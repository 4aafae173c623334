//===- PingPongTests.cpp - Which ring kernels take turns, in the PTX ------===//
//
/// \file
/// The K/V ring's consumer warpgroups take turns at the tensor cores
/// (KernelPlacement::pingPong) by default only where that was measured
/// faster (compiler/PipelineOptions.cpp, bench/NOTES.md T30): the plain
/// loop's two warpgroups; not the overlapped loop, not three warpgroups.
/// FLASHJIT_PING_PONG overrides the default. Checked on the pipeline text
/// (the cache key) and on the PTX's turn barriers (`bar.arrive` on a
/// warpgroup's named barrier), no GPU needed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Compiler.h"
#include "tests/unit/AttentionCases.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

using namespace flashjit;
using flashjit::test::occurrences;
using flashjit::test::tileConfig;

namespace {

/// Sets FLASHJIT_PING_PONG for one scope (unset when \p value is null) and
/// restores what it was.
struct PingPongEnv : test::ScopedEnv {
  explicit PingPongEnv(const char *value)
      : ScopedEnv("FLASHJIT_PING_PONG", value) {}
};

/// The ring tilings of the defaults (kernels/GpuDefaults.h): d 128's
/// overlapped loop, d 64's three consumer warpgroups, d 256's plain loop.
struct RingCase {
  int64_t d;
  TileConfig config;
  int64_t defaultMode;
};

std::vector<RingCase> ringCases() {
  TileConfig overlapped = tileConfig(128, 128, 8);
  overlapped.overlapSoftmax = true;
  return {{128, overlapped, 0},
          {64, tileConfig(192, 128, 12), 0},
          {256, tileConfig(128, 64, 8), 1},
          {128, tileConfig(128, 128, 8), 1}};
}

std::string modeText(int64_t mode) {
  return " ping-pong=" + std::to_string(mode);
}

} // namespace

/// Unset, the mode follows the tiling; set, FLASHJIT_PING_PONG's 0, 1 or
/// 2 wins on every ring tiling; a value it does not know is the default;
/// without the ring (sm_80) there are no turns.
TEST(PingPong, DefaultFollowsTheTilingAndTheEnvironmentWins) {
  GpuTarget hopper;
  for (const RingCase &c : ringCases()) {
    SCOPED_TRACE(c.config.toJson());
    {
      PingPongEnv env(nullptr);
      EXPECT_EQ(pingPongMode(hopper, c.config), c.defaultMode);
      EXPECT_NE(gpuPipelineText(c.config, hopper).find(modeText(c.defaultMode)),
                std::string::npos);
    }
    for (int64_t mode : {0, 1, 2}) {
      PingPongEnv env(std::to_string(mode).c_str());
      EXPECT_EQ(pingPongMode(hopper, c.config), mode);
      EXPECT_NE(gpuPipelineText(c.config, hopper).find(modeText(mode)),
                std::string::npos);
    }
    PingPongEnv unknown("yes");
    EXPECT_EQ(pingPongMode(hopper, c.config), c.defaultMode);
  }
  GpuTarget ampere;
  ampere.arch = "sm_80";
  PingPongEnv env("1");
  EXPECT_EQ(pingPongMode(ampere, tileConfig(128, 64, 8)), 0);
}

/// The default's PTX: turn barriers exactly where the mode is 1, and the
/// same kernel as the explicit mode's.
TEST(PingPong, TurnBarriersOnlyWhereTheDefaultTakesTurns) {
  GpuTarget hopper;
  for (const RingCase &c : ringCases()) {
    SCOPED_TRACE(c.config.toJson());
    AttentionSpec spec;
    spec.headDimQK = spec.headDimV = c.d;
    std::string byDefault, explicitMode;
    {
      PingPongEnv env(nullptr);
      byDefault = compileToPtx(spec, c.config, hopper);
    }
    {
      PingPongEnv env(std::to_string(c.defaultMode).c_str());
      explicitMode = compileToPtx(spec, c.config, hopper);
    }
    EXPECT_EQ(byDefault, explicitMode);
    EXPECT_EQ(occurrences(byDefault, "bar.arrive") > 0, c.defaultMode == 1);
  }
}
