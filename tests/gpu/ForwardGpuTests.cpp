//===- ForwardGpuTests.cpp - The forward kernel on the GPU vs float64 -----===//
//
/// \file
/// Runs `flashjit run --device cuda --json` over the CPU suite's matrix,
/// larger shapes and the score modifiers. The CLI does what a kernel test
/// must: fresh random inputs, NaN-poisoned outputs, one checked launch
/// against a float64 reference (sampled rows for large problems). Keeping
/// LLVM inside libflashjit.so and driving it through the binary keeps this
/// test tiny (the GPU machine gets one copy of LLVM). Skipped, and shown as
/// skipped, without a driver.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "tests/gpu/CliRunner.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <unistd.h>

namespace {

using flashjit::test::jsonNumber;
using flashjit::test::runFlashjit;

class ForwardGpu : public ::testing::TestWithParam<const char *> {
protected:
  void SetUp() override {
    if (!flashjit::rt::CudaDriver::get().available())
      GTEST_SKIP() << "skipped: no CUDA driver";
  }
};

/// Runs \p args (a fresh layout seed for a block-sparse one) and checks the
/// result against the float64 reference; returns the JSON line.
std::string runAndCheck(std::string args, const std::string &env = "") {
  // Random layouts get a fresh seed each run (reported on failure).
  if (args.find("--block-sparse") != std::string::npos)
    args += " --seed " + std::to_string(std::random_device{}() % 100000);
  auto r = runFlashjit("run --device cuda --json " + args, env);
  SCOPED_TRACE("flashjit run --device cuda --json " + args + "\n" + r.out);
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos);
  EXPECT_NE(r.out.find("\"device\":\"cuda\""), std::string::npos);
  double relErr = jsonNumber(r.out, "rel_err");
  EXPECT_LT(relErr, jsonNumber(r.out, "bound"));
  EXPECT_EQ(jsonNumber(r.out, "nan_count"), 0);
  return r.out;
}

TEST_P(ForwardGpu, MatchesFloat64Reference) { runAndCheck(GetParam()); }

/// The tilings Hopper runs on warpgroup MMAs (one warpgroup per 64 rows of
/// Q: warps = Br / 16), across head dims, masks, GQA, block-sparse and
/// Nq != Nkv, without the K/V ring (FLASHJIT_KV_RING=0); on sm_90a they
/// must take wgmma, elsewhere mma.sync.
class ForwardWgmmaGpu : public ForwardGpu {};

TEST_P(ForwardWgmmaGpu, MatchesFloat64Reference) {
  std::string out = runAndCheck(GetParam(), "FLASHJIT_KV_RING=0");
  const bool hopper = out.find("\"arch\":\"sm_90a\"") != std::string::npos;
  EXPECT_NE(out.find(hopper ? "\"mma\":\"wgmma\"" : "\"mma\":\"mma.sync\""),
            std::string::npos)
      << GetParam() << "\n"
      << out;
  EXPECT_NE(out.find("\"kv_ring\":0"), std::string::npos) << out;
}

/// The same tilings with the K/V ring (the default on sm_90a; the test sets
/// FLASHJIT_KV_RING=1 all the same): on sm_90a a producer warpgroup fills
/// --stages S (default 2) stages for the tilings of 8 warps, none with
/// --stages 1 or other warps; elsewhere no ring.
class ForwardKvRingGpu : public ForwardGpu {};

