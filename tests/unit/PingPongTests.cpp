//===- PingPongTests.cpp - Which ring kernels take turns, in the PTX ------===//
//
/// \file
/// The K/V ring's consumer warpgroups take turns at the tensor cores
/// (KernelPlacement::pingPong) by default only where that was measured
/// faster (compiler/PipelineOptions.cpp, bench/NOTES.md T30): the plain
/// loop's two warpgroups; not the overlapped loop, not three warpgroups.
/// FLASHJIT_PING_PONG overrides the default; its mode 3 takes the turns
/// at the multi-function unit (each softmax) instead of the tensor cores.
/// Checked on the pipeline text (the cache key) and on the PTX's turn
/// barriers (`bar.arrive` on a warpgroup's named barrier, and where its
/// `bar.sync` stands), no GPU needed.
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

/// Unset, the mode follows the tiling; set, FLASHJIT_PING_PONG's 0, 1, 2
/// or 3 wins on every ring tiling; a value it does not know is the default;
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
    for (int64_t mode : {0, 1, 2, 3}) {
      PingPongEnv env(std::to_string(mode).c_str());
      EXPECT_EQ(pingPongMode(hopper, c.config), mode);
      EXPECT_NE(gpuPipelineText(c.config, hopper).find(modeText(mode)),
                std::string::npos);
    }
    for (const char *unknown : {"yes", "4"}) {
      PingPongEnv env(unknown);
      EXPECT_EQ(pingPongMode(hopper, c.config), c.defaultMode);
    }
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

/// Mode 3 orders the softmaxes, not the products: in d 128's overlapped
/// softcap loop each warpgroup's turn barrier is waited for after the
/// next block's S = Q K^T is waited for (`wgmma.wait_group 1`) and before
/// its tanh, and no batch of products waits for a turn; mode 0 has no
/// turn barrier at all.
TEST(PingPong, UnitTurnsOrderTheSoftmaxesNotTheProducts) {
  GpuTarget hopper;
  TileConfig overlapped = tileConfig(128, 128, 8);
  overlapped.overlapSoftmax = true;
  AttentionSpec spec;
  spec.headDimQK = spec.headDimV = 128;
  spec.scoreMod = "softcap:30";
  std::string turns, none;
  {
    PingPongEnv env("3");
    EXPECT_NE(gpuPipelineText(overlapped, hopper).find(modeText(3)),
              std::string::npos);
    turns = compileToPtx(spec, overlapped, hopper);
  }
  {
    PingPongEnv env("0");
    none = compileToPtx(spec, overlapped, hopper);
  }
  EXPECT_EQ(occurrences(none, "bar.arrive"), 0);
  // The loop's turn: a bar.sync on a warpgroup's barrier (a register
  // operand) between the wait for S and the first tanh after it.
  size_t wait = turns.find("wgmma.wait_group.sync.aligned 1;");
  ASSERT_NE(wait, std::string::npos);
  size_t sync = turns.find("bar.sync \t%r", wait);
  if (sync == std::string::npos)
    sync = turns.find("bar.sync %r", wait);
  size_t tanh = turns.find("tanh.approx", wait);
  ASSERT_NE(sync, std::string::npos);
  ASSERT_NE(tanh, std::string::npos);
  EXPECT_LT(sync, tanh);
  // No product waits for a turn: no bar.sync on a register barrier is
  // followed by a wgmma.fence before the next tanh or exp2.
  for (size_t at = turns.find("bar.sync"); at != std::string::npos;
       at = turns.find("bar.sync", at + 1)) {
    size_t fence = turns.find("wgmma.fence", at);
    size_t math =
        std::min(turns.find("tanh.approx", at), turns.find("ex2.approx", at));
    bool named = turns.compare(at, 12, "bar.sync \t%r") == 0 ||
                 turns.compare(at, 11, "bar.sync %r") == 0;
    if (named)
      EXPECT_LT(math, fence) << turns.substr(at, 40);
  }
  EXPECT_GE(occurrences(turns, "bar.arrive"), 2); // the first turn, a pass
}
