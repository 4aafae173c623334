//===- EngineTests.cpp - Cache keys and tuning glue, on the CPU -----------===//
//
/// \file
/// tools/engine (KernelProvider) without a GPU: forward and backward specs
/// of the same shape never share a cubin or a tuning result, and each tuner
/// refuses the other direction's spec before touching a device.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "tools/engine/KernelProvider.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

using namespace flashjit;

namespace {

AttentionSpec spec(Direction direction) {
  AttentionSpec s;
  s.headDimQK = s.headDimV = 128;
  s.mask = MaskKind::Causal;
  s.direction = direction;
  return s;
}

rt::DeviceInfo fakeGpu() {
  rt::DeviceInfo gpu;
  gpu.name = "NVIDIA H200";
  gpu.ccMajor = 9;
  gpu.smCount = 132;
  gpu.driverVersion = 13000;
  gpu.maxSharedPerBlockOptin = 227 * 1024;
  gpu.maxThreadsPerBlock = 1024;
  gpu.regsPerBlock = 65536;
  return gpu;
}

TEST(Engine, ForwardAndBackwardKeysDiffer) {
  AttentionSpec fwd = spec(Direction::Forward), bwd = spec(Direction::Backward);
  Problem p;
  TileConfig c;
  GpuTarget target;
  EXPECT_NE(engine::tuningKey(fwd, p, fakeGpu()).hash(),
            engine::tuningKey(bwd, p, fakeGpu()).hash());
  EXPECT_EQ(engine::tuningKey(bwd, p, fakeGpu()).hash(),
            engine::tuningKey(bwd, p, fakeGpu()).hash());
  EXPECT_NE(engine::cubinKey(fwd, c, target).hash(),
            engine::cubinKey(bwd, c, target).hash());
}

/// The backward's two dQ modes compile different kernels and may tune to
/// different tilings: neither key is shared; the forward ignores the flag.
TEST(Engine, DqModesKeysDiffer) {
  AttentionSpec atomic = spec(Direction::Backward), det = atomic;
  det.deterministic = true;
  Problem p;
  TileConfig c;
  GpuTarget target;
  EXPECT_NE(engine::tuningKey(atomic, p, fakeGpu()).hash(),
            engine::tuningKey(det, p, fakeGpu()).hash());
  EXPECT_NE(engine::cubinKey(atomic, c, target).hash(),
            engine::cubinKey(det, c, target).hash());
  AttentionSpec fwd = spec(Direction::Forward), fwdFlagged = fwd;
  fwdFlagged.deterministic = true;
  EXPECT_EQ(engine::cubinKey(fwd, c, target).hash(),
            engine::cubinKey(fwdFlagged, c, target).hash());
}

/// A score modifier changes the kernel: the cubin and tuning keys differ
/// with and without it, and between two caps.
TEST(Engine, ScoreModKeysDiffer) {
  AttentionSpec plain = spec(Direction::Forward), capped = plain,
                other = plain;
  capped.scoreMod = "softcap:20";
  other.scoreMod = "softcap:30";
  Problem p;
  TileConfig c;
  GpuTarget target;
  EXPECT_NE(engine::cubinKey(plain, c, target).hash(),
            engine::cubinKey(capped, c, target).hash());
  EXPECT_NE(engine::cubinKey(capped, c, target).hash(),
            engine::cubinKey(other, c, target).hash());
  EXPECT_NE(engine::tuningKey(plain, p, fakeGpu()).hash(),
            engine::tuningKey(capped, p, fakeGpu()).hash());
}

TEST(Engine, TunedConfigsAreStoredPerDirection) {
  std::string dir =
      (std::filesystem::temp_directory_path() /
       ("flashjit-engine-test-" + std::to_string(std::random_device{}())))
          .string();
  rt::DiskCache cache(dir);
  AttentionSpec fwd = spec(Direction::Forward), bwd = spec(Direction::Backward);
  Problem p;
  TileConfig tuned;
  tuned.blockM = 32;
  tuned.blockN = 128;
  tuned.warps = 2;
  std::string text = tuned.toJson();
  ASSERT_TRUE(cache.store("tuning", engine::tuningKey(bwd, p, fakeGpu()),
                          std::vector<char>(text.begin(), text.end())));
  auto loaded = engine::loadTunedConfig(bwd, p, fakeGpu(), cache);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->blockM, 32);
  EXPECT_EQ(loaded->blockN, 128);
  EXPECT_EQ(loaded->warps, 2);
  EXPECT_FALSE(engine::loadTunedConfig(fwd, p, fakeGpu(), cache).has_value())
      << "the backward's tuning must not tile the forward";
  std::filesystem::remove_all(dir);
}

/// A tuned split-KV tiling comes back with its splits (auto or a count);
/// a record with anything else after the stages is refused (tuned again).
TEST(Engine, TunedSplitConfigsKeepTheirSplits) {
  std::string dir =
      (std::filesystem::temp_directory_path() /
       ("flashjit-engine-test-" + std::to_string(std::random_device{}())))
          .string();
  rt::DiskCache cache(dir);
  AttentionSpec fwd = spec(Direction::Forward);
  Problem p;
  auto roundTrip = [&](const std::string &text) {
    EXPECT_TRUE(cache.store("tuning", engine::tuningKey(fwd, p, fakeGpu()),
                            std::vector<char>(text.begin(), text.end())));
    return engine::loadTunedConfig(fwd, p, fakeGpu(), cache);
  };
  TileConfig tuned;
  tuned.blockM = 16;
  tuned.warps = 1;
  for (int64_t splits : {TileConfig::kAutoSplits, int64_t(7), int64_t(0)})
    for (bool overlap : {false, true}) { // and the overlapped loop's flag
      tuned.splits = splits;
      tuned.overlapSoftmax = overlap;
      auto loaded = roundTrip(tuned.toJson());
      ASSERT_TRUE(loaded.has_value()) << tuned.toJson();
      EXPECT_EQ(loaded->splits, splits);
      EXPECT_EQ(loaded->overlapSoftmax, overlap);
      EXPECT_EQ(loaded->blockM, 16);
    }
  EXPECT_FALSE(roundTrip("{\"block_m\":16,\"block_n\":64,\"warps\":1,"
                         "\"stages\":2,\"splits\":\"many\"}")
                   .has_value());
  EXPECT_FALSE(roundTrip("{\"block_m\":16,\"block_n\":64,\"warps\":1,"
                         "\"stages\":2")
                   .has_value());
  std::filesystem::remove_all(dir);
}

TEST(Engine, EachTunerRefusesTheOtherDirection) {
  rt::DiskCache cache(
      (std::filesystem::temp_directory_path() / "flashjit-engine-test-unused")
          .string());
  Problem p;
  GpuTarget target;
  EXPECT_THROW(engine::tuneOnDevice(spec(Direction::Backward), p,
                                    rt::ForwardArgs{}, target, fakeGpu(),
                                    cache),
               SpecError);
  EXPECT_THROW(engine::tuneBackwardOnDevice(spec(Direction::Forward), p,
                                            rt::BackwardArgs{}, target,
                                            fakeGpu(), cache),
               SpecError);
}

} // namespace