TEST_P(ForwardKvRingGpu, MatchesFloat64Reference) {
  const std::string args = GetParam();
  std::string out = runAndCheck(args, "FLASHJIT_KV_RING=1");
  const bool hopper = out.find("\"arch\":\"sm_90a\"") != std::string::npos;
  std::string stages = "2";
  if (size_t at = args.find("--stages "); at != std::string::npos)
    stages = args.substr(at + 9, 1);
  bool takesRing = args.find("--warps 8") != std::string::npos;
  if (args.find("--warps") == std::string::npos) // the default tiling: the
    takesRing = args.find("--head-dim 128 ") !=
                std::string::npos; // ring
                                   // at d 113..128 (unmasked from 97)
  const std::string ring = hopper && stages != "1" && takesRing ? stages : "0";
  EXPECT_NE(out.find("\"kv_ring\":" + ring), std::string::npos) << args << "\n"
                                                                << out;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Tilings, ForwardWgmmaGpu, ::testing::Values(
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --batch 2 --heads 2 --seq-len 1000",
  "--head-dim 64 --block-m 128 --block-n 128 --warps 8 --causal --seq-len 999",
  "--head-dim 96 --dtype fp16 --block-m 128 --block-n 64 --warps 8 --window 100,20 --seq-len 1025",
  "--head-dim 128 --block-m 64 --block-n 128 --warps 4 --gqa 2 --heads 4 --seq-len 300 --seq-len-kv 700",
  "--head-dim 40 --head-dim-v 72 --block-m 128 --block-n 64 --warps 8 --seq-len 100 --seq-len-kv 333",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --block-sparse 0.5 --sparse-block 128 --seq-len 1025",
  "--head-dim 256 --block-m 64 --block-n 64 --warps 4 --causal --seq-len 500",
  "--head-dim 1 --block-m 64 --block-n 32 --warps 4 --seq-len 17",
  "--head-dim 128 --block-m 192 --block-n 128 --warps 12 --causal --seq-len 700 --seq-len-kv 1500",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --batch 2 --heads 16 --seq-len 16384"
));
// clang-format on

// Score modifiers (issue 14): the region inlined in the tile IR runs on
// the GPU as on the CPU, and the float64 reference applies the same
// modifier. On sm_90a, the default tiling at d = 128 (128 x 128, 8 warps,
// the K/V ring and the overlapped loop) and an explicit one must take
// wgmma.
// Softcaps small against the scores (--scale 2 or 4) so that they change
// the softmax; ALiBi's H is the heads (--heads defaults to it).
// clang-format off
INSTANTIATE_TEST_SUITE_P(ScoreMods, ForwardWgmmaGpu, ::testing::Values(
  "--head-dim 128 --score-mod softcap:5 --scale 2 --batch 2 --heads 2 --seq-len 1000",
  "--head-dim 128 --score-mod alibi:4 --batch 2 --seq-len 1000 --seq-len-kv 1100",
  "--head-dim 128 --score-mod softcap:3 --scale 4 --causal --heads 2 --seq-len 777",
  "--head-dim 128 --score-mod alibi:8 --gqa 2 --causal --seq-len 999 --seq-len-kv 1200",
  "--head-dim 64 --block-m 128 --block-n 128 --warps 8 --score-mod alibi:2 --window 100,20 --seq-len 1025",
  // Regions given as text (run from the repository root): sin, cos,
  // floor, ceil, sqrt, rsqrt, abs, min and max; a distance bias by select.
  "--head-dim 128 --score-mod @tests/lit/Inputs/score-mod-trig.mlir --batch 2 --heads 2 --seq-len 1000",
  "--head-dim 64 --score-mod @tests/lit/Inputs/score-mod-distance.mlir --gqa 2 --heads 4 --causal --seq-len 700 --seq-len-kv 900"
));
// clang-format on

// clang-format off
INSTANTIATE_TEST_SUITE_P(ScoreMods, ForwardGpu, ::testing::Values(
  "--head-dim 64 --score-mod softcap:2 --scale 4 --seq-len 1000",
  "--head-dim 96 --dtype fp16 --score-mod softcap:5 --scale 2 --window 100,20 --seq-len 1025",
  "--head-dim 64 --score-mod alibi:4 --seq-len 17 --seq-len-kv 1000",
  "--head-dim 80 --dtype fp16 --score-mod alibi:8 --gqa 4 --causal --seq-len 300 --seq-len-kv 130",
  "--head-dim 32 --score-mod alibi:1 --window 64,64 --seq-len 300",
  "--head-dim 64 --score-mod alibi:2 --causal --block-sparse 0.5 --sparse-block 128 --seq-len 512",
  "--head-dim 128 --block-m 64 --block-n 32 --warps 4 --score-mod alibi:2 --causal --seq-len 777",
  // Large: N = 16K, sampled rows are checked.
  "--head-dim 128 --score-mod alibi:16 --causal --batch 2 --seq-len 16384",
  "--head-dim 128 --score-mod softcap:10 --scale 1 --batch 2 --heads 16 --seq-len 16384"
));
// clang-format on

