//===- DiskCacheIntegrityTests.cpp - The on-disk cache's integrity --------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The detection and rebuilding of truncated, corrupted and foreign entries
/// of the on-disk cache, stray temporary files, and a real multi-process
/// test: forked writers and readers hammer one key and nobody ever sees a
/// corrupt entry.
///
//===----------------------------------------------------------------------===//

#include "runtime/DiskCache.h"

#include "tests/unit/runtime/DiskCacheTestUtil.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace flashjit::rt;
using namespace flashjit::cachetest;

namespace {

//===----------------------------------------------------------------------===//
// Corruption: detected, reported once, removed, rebuilt
//===----------------------------------------------------------------------===//

/// Stores a valid entry of cubinKey(), lets \p damage break it, and checks
/// that load() reports it once, removes it, says Rebuilt, and that a new
/// store + load is a hit. Returns what was printed.
std::string
expectRebuilt(const std::string &dir, const std::string &path,
              const std::function<void(const std::string &)> &damage) {
  DiskCache cache(dir);
  std::vector<char> payload(4096);
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<char>(i * 7 + 3);
  EXPECT_TRUE(cache.store("cubin", cubinKey(), payload));
  damage(path);

  CacheStatus status = CacheStatus::Hit;
  ::testing::internal::CaptureStderr();
  auto loaded = cache.load("cubin", cubinKey(), status);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, CacheStatus::Rebuilt);
  EXPECT_FALSE(loaded);
  EXPECT_FALSE(fs::exists(path)) << "the bad entry was not removed";
  EXPECT_EQ(
      countOccurrences(err, "flashjit: cache entry " + path + " is corrupt ("),
      1u)
      << err;
  EXPECT_NE(err.find("); rebuilding"), std::string::npos) << err;

  // Reported once: the next load is a plain miss, silently.
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.load("cubin", cubinKey(), status));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(status, CacheStatus::Miss);

  // Rebuilt: store + load is a hit again.
  EXPECT_TRUE(cache.store("cubin", cubinKey(), payload));
  loaded = cache.load("cubin", cubinKey(), status);
  EXPECT_EQ(status, CacheStatus::Hit);
  EXPECT_TRUE(loaded && *loaded == payload);
  return err;
}

TEST_F(DiskCacheTest, TruncatedPayloadIsRebuilt) {
  std::string err = expectRebuilt(
      dir_, entryPath("cubin", cubinKey()),
      [](const std::string &p) { fs::resize_file(p, fs::file_size(p) - 100); });
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, TruncatedHeaderIsRebuilt) {
  std::string err =
      expectRebuilt(dir_, entryPath("cubin", cubinKey()),
                    [](const std::string &p) { fs::resize_file(p, 20); });
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, EmptyFileIsRebuilt) {
  expectRebuilt(dir_, entryPath("cubin", cubinKey()),
                [](const std::string &p) { fs::resize_file(p, 0); });
}

