//===- EngineTests.cpp - Cache keys and tuning glue, on the CPU -----------===//
//
/// \file
/// tools/engine (KernelProvider, BuildId) without a GPU: forward and
/// backward specs of the same shape never share a cubin or a tuning result,
/// both keys name the compiler's build, and each tuner refuses the other
/// direction's spec before touching a device.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "tools/engine/BuildId.h"
#include "tools/engine/KernelProvider.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include <dlfcn.h>

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

/// The C API handle keeps loaded kernels by loadedKernelKey(): two configs
/// of one spec that differ in any field, a flag alone included (splits,
/// the overlapped loop, persistent, Q by TMA), must never share a kernel,
/// or a tuned choice would run whichever kernel was loaded first.
TEST(Engine, LoadedKernelKeysTellEveryConfigApart) {
  AttentionSpec fwd = spec(Direction::Forward);
  int dummy = 0;
  auto key = [&](const TileConfig &c, const void *ctx = nullptr) {
    return engine::loadedKernelKey(fwd, c, 16, "sm_90a", ctx);
  };
  std::vector<TileConfig> configs(1);
  auto vary = [&](auto &&change) {
    TileConfig c;
    change(c);
    configs.push_back(c);
  };
  vary([](TileConfig &c) { c.blockM = 128; });
  vary([](TileConfig &c) { c.blockN = 128; });
  vary([](TileConfig &c) { c.warps = 8; });
  vary([](TileConfig &c) { c.stages = 3; });
  vary([](TileConfig &c) { c.splits = TileConfig::kAutoSplits; });
  vary([](TileConfig &c) { c.splits = 7; });
  vary([](TileConfig &c) { c.overlapSoftmax = true; });
  vary([](TileConfig &c) { c.persistent = true; });
  vary([](TileConfig &c) { c.queryByTensorMap = true; });
  vary([](TileConfig &c) { c.queryByTensorMap = c.outputByTensorMap = true; });
  std::set<std::string> keys;
  for (const TileConfig &c : configs) {
    EXPECT_EQ(key(c), key(c)) << c.toJson();
    EXPECT_TRUE(keys.insert(key(c)).second)
        << c.toJson() << " shares its key with another config: " << key(c);
  }
  EXPECT_NE(key(configs[0]), key(configs[0], &dummy)) << "another context";
  EXPECT_NE(key(configs[0]),
            engine::loadedKernelKey(spec(Direction::Backward), configs[0], 16,
                                    "sm_90a", nullptr))
      << "the backward's spec";
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

bool isLowerHex(const std::string &s) {
  return !s.empty() && s.find_first_not_of("0123456789abcdef") == s.npos;
}

/// The value of part \p name of \p key; empty if it has none.
std::string part(const rt::CacheKey &key, const std::string &name) {
  for (const auto &[n, value] : key.parts())
    if (n == name)
      return value;
  return {};
}

/// The build id is hex, computed once (every call, from any thread, returns
/// the same string object), and is the GNU build id of the image holding
/// the engine: here this test binary (linked as libflashjit.so is; lit's
/// tools/version.test checks libflashjit.so's against llvm-readelf).
TEST(Engine, BuildIdIsStableHexOfThisImage) {
  const std::string &id = engine::compilerBuildId();
  EXPECT_TRUE(isLowerHex(id)) << "'" << id << "'";
  EXPECT_EQ(id.size() % 2, 0u) << id;
#if FLASHJIT_BUILD_ID_SHA1
  EXPECT_EQ(id.size(), 40u) << "linked with -Wl,--build-id=sha1: " << id;
#endif
  EXPECT_EQ(&engine::compilerBuildId(), &id);
  std::vector<const std::string *> seen(4);
  std::vector<std::thread> threads;
  for (auto &p : seen)
    threads.emplace_back([&p] { p = &engine::compilerBuildId(); });
  for (auto &t : threads)
    t.join();
  for (const std::string *p : seen)
    EXPECT_EQ(p, &id);
  const void *self = reinterpret_cast<const void *>(&engine::compilerBuildId);
  EXPECT_EQ(engine::gnuBuildIdOf(self), id);
  EXPECT_EQ(engine::gnuBuildIdOf(nullptr), "") << "no image holds address 0";
}

/// The fallback of an image without a build id: a digest of its read-only
/// segments in memory, the same on every call.
TEST(Engine, LoadedImageDigestIsStableHex) {
  const void *self = reinterpret_cast<const void *>(&engine::compilerBuildId);
  std::string digest = engine::loadedImageDigest(self);
  EXPECT_TRUE(isLowerHex(digest)) << digest;
  EXPECT_EQ(digest.size(), 16u);
  EXPECT_EQ(engine::loadedImageDigest(self), digest);
  EXPECT_EQ(engine::loadedImageDigest(nullptr), "");
}

/// Another image (libc) has another id and digest: the lookup finds the
/// image that contains the address, not the first one loaded.
TEST(Engine, BuildIdIsThatOfTheImageHoldingTheAddress) {
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (!libc)
    GTEST_SKIP() << "libc.so.6 is not loaded by that name";
  const void *inLibc = dlsym(libc, "dl_iterate_phdr");
  ASSERT_NE(inLibc, nullptr);
  const void *self = reinterpret_cast<const void *>(&engine::compilerBuildId);
  EXPECT_NE(engine::gnuBuildIdOf(inLibc), engine::compilerBuildId());
  EXPECT_NE(engine::loadedImageDigest(inLibc), engine::loadedImageDigest(self));
  dlclose(libc);
}

/// Both keys carry the build id, after the version: a rebuilt flashjit of
/// the same version never loads another build's cubins or tunings.
TEST(Engine, KeysNameTheCompilersBuild) {
  AttentionSpec s = spec(Direction::Forward);
  Problem p;
  TileConfig c;
  GpuTarget target;
  const std::string &id = engine::compilerBuildId();
  for (const rt::CacheKey &key :
       {engine::cubinKey(s, c, target), engine::tuningKey(s, p, fakeGpu())}) {
    EXPECT_EQ(part(key, "build_id"), id) << key.text();
    ASSERT_GE(key.parts().size(), 2u);
    EXPECT_EQ(key.parts()[0].first, "version");
    EXPECT_EQ(key.parts()[1].first, "build_id");
    EXPECT_NE(key.text().find("\nbuild_id=" + id + "\n"), std::string::npos);
  }
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
    for (int flags = 0; flags < 16; ++flags) { // and the forward's flags
      tuned.splits = splits;
      tuned.overlapSoftmax = flags & 1;
      tuned.persistent = flags & 2;
      tuned.queryByTensorMap = flags & 4;
      tuned.outputByTensorMap = flags & 8;
      auto loaded = roundTrip(tuned.toJson());
      ASSERT_TRUE(loaded.has_value()) << tuned.toJson();
      EXPECT_EQ(loaded->toJson(), tuned.toJson());
      EXPECT_EQ(loaded->splits, splits);
      EXPECT_EQ(loaded->overlapSoftmax, tuned.overlapSoftmax);
      EXPECT_EQ(loaded->persistent, tuned.persistent);
      EXPECT_EQ(loaded->queryByTensorMap, tuned.queryByTensorMap);
      EXPECT_EQ(loaded->outputByTensorMap, tuned.outputByTensorMap);
      EXPECT_EQ(loaded->blockM, 16);
    }
  // The flags out of toJson's order are a corrupt entry.
  EXPECT_FALSE(roundTrip("{\"block_m\":16,\"block_n\":64,\"warps\":1,"
                         "\"stages\":2,\"query_tma\":true,"
                         "\"persistent\":true}")
                   .has_value());
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