// clang-format off
INSTANTIATE_TEST_SUITE_P(Tilings, ForwardKvRingGpu, ::testing::Values(
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --batch 2 --heads 2 --seq-len 1000",
  "--head-dim 64 --block-m 128 --block-n 128 --warps 8 --causal --seq-len 999",
  "--head-dim 96 --dtype fp16 --block-m 128 --block-n 64 --warps 8 --window 100,20 --seq-len 1025",
  "--head-dim 128 --block-m 64 --block-n 128 --warps 4 --gqa 2 --heads 4 --seq-len 300 --seq-len-kv 700",
  "--head-dim 40 --head-dim-v 72 --block-m 128 --block-n 64 --warps 8 --seq-len 100 --seq-len-kv 333",
  "--head-dim 256 --block-m 64 --block-n 64 --warps 4 --causal --seq-len 500",
  "--head-dim 1 --block-m 64 --block-n 32 --warps 4 --seq-len 17",
  "--head-dim 128 --block-m 128 --block-n 64 --warps 8 --causal --batch 2 --heads 16 --seq-len 16384",
  "--head-dim 128 --seq-len 4096 --batch 2 --heads 4",
  "--head-dim 64 --causal --seq-len 1 --seq-len-kv 4000",
  // The ring's depth: none, 3 and 4 stages (several passes over the ring).
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --stages 1 --seq-len 1000",
  "--head-dim 64 --block-m 128 --block-n 64 --warps 8 --stages 3 --causal --seq-len 1000 --seq-len-kv 1200",
  "--head-dim 128 --block-m 128 --block-n 64 --warps 8 --stages 4 --gqa 4 --heads 8 --seq-len 2000",
  "--head-dim 256 --block-m 128 --block-n 128 --warps 8 --stages 1 --seq-len 600",
  "--head-dim 96 --block-m 128 --block-n 128 --warps 8 --block-sparse 0.3 --sparse-block 128 --causal --batch 2 --heads 3 --seq-len 3000",
  // Past d = 128 (the consumers take 216 registers, the producer 64).
  "--head-dim 256 --block-m 128 --block-n 64 --warps 8 --causal --batch 2 --heads 2 --seq-len 1000 --seq-len-kv 1100",
  "--head-dim 192 --head-dim-v 256 --block-m 128 --block-n 32 --warps 8 --stages 4 --gqa 2 --heads 4 --seq-len 700",
  "--head-dim 200 --dtype fp16 --block-m 128 --block-n 48 --warps 8 --stages 3 --window 100,20 --seq-len 1025",
  "--head-dim 256 --block-m 128 --block-n 64 --warps 8 --block-sparse 0.5 --sparse-block 128 --seq-len 2000"
));
// clang-format on

/// The ring's consumer warpgroups in turn (FLASHJIT_PING_PONG, the
/// `ping-pong` option): each mode on tilings with two consumer warpgroups,
/// masks, GQA, Nq != Nkv, several passes over 3 stages and a loop of no
/// iterations; `run --json` must report the mode on sm_90a (0 elsewhere,
/// and with one consumer warpgroup).
class ForwardPingPongGpu
    : public ::testing::TestWithParam<std::tuple<int, const char *>> {
protected:
  void SetUp() override {
    if (!flashjit::rt::CudaDriver::get().available())
      GTEST_SKIP() << "skipped: no CUDA driver";
  }
};

TEST_P(ForwardPingPongGpu, MatchesFloat64Reference) {
  const auto [mode, args] = GetParam();
  std::string out = runAndCheck(args, "FLASHJIT_KV_RING=1 FLASHJIT_PING_PONG=" +
                                          std::to_string(mode));
  const bool hopper = out.find("\"arch\":\"sm_90a\"") != std::string::npos;
  const bool twoGroups =
      std::string(args).find("--warps 4") == std::string::npos;
  const int expected = hopper && twoGroups ? mode : 0;
  EXPECT_NE(out.find("\"ping_pong\":" + std::to_string(expected)),
            std::string::npos)
      << args << "\n"
      << out;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Modes, ForwardPingPongGpu, ::testing::Combine(
  ::testing::Values(0, 1, 2, 3), ::testing::Values(
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --batch 2 --heads 2 --seq-len 1000",
  "--head-dim 64 --block-m 128 --block-n 128 --warps 8 --causal --seq-len 999 --seq-len-kv 1500",
  "--head-dim 96 --block-m 128 --block-n 64 --warps 8 --stages 3 --window 100,20 --gqa 2 --heads 4 --seq-len 2000",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --seq-len 1 --seq-len-kv 4000",
  "--head-dim 128 --block-m 64 --block-n 128 --warps 4 --seq-len 300")));
