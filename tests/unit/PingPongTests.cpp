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

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

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

/// A causal forward on the overlapped loop takes turns at the
/// multi-function unit by default (T43, H200: +0.5-3.5%), and its kernel
/// is mode 3's; with a score modifier, a mask_mod, a block-sparse layout,
/// split KV, without the mask, on another tiling or as a backward, the
/// default stays the tiling's; FLASHJIT_PING_PONG still wins.
TEST(PingPong, CausalOverlappedForwardTakesUnitTurns) {
  GpuTarget hopper;
  TileConfig overlapped = tileConfig(128, 128, 8);
  overlapped.overlapSoftmax = true;
  AttentionSpec causal;
  causal.mask = MaskKind::Causal;
  {
    PingPongEnv env(nullptr);
    EXPECT_EQ(pingPongMode(hopper, overlapped, &causal), 3);
    EXPECT_NE(gpuPipelineText(overlapped, hopper, &causal).find(modeText(3)),
              std::string::npos);
    EXPECT_EQ(pingPongMode(hopper, overlapped), 0);
    AttentionSpec other = causal;
    other.scoreMod = "softcap:30";
    EXPECT_EQ(pingPongMode(hopper, overlapped, &other), 0);
    other = causal;
    other.maskModRegion = "{}";
    EXPECT_EQ(pingPongMode(hopper, overlapped, &other), 0);
    other = causal;
    other.blockSparse = true;
    EXPECT_EQ(pingPongMode(hopper, overlapped, &other), 0);
    other = causal;
    other.direction = Direction::Backward;
    EXPECT_EQ(pingPongMode(hopper, overlapped, &other), 0);
    other = causal;
    other.mask = MaskKind::None;
    EXPECT_EQ(pingPongMode(hopper, overlapped, &other), 0);
    TileConfig split = overlapped;
    split.splits = 4;
    EXPECT_EQ(pingPongMode(hopper, split, &causal), 0);
    EXPECT_EQ(pingPongMode(hopper, tileConfig(128, 128, 8), &causal), 1);
  }
  std::string byDefault, mode3;
  {
    PingPongEnv env(nullptr);
    byDefault = compileToPtx(causal, overlapped, hopper);
  }
  {
    PingPongEnv env("3");
    mode3 = compileToPtx(causal, overlapped, hopper);
  }
  EXPECT_EQ(byDefault, mode3);
  EXPECT_GT(occurrences(byDefault, "bar.arrive"), 0);
  PingPongEnv env("0");
  EXPECT_EQ(pingPongMode(hopper, overlapped, &causal), 0);
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

/// Mode 3 orders the softmaxes, not the products, checked on the GPU
/// stage (its loops keep the tile IR's order). After a warpgroup's turn
/// barrier (`bar.sync $0, 256`, the barrier a register) comes a tanh or
/// exp2 before any product is fenced: in d 128's overlapped softcap loop
/// after the next block's S is waited for (`wgmma.wait_group 1`), in the
/// plain loop (d 256's two warpgroups, d 64's three) before P's
/// exponentials. The turn is handed on (`bar.arrive $0, 256`) after that
/// softmax and after the commit of every product issued in it. Mode 0
/// has no turn barrier.
TEST(PingPong, UnitTurnsOrderTheSoftmaxesNotTheProducts) {
  GpuTarget hopper;
  TileConfig overlapped = tileConfig(128, 128, 8);
  overlapped.overlapSoftmax = true;
  struct Case {
    int64_t d;
    const char *scoreMod;
    TileConfig config;
  };
  for (const Case &c : {Case{128, "softcap:30", overlapped},
                        Case{256, "", tileConfig(128, 64, 8)},
                        Case{64, "", tileConfig(192, 128, 12)}}) {
    SCOPED_TRACE(c.config.toJson());
    AttentionSpec spec;
    spec.headDimQK = spec.headDimV = c.d;
    spec.scoreMod = c.scoreMod;
    std::string turns, none;
    {
      PingPongEnv env("3");
      EXPECT_NE(gpuPipelineText(c.config, hopper).find(modeText(3)),
                std::string::npos);
      turns = emitStage(spec, c.config, Stage::Gpu, hopper);
    }
    {
      PingPongEnv env("0");
      none = emitStage(spec, c.config, Stage::Gpu, hopper);
    }
    const char *turnSync = "\"bar.sync $0, 256;\"";
    const char *turnPass = "\"bar.arrive $0, 256;\"";
    EXPECT_EQ(none.find(turnSync), std::string::npos);
    EXPECT_EQ(none.find(turnPass), std::string::npos);
    size_t sync = turns.find(turnSync);
    ASSERT_NE(sync, std::string::npos);
    size_t math = std::min(turns.find("tanh.approx", sync),
                           turns.find("ex2.approx", sync));
    size_t fence = turns.find("wgmma.fence", sync);
    size_t pass = turns.find(turnPass, sync);
    ASSERT_NE(math, std::string::npos);
    ASSERT_NE(pass, std::string::npos);
    EXPECT_LT(math, fence); // no product waits for the turn
    EXPECT_LT(math, pass);  // the turn holds the softmax
    // Every product issued in the turn is committed before it is passed.
    size_t lastIssue = turns.rfind("wgmma.mma_async", pass);
    if (lastIssue != std::string::npos && lastIssue > sync)
      EXPECT_LT(lastIssue, turns.rfind("wgmma.commit_group", pass));
    if (c.config.overlapSoftmax)
      EXPECT_LT(turns.rfind("wgmma.wait_group.sync.aligned 1;", sync), sync);
  }
}