TEST_F(DiskCacheTest, FlippedPayloadByteIsRebuilt) {
  std::string err = expectRebuilt(dir_, entryPath("cubin", cubinKey()),
                                  [](const std::string &p) {
                                    std::vector<char> bytes = readFile(p);
                                    bytes[bytes.size() - 1000] ^= 0x01;
                                    writeFile(p, bytes);
                                  });
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, FlippedKeyTextByteIsRebuilt) {
  std::string err = expectRebuilt(dir_, entryPath("cubin", cubinKey()),
                                  [](const std::string &p) {
                                    std::vector<char> bytes = readFile(p);
                                    bytes[45] ^= 0x20;
                                    writeFile(p, bytes);
                                  });
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, GarbageIsRebuilt) {
  std::string err = expectRebuilt(
      dir_, entryPath("cubin", cubinKey()), [](const std::string &p) {
        std::vector<char> garbage(5000);
        for (size_t i = 0; i < garbage.size(); ++i)
          garbage[i] = static_cast<char>((i * 2654435761u) >> 7);
        writeFile(p, garbage);
      });
  EXPECT_NE(err.find("bad magic"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, OtherFormatVersionIsRebuilt) {
  std::string err = expectRebuilt(dir_, entryPath("cubin", cubinKey()),
                                  [](const std::string &p) {
                                    std::vector<char> bytes = readFile(p);
                                    bytes[8] = 2;
                                    writeFile(p, bytes);
                                  });
  EXPECT_NE(err.find("format version 2"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, TrailingBytesAreRebuilt) {
  std::string err = expectRebuilt(
      dir_, entryPath("cubin", cubinKey()), [](const std::string &p) {
        std::ofstream out(p, std::ios::binary | std::ios::app);
        out << "tail";
      });
  EXPECT_NE(err.find("trailing"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, WrongArchEntryIsRebuilt) {
  // A valid entry, written for sm_80, placed at the hash of the sm_90a key
  // (what a hash collision or a copied cache directory would look like).
  std::string dir = dir_;
  std::string err = expectRebuilt(
      dir_, entryPath("cubin", cubinKey()), [dir](const std::string &p) {
        DiskCache other(dir + "/other");
        CacheKey sm80 = cubinKey({{"arch", "sm_80"}});
        ASSERT_TRUE(other.store("cubin", sm80, bytesOf("sm_80 cubin")));
        fs::rename(dir + "/other/cubin/" + sm80.hash() + ".entry", p);
      });
  EXPECT_NE(err.find("foreign entry"), std::string::npos) << err;
  EXPECT_NE(err.find("arch=sm_80"), std::string::npos) << err;
  EXPECT_NE(err.find("arch=sm_90a"), std::string::npos) << err;
}

TEST_F(DiskCacheTest, StrayTempFilesAreIgnoredAndCleared) {
  DiskCache cache(dir_);
  CacheKey key = cubinKey();
  fs::create_directories(dir_ + "/cubin");
  // A writer that crashed halfway.
  std::string stray = dir_ + "/cubin/" + key.hash() + ".tmp.12345.00ff";
  writeFile(stray, bytesOf("FJCACHE1 half"));
  CacheStatus status;
  EXPECT_FALSE(cache.load("cubin", key, status));
  EXPECT_EQ(status, CacheStatus::Miss);
  ASSERT_TRUE(cache.store("cubin", key, bytesOf("whole")));
  EXPECT_TRUE(cache.load("cubin", key, status));
  EXPECT_EQ(status, CacheStatus::Hit);
  EXPECT_EQ(cache.list().size(), 1u);
  EXPECT_EQ(cache.clear(), 2u);
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_TRUE(tempFiles(dir_).empty());
}
//===----------------------------------------------------------------------===//
// Several processes at once
//===----------------------------------------------------------------------===//

constexpr size_t kPayloadBytes = 1 << 20;
constexpr int kWriters = 8;
constexpr int kReaders = 4;
constexpr int kIterations = 50;

uint64_t splitmix(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The 1 MiB payload that writer \p writer stores in iteration \p iteration:
/// deterministic, and different for every (writer, iteration), so that a
/// payload torn between two writers cannot pass verify().
std::vector<char> payloadFor(uint32_t writer, uint32_t iteration) {
  std::vector<char> payload(kPayloadBytes);
  std::memcpy(payload.data(), &writer, 4);
  std::memcpy(payload.data() + 4, &iteration, 4);
  uint64_t state = (uint64_t(writer) << 32) | iteration;
  for (size_t i = 8; i + 8 <= payload.size(); i += 8) {
    uint64_t word = splitmix(state);
    std::memcpy(payload.data() + i, &word, 8);
  }
  return payload;
}

/// Whether \p payload is exactly one of the payloads payloadFor() makes.
bool verify(const std::vector<char> &payload) {
  if (payload.size() != kPayloadBytes)
    return false;
  uint32_t writer, iteration;
  std::memcpy(&writer, payload.data(), 4);
  std::memcpy(&iteration, payload.data() + 4, 4);
  return writer < kWriters && iteration < kIterations &&
         payload == payloadFor(writer, iteration);
}

/// Exit codes of the children.
enum ChildExit {
  ChildOk = 0,
  ChildStoreFailed = 10,
  ChildSawRebuilt = 11,
  ChildSawMissAfterStore = 12,
  ChildSawWrongBytes = 13,
  ChildTimedOut = 14,
  ChildThrew = 15,
  ChildNeverHit = 16,
};

/// Stores and loads the shared key kIterations times.
int writerMain(const std::string &dir, uint32_t writer) {
  DiskCache cache(dir);
  for (uint32_t i = 0; i < kIterations; ++i) {
    if (!cache.store("cubin", cubinKey(), payloadFor(writer, i)))
      return ChildStoreFailed;
    CacheStatus status;
    auto loaded = cache.load("cubin", cubinKey(), status);
    if (status == CacheStatus::Rebuilt)
      return ChildSawRebuilt;
    if (status != CacheStatus::Hit || !loaded)
      return ChildSawMissAfterStore;
    if (!verify(*loaded))
      return ChildSawWrongBytes;
  }
  return ChildOk;
}

/// Loads the shared key until the writers are done (\p doneFile exists);
/// must see at least one hit, so that it did read while others wrote.
int readerMain(const std::string &dir, const std::string &doneFile) {
  DiskCache cache(dir);
  size_t hits = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!fs::exists(doneFile)) {
    CacheStatus status;
    auto loaded = cache.load("cubin", cubinKey(), status);
    if (status == CacheStatus::Rebuilt)
      return ChildSawRebuilt;
    if (status == CacheStatus::Hit && (!loaded || !verify(*loaded)))
      return ChildSawWrongBytes;
    hits += status == CacheStatus::Hit;
    if (std::chrono::steady_clock::now() > deadline)
      return ChildTimedOut;
  }
  return hits > 0 ? ChildOk : ChildNeverHit;
}

pid_t forkChild(const std::function<int()> &body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = ChildThrew;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  return pid;
}

int waitFor(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(DiskCacheTest, ConcurrentProcessesNeverCorruptTheCache) {
  fs::create_directories(dir_);
  std::string doneFile = dir_ + "/writers-done";
  std::string dir = dir_;

  std::vector<pid_t> readers, writers;
  for (int r = 0; r < kReaders; ++r)
    readers.push_back(forkChild([&] { return readerMain(dir, doneFile); }));
  for (int w = 0; w < kWriters; ++w)
    writers.push_back(forkChild(
        [&, w] { return writerMain(dir, static_cast<uint32_t>(w)); }));
  for (pid_t pid : writers)
    ASSERT_GT(pid, 0) << "fork failed";
  for (pid_t pid : readers)
    ASSERT_GT(pid, 0) << "fork failed";

  for (size_t w = 0; w < writers.size(); ++w)
    EXPECT_EQ(waitFor(writers[w]), ChildOk) << "writer " << w;
  writeFile(doneFile, bytesOf("done"));
  for (size_t r = 0; r < readers.size(); ++r)
    EXPECT_EQ(waitFor(readers[r]), ChildOk) << "reader " << r;

  DiskCache cache(dir_);
  CacheStatus status;
  auto loaded = cache.load("cubin", cubinKey(), status);
  EXPECT_EQ(status, CacheStatus::Hit);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(verify(*loaded)) << "the surviving entry is not one writer's "
                                  "exact payload";
  EXPECT_TRUE(tempFiles(dir_).empty());
  std::vector<DiskCache::Entry> entries = cache.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].valid);
}

} // namespace