// clang-format on

// clang-format off
INSTANTIATE_TEST_SUITE_P(Matrix, ForwardGpu, ::testing::Values(
  "--head-dim 1 --seq-len 17 --heads 2",
  "--head-dim 7 --dtype fp16 --causal --seq-len 128",
  "--head-dim 16 --seq-len 1000",
  "--head-dim 33 --head-dim-v 64 --causal --seq-len 17 --seq-len-kv 1000",
  "--head-dim 64 --dtype fp16 --window 100,20 --seq-len 1025",
  "--head-dim 80 --gqa 4 --batch 2 --heads 8 --seq-len 128",
  "--head-dim 96 --causal --heads 2 --seq-len 1000 --seq-len-kv 128",
  "--head-dim 100 --head-dim-v 80 --seq-len 1",
  "--head-dim 128 --block-sparse 0.5 --sparse-block 64 --batch 2 --heads 2 --seq-len 1025",
  "--head-dim 160 --head-dim-v 128 --dtype fp16 --causal --block-sparse 0.7 --sparse-block 64 --heads 2 --seq-len 256",
  "--head-dim 256 --window 64,64 --seq-len 300",
  "--head-dim 512 --seq-len 128",
  "--head-dim 300 --head-dim-v 400 --causal --seq-len 200",
  "--head-dim 64 --packed-qkv --causal --batch 2 --heads 4 --seq-len 200",
  "--head-dim 128 --dtype fp16 --window 10,10 --seq-len 300 --seq-len-kv 100",
  "--head-dim 64 --gqa 2 --causal --block-sparse 0.5 --batch 2 --heads 4 --seq-len 512",
  "--head-dim 32 --head-dim-v 16 --dtype fp16 --window 5,0 --seq-len 100 --seq-len-kv 140",
  "--head-dim 128 --block-m 64 --block-n 32 --warps 4 --seq-len 777",
  "--head-dim 64 --block-m 128 --block-n 128 --warps 4 --causal --seq-len 999",
  // The sm_90a defaults of T15 (three consumer warpgroups to d = 96, masked
  // to 64; 128 x 64 on the ring past d = 128, unmasked too).
  "--head-dim 96 --seq-len 1500",
  "--head-dim 56 --causal --gqa 2 --heads 4 --seq-len 1300",
  "--head-dim 200 --head-dim-v 256 --seq-len 700 --seq-len-kv 900",
  // Large: N = 16K, B * H = 32 (sampled rows are checked).
  "--head-dim 128 --batch 2 --heads 16 --seq-len 16384",
  "--head-dim 128 --causal --batch 2 --heads 16 --seq-len 16384",
  "--head-dim 64 --dtype fp16 --batch 1 --heads 32 --seq-len 16384 --causal"
));
// clang-format on

/// The persistent kernel (FLASHJIT_PERSISTENT=1, with the tile schedule,
/// on by default): a grid of the SMs loops
/// over the tiles, the ring's positions going on from tile to tile, with
/// more tiles than SMs (several per program, the ring's phases carried
/// over) and fewer, masks (the causal order), GQA, Nq != Nkv, rows that
/// see no key, block-sparse, score modifiers, the overlapped loop, three
/// consumer warpgroups, past d = 128 and 1, 3, 4 stages; `run --json`
/// must report it exactly where the ring is (sm_90a).
class ForwardPersistentGpu : public ForwardGpu {};

TEST_P(ForwardPersistentGpu, MatchesFloat64Reference) {
  const std::string args = GetParam();
  std::string out = runAndCheck(args, "FLASHJIT_PERSISTENT=1");
  const bool ring = out.find("\"kv_ring\":0") == std::string::npos;
  EXPECT_NE(
      out.find(std::string("\"persistent\":") + (ring ? "true" : "false")),
      std::string::npos)
      << args << "\n"
      << out;
  const bool hopper = out.find("\"arch\":\"sm_90a\"") != std::string::npos;
  if (hopper && args.find("--stages 1") == std::string::npos)
    EXPECT_TRUE(ring) << args << "\n" << out;
  // Causal, the ring's persistent kernel runs the launcher's tile
  // schedule (kernels/TileSchedule.h; the default); any other, none.
  const bool causal = args.find("--causal") != std::string::npos;
  EXPECT_NE(out.find(std::string("\"tile_schedule\":") +
                     (ring && causal ? "true" : "false")),
            std::string::npos)
      << args << "\n"
      << out;
}

/// With FLASHJIT_TILE_SCHEDULE=0: the scheduled (causal)
/// persistent kernel given a null schedule takes the fixed stride over the
/// heaviest Q blocks first, and still matches the float64 reference.
class ForwardStrideGpu : public ForwardGpu {};

TEST_P(ForwardStrideGpu, MatchesFloat64Reference) {
  const std::string args = GetParam();
  std::string out =
      runAndCheck(args, "FLASHJIT_PERSISTENT=1 FLASHJIT_TILE_SCHEDULE=0");
  EXPECT_NE(out.find("\"tile_schedule\":false"), std::string::npos)
      << args << "\n"
      << out;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Tilings, ForwardStrideGpu, ::testing::Values(
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --batch 2 --heads 30 --seq-len 3000 --seq-len-kv 3100",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --causal --gqa 4 --heads 64 --seq-len 900 --seq-len-kv 700",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --heads 200 --seq-len 100 --seq-len-kv 50"
));
// clang-format on

// clang-format off
INSTANTIATE_TEST_SUITE_P(Tilings, ForwardPersistentGpu, ::testing::Values(
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --batch 4 --heads 40 --seq-len 1000",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --batch 2 --heads 30 --seq-len 3000 --seq-len-kv 3100",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --batch 3 --heads 50 --seq-len 1100",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --causal --gqa 4 --heads 64 --seq-len 900 --seq-len-kv 700",
  "--head-dim 64 --block-m 192 --block-n 128 --warps 12 --batch 2 --heads 70 --seq-len 2000",
  "--head-dim 96 --dtype fp16 --block-m 128 --block-n 64 --warps 8 --stages 3 --window 100,20 --gqa 2 --heads 80 --seq-len 1025",
  "--head-dim 256 --block-m 128 --block-n 64 --warps 8 --causal --heads 60 --seq-len 1500",
  "--head-dim 192 --head-dim-v 128 --block-m 128 --block-n 32 --warps 8 --stages 4 --heads 40 --seq-len 777 --seq-len-kv 1300",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --block-sparse 0.3 --sparse-block 128 --causal --batch 2 --heads 40 --seq-len 2048",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --heads 200 --seq-len 100 --seq-len-kv 50",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --score-mod softcap:20 --heads 40 --seq-len 1000",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --seq-len 300",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --stages 1 --heads 30 --seq-len 1000",
  "--head-dim 128 --causal --batch 2 --heads 16 --seq-len 16384"
));
// clang-format on

/// Cases of a share (eighths, a variable's value) and the run's flags.
class ForwardShareGpu
    : public ::testing::TestWithParam<std::tuple<const char *, const char *>> {
protected:
  void SetUp() override {
    if (!flashjit::rt::CudaDriver::get().available())
      GTEST_SKIP() << "skipped: no CUDA driver";
  }
};

/// A share of the softmax's exponentials by arithmetic
/// (FLASHJIT_EXP2_EMULATION, TileToGPUExp2.cpp): the forward still matches
/// the float64 reference with some, half and all of the P tile's registers
/// emulated, plain, causal (rows past the diagonal: x = -inf), softcap,
/// fp16, a window, rows that see no key (Nq > Nkv, causal), the
/// persistent default.
class ForwardExp2EmulationGpu : public ForwardShareGpu {};

TEST_P(ForwardExp2EmulationGpu, MatchesFloat64Reference) {
  auto [eighths, args] = GetParam();
  runAndCheck(args, std::string("FLASHJIT_EXP2_EMULATION=") + eighths);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Shares, ForwardExp2EmulationGpu, ::testing::Combine(
  ::testing::Values("2", "4", "8"),
  ::testing::Values(
    "--head-dim 128 --batch 2 --heads 8 --seq-len 1000",
    "--head-dim 128 --causal --heads 8 --seq-len 777 --seq-len-kv 900",
    "--head-dim 128 --score-mod softcap:30 --heads 8 --seq-len 1100",
    "--head-dim 128 --dtype fp16 --score-mod softcap:5 --causal --heads 8 --seq-len 600",
    "--head-dim 64 --window 30,0 --heads 8 --seq-len 300 --seq-len-kv 500",
    "--head-dim 64 --causal --heads 8 --seq-len 500 --seq-len-kv 300")));
// clang-format on

/// A score tile's tanh by a polynomial on the FMA pipe where each warp's
/// arguments lie in [-1, 1] (FLASHJIT_TANH_POLYNOMIAL=K eighths of its
/// registers, TileToGPUTanh.cpp), 2 and 8: the forward matches the float64
/// reference where every warp takes the polynomial (softcap:30 on
/// unit-scale scores), where warps take either side (softcap:2,
/// softcap:3), where most take tanh.approx (softcap:0.5), with causal rows
/// past the diagonal and rows that see no key, fp16, GQA with a window,
/// d 64 and d 256.
class ForwardTanhPolynomialGpu : public ForwardShareGpu {};

TEST_P(ForwardTanhPolynomialGpu, MatchesFloat64Reference) {
  auto [eighths, args] = GetParam();
  runAndCheck(args, std::string("FLASHJIT_TANH_POLYNOMIAL=") + eighths);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Sides, ForwardTanhPolynomialGpu, ::testing::Combine(
  ::testing::Values("2", "8"),
  ::testing::Values(
    "--head-dim 128 --score-mod softcap:30 --heads 8 --seq-len 1100",
    "--head-dim 128 --score-mod softcap:2 --causal --heads 8 --seq-len 777 --seq-len-kv 900",
    "--head-dim 128 --dtype fp16 --score-mod softcap:0.5 --heads 4 --seq-len 600",
    "--head-dim 128 --score-mod softcap:30 --causal --heads 8 --seq-len 500 --seq-len-kv 300",
    "--head-dim 64 --score-mod softcap:3 --gqa 4 --heads 8 --window 300,40 --seq-len 2000",
    "--head-dim 256 --score-mod softcap:2 --heads 2 --seq-len 700")));
// clang-format on

/// The K/V ring's copies by the tensor memory accelerator (the default on
/// sm_90a with 16-byte aligned tensors; FLASHJIT_TMA=0: cp.async), each
/// case both ways: head dims whose last box is part zeros (40, 72, 96),
/// dqk != dv, rows past Nkv (zeros from the map's bounds), GQA (the KV
/// head as a coordinate), packed QKV (rows 3 H d apart, heads d apart),
/// masks, block-sparse lists, score modifiers, N = 1, fp16, the
/// overlapped loop, three consumer warpgroups, 1 to 4 stages and the
/// persistent kernel; in three modes: Q, K and V by tensor maps (2,
/// FLASHJIT_TMA=qkv), K and V alone (1, the default), none (0). `run --json`
/// must report `"tma"` exactly where the ring copies by tensor maps: on
/// sm_90a with the ring and TMA on, and never for d = 100 (its 200-byte
/// rows take 8-byte copies); and as many `"tensor_maps"` as the mode has.
/// (The parameters are ForwardPingPongGpu's: a mode, then the flags.)
class ForwardTmaGpu : public ForwardPingPongGpu {};

TEST_P(ForwardTmaGpu, MatchesFloat64Reference) {
  const auto [tma, args] = GetParam();
  std::string env = std::string("FLASHJIT_TMA=") + (tma == 2   ? "qkv"
                                                    : tma == 1 ? "1"
                                                               : "0");
  const std::string a = args;
  if (a.find("--persistent") != std::string::npos)
    env += " FLASHJIT_PERSISTENT=1";
  std::string out = runAndCheck(a.substr(0, a.find(" --persistent")), env);
  const bool ring = out.find("\"kv_ring\":0") == std::string::npos;
  const bool aligned = a.find("--head-dim 100") == std::string::npos;
  EXPECT_NE(out.find(std::string("\"tma\":") +
                     (ring && tma && aligned ? "true" : "false")),
            std::string::npos)
      << a << "\n"
      << out;
  const int maps = ring && aligned ? std::vector<int>{0, 2, 3}[tma] : 0;
  EXPECT_NE(out.find("\"tensor_maps\":" + std::to_string(maps)),
            std::string::npos)
      << a << "\n"
      << out;
  if (out.find("\"arch\":\"sm_90a\"") != std::string::npos &&
      a.find("--stages 1") == std::string::npos)
    EXPECT_TRUE(ring) << a << "\n" << out;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Modes, ForwardTmaGpu, ::testing::Combine(
  ::testing::Values(2, 1, 0), ::testing::Values(
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --batch 2 --heads 3 --seq-len 1000 --seq-len-kv 1111",
  "--head-dim 40 --head-dim-v 72 --block-m 128 --block-n 64 --warps 8 --stages 4 --seq-len 100 --seq-len-kv 3333",
  "--head-dim 96 --dtype fp16 --block-m 128 --block-n 64 --warps 8 --stages 3 --window 100,20 --gqa 2 --heads 4 --seq-len 2000",
  "--head-dim 64 --packed-qkv --block-m 192 --block-n 128 --warps 12 --causal --batch 2 --heads 4 --seq-len 1200",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --causal --gqa 4 --heads 8 --seq-len 900 --seq-len-kv 700",
  "--head-dim 256 --block-m 128 --block-n 64 --warps 8 --causal --gqa 2 --heads 2 --seq-len 999 --seq-len-kv 1300",
  "--head-dim 192 --head-dim-v 128 --block-m 128 --block-n 32 --warps 8 --stages 4 --seq-len 777 --seq-len-kv 1300",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --block-sparse 0.4 --sparse-block 128 --causal --batch 2 --heads 3 --seq-len 3000",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --score-mod alibi:4 --causal --seq-len 1 --seq-len-kv 4000",
  "--head-dim 100 --block-m 128 --block-n 64 --warps 8 --seq-len 500",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --stages 1 --seq-len 600",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --overlap-softmax --causal --batch 2 --heads 30 --seq-len 3000 --persistent",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --batch 3 --heads 50 --seq-len 1100 --persistent",
  "--head-dim 64 --block-m 192 --block-n 128 --warps 12 --causal --batch 2 --heads 70 --seq-len 2000 --persistent",
  "--head-dim 128 --causal --batch 2 --heads 16 --seq-len 16384")));
// clang-format on

/// The software-pipelined KV loop (--overlap-softmax) on the K/V ring: the
/// next block's S in flight under the softmax, the first block's K copied
/// by the producer before its loop, the consumers on 232 registers; in
/// each ping-pong mode, with masks (the element mask's branch runs with S
/// in flight), rows that see no key (an empty loop), block-sparse lists
/// with empty rows, score modifiers, GQA, fp16, dqk != dv, Nq != Nkv and
/// several passes over 3 and 4 stages. `run --json` must report the ring
/// and the config's overlap on sm_90a (elsewhere the tiling is refused).
class ForwardOverlapGpu : public ForwardPingPongGpu {};

TEST_P(ForwardOverlapGpu, MatchesFloat64Reference) {
  const auto [mode, args] = GetParam();
  std::string out = runAndCheck(std::string(args) + " --overlap-softmax",
                                "FLASHJIT_KV_RING=1 FLASHJIT_PING_PONG=" +
                                    std::to_string(mode));
  EXPECT_NE(out.find("\"overlap_softmax\":true"), std::string::npos) << out;
  EXPECT_EQ(out.find("\"kv_ring\":0"), std::string::npos) << out;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Modes, ForwardOverlapGpu, ::testing::Combine(
  ::testing::Values(0, 1), ::testing::Values(
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --batch 2 --heads 2 --seq-len 1000",
  "--head-dim 64 --block-m 128 --block-n 128 --warps 8 --causal --seq-len 999 --seq-len-kv 1500",
  "--head-dim 96 --dtype fp16 --block-m 128 --block-n 64 --warps 8 --stages 3 --window 100,20 --gqa 2 --heads 4 --seq-len 2000",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --seq-len 1 --seq-len-kv 4000",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --seq-len 1000 --seq-len-kv 200",
  "--head-dim 40 --head-dim-v 72 --block-m 128 --block-n 64 --warps 8 --stages 4 --seq-len 100 --seq-len-kv 3333",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --block-sparse 0.4 --sparse-block 128 --causal --batch 2 --heads 3 --seq-len 3000",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --score-mod softcap:5 --scale 2 --seq-len 1000",
  "--head-dim 64 --block-m 128 --block-n 128 --warps 8 --score-mod alibi:4 --causal --seq-len 700",
  "--head-dim 128 --block-m 128 --block-n 128 --warps 8 --causal --batch 2 --heads 16 --seq-len 16384",
  "--head-dim 256 --block-m 128 --block-n 64 --warps 8 --causal --gqa 2 --heads 2 --seq-len 999 --seq-len-kv 1300")));
// clang-format on

/// The split-KV forward (decode and short queries): the partial over runs
/// of the keys, GQA-packed where gqa > 1 and dense, and the lse merge; the
/// run must report the split count it launched (its --kv-splits, or the
/// launch's choice for auto and for the decode default).
class SplitKvGpu : public ForwardGpu {};

TEST_P(SplitKvGpu, MatchesFloat64Reference) {
  const std::string args = GetParam();
  std::string out = runAndCheck(args);
  double splits = jsonNumber(out, "kv_splits");
  if (size_t at = args.find("--kv-splits ");
      at != std::string::npos && args[at + 12] != 'a')
    EXPECT_EQ(splits, std::stod(args.substr(at + 12))) << out;
  else
    EXPECT_GE(splits, 2) << "auto: more than one split for these shapes\n"
                         << out;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Shapes, SplitKvGpu, ::testing::Values(
  // The decode default (no tiling flags): 16 rows on one warp, auto splits.
  "--head-dim 128 --gqa 8 --batch 2 --heads 32 --seq-len 1 --seq-len-kv 32768",
  "--head-dim 64 --gqa 4 --causal --heads 8 --seq-len 1 --seq-len-kv 5000",
  "--head-dim 256 --gqa 2 --heads 4 --seq-len 3 --seq-len-kv 3000",
  "--head-dim 128 --gqa 8 --heads 16 --seq-len 8 --seq-len-kv 4096 --causal",
  "--head-dim 128 --seq-len 1 --seq-len-kv 131072",
  // Flags: 4 warps (warpgroup MMAs on sm_90a), empty runs, windows, fp16,
  // dqk != dv, block-sparse (no packing), score modifiers on packed rows.
  "--head-dim 128 --gqa 8 --heads 8 --seq-len 8 --seq-len-kv 2000 --block-m 64 --block-n 64 --warps 4 --kv-splits 6",
  "--head-dim 96 --head-dim-v 40 --dtype fp16 --gqa 3 --heads 6 --seq-len 3 --seq-len-kv 300 --block-m 16 --block-n 32 --warps 1 --kv-splits 50",
  "--head-dim 64 --gqa 4 --heads 8 --window 100,3 --seq-len 7 --seq-len-kv 900 --block-m 16 --block-n 32 --warps 1 --kv-splits 4",
  "--head-dim 64 --gqa 2 --heads 4 --causal --block-sparse 0.5 --seq-len 200 --seq-len-kv 1024 --block-m 64 --block-n 64 --warps 4 --kv-splits 3",
  "--head-dim 64 --gqa 2 --heads 4 --score-mod alibi:4 --causal --seq-len 9 --seq-len-kv 1024 --block-m 16 --block-n 64 --warps 1 --kv-splits 3",
  "--head-dim 64 --heads 2 --gqa 2 --window 0,0 --seq-len 20 --seq-len-kv 10 --block-m 16 --block-n 16 --warps 1 --kv-splits 5",
  "--head-dim 128 --gqa 8 --heads 8 --seq-len 1 --seq-len-kv 20000 --kv-splits auto --block-m 16 --block-n 64 --warps 1"));
// clang-format on

} // namespace
