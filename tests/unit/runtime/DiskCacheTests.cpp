//===- DiskCacheTests.cpp - The on-disk cache -----------------------------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The cache directory's resolution, the cache key (it changes when any part
/// changes and not otherwise), store/load, the detection and rebuilding of
/// truncated, corrupted and foreign entries, list/clear, and a real
/// multi-process test: forked writers and readers hammer one key and nobody
/// ever sees a corrupt entry.
///
//===----------------------------------------------------------------------===//

#include "runtime/DiskCache.h"
#include "runtime/Error.h"

#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace flashjit::rt;
namespace fs = std::filesystem;

namespace {

using flashjit::test::ScopedEnv;

/// The key of a cubin, with every part the issue names.
CacheKey cubinKey(const std::map<std::string, std::string> &overrides = {}) {
  std::vector<std::pair<std::string, std::string>> parts = {
      {"version", "0.1.0"},
      {"pipeline", "builtin.module(flashjit-tile-attention{block-m=64 "
                   "block-n=64},flashjit-gpu-pipeline)"},
      {"spec", "head_dim_qk=96 head_dim_v=96 dtype=bf16 mask=causal gqa=1"},
      {"config", "block_m=64 block_n=64 warps=4 stages=2"},
      {"copy_bytes", "16"},
      {"arch", "sm_90a"},
      {"ptx_isa", "8.7"},
      {"nvjitlink", "13.0"},
  };
  CacheKey key;
  for (auto &[name, value] : parts) {
    auto it = overrides.find(name);
    key.add(name, it == overrides.end() ? value : it->second);
  }
  return key;
}

/// The key of a tuning result: spec, problem class, GPU identity.
CacheKey tuningKey(const std::map<std::string, std::string> &overrides = {}) {
  std::vector<std::pair<std::string, std::string>> parts = {
      {"spec", "head_dim_qk=128 head_dim_v=128 dtype=fp16 mask=none gqa=1"},
      {"problem_class", "seq_len=4096..8191 batch_heads=32..63"},
      {"gpu_name", "NVIDIA H200"},
      {"gpu_cc", "9.0"},
      {"gpu_sms", "132"},
      {"driver", "13000"},
  };
  CacheKey key;
  for (auto &[name, value] : parts) {
    auto it = overrides.find(name);
    key.add(name, it == overrides.end() ? value : it->second);
  }
  return key;
}

std::vector<char> bytesOf(const std::string &s) {
  return std::vector<char>(s.begin(), s.end());
}

std::vector<char> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void writeFile(const std::string &path, const std::vector<char> &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Every file under \p dir whose name contains ".tmp.".
std::vector<std::string> tempFiles(const std::string &dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->path().filename().string().find(".tmp.") != std::string::npos)
      found.push_back(it->path().string());
  return found;
}

size_t countOccurrences(const std::string &haystack,
                        const std::string &needle) {
  size_t count = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + needle.size()))
    ++count;
  return count;
}

/// Each test gets a fresh, private cache directory.
class DiskCacheTest : public ::testing::Test {
protected:
  void SetUp() override {
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    // Unique per run too: warnings are given once per directory and process.
    static int run = 0;
    dir_ = ::testing::TempDir() + "flashjit-cache-" +
           std::to_string(::getpid()) + "-" + info->name() + "-" +
           std::to_string(run++);
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string entryPath(const std::string &kind, const CacheKey &key) const {
    return dir_ + "/" + kind + "/" + key.hash() + ".entry";
  }

  std::string dir_;
};

//===----------------------------------------------------------------------===//
// cacheDirectory
//===----------------------------------------------------------------------===//

TEST(CacheDirectory, FlashjitCacheDirWins) {
  ScopedEnv a("FLASHJIT_CACHE_DIR", "/some/where/cache");
  ScopedEnv b("XDG_CACHE_HOME", "/xdg");
  ScopedEnv c("HOME", "/home/u");
  EXPECT_EQ(cacheDirectory(), "/some/where/cache");
  EXPECT_EQ(DiskCache().directory(), "/some/where/cache");
}

TEST(CacheDirectory, XdgCacheHomeNext) {
  ScopedEnv a("FLASHJIT_CACHE_DIR", nullptr);
  ScopedEnv b("XDG_CACHE_HOME", "/xdg/");
  ScopedEnv c("HOME", "/home/u");
  EXPECT_EQ(cacheDirectory(), "/xdg/flashjit");
}

TEST(CacheDirectory, HomeLast) {
  ScopedEnv a("FLASHJIT_CACHE_DIR", nullptr);
  ScopedEnv b("XDG_CACHE_HOME", nullptr);
  ScopedEnv c("HOME", "/home/u");
  EXPECT_EQ(cacheDirectory(), "/home/u/.cache/flashjit");
  EXPECT_EQ(DiskCache().directory(), "/home/u/.cache/flashjit");
}

TEST(CacheDirectory, EmptyAndRelativeValuesAreIgnored) {
  ScopedEnv a("FLASHJIT_CACHE_DIR", "");
  ScopedEnv b("XDG_CACHE_HOME", "relative/cache");
  ScopedEnv c("HOME", "/home/u");
  EXPECT_EQ(cacheDirectory(), "/home/u/.cache/flashjit");
  ScopedEnv d("XDG_CACHE_HOME", "");
  EXPECT_EQ(cacheDirectory(), "/home/u/.cache/flashjit");
}

//===----------------------------------------------------------------------===//
// CacheKey
//===----------------------------------------------------------------------===//

TEST(CacheKey, TextIsCanonicalAndHashIsFnv1a64) {
  CacheKey key;
  key.add("arch", "sm_90a").add("ptx_isa", "8.7");
  EXPECT_EQ(key.text(), "arch=sm_90a\nptx_isa=8.7\n");
  // FNV-1a 64 test vectors: "" and "a".
  EXPECT_EQ(CacheKey().hash(), "cbf29ce484222325");
  EXPECT_EQ(key.hash().size(), 16u);
  EXPECT_EQ(key.hash().find_first_not_of("0123456789abcdef"),
            std::string::npos);
}

TEST(CacheKey, StableForEqualParts) {
  EXPECT_EQ(cubinKey().text(), cubinKey().text());
  EXPECT_EQ(cubinKey().hash(), cubinKey().hash());
  EXPECT_EQ(tuningKey().hash(), tuningKey().hash());
  // Equal overrides are no change.
  EXPECT_EQ(cubinKey({{"arch", "sm_90a"}}).hash(), cubinKey().hash());
}

TEST(CacheKey, CubinHashChangesWithEveryPart) {
  std::set<std::string> hashes = {cubinKey().hash()};
  std::map<std::string, std::string> changed = {
      {"version", "0.1.1"},
      {"pipeline", "builtin.module(flashjit-tile-attention{block-m=128 "
                   "block-n=64},flashjit-gpu-pipeline)"},
      {"spec", "head_dim_qk=96 head_dim_v=96 dtype=fp16 mask=causal gqa=1"},
      {"config", "block_m=64 block_n=64 warps=8 stages=2"},
      {"copy_bytes", "8"}, // the copy width chosen from alignment
      {"arch", "sm_80"},
      {"ptx_isa", "8.8"},
      {"nvjitlink", "13.1"},
  };
  for (const auto &[name, value] : changed) {
    std::string hash = cubinKey({{name, value}}).hash();
    EXPECT_NE(hash, cubinKey().hash()) << "part " << name;
    EXPECT_TRUE(hashes.insert(hash).second) << "part " << name;
  }
  EXPECT_EQ(hashes.size(), 9u);
}

TEST(CacheKey, TuningHashChangesWithEveryPart) {
  std::set<std::string> hashes = {tuningKey().hash()};
  std::map<std::string, std::string> changed = {
      {"spec", "head_dim_qk=128 head_dim_v=64 dtype=fp16 mask=none gqa=1"},
      {"problem_class", "seq_len=8192..16383 batch_heads=32..63"},
      {"gpu_name", "NVIDIA H100 80GB HBM3"},
      {"gpu_cc", "8.0"},
      {"gpu_sms", "114"},
      {"driver", "12080"},
  };
  for (const auto &[name, value] : changed) {
    std::string hash = tuningKey({{name, value}}).hash();
    EXPECT_NE(hash, tuningKey().hash()) << "part " << name;
    EXPECT_TRUE(hashes.insert(hash).second) << "part " << name;
  }
  EXPECT_EQ(hashes.size(), 7u);
}

TEST(CacheKey, AddingAPartChangesTheHash) {
  CacheKey more = cubinKey();
  more.add("extra", "");
  EXPECT_NE(more.hash(), cubinKey().hash());
  CacheKey a, b;
  a.add("x", "1");
  b.add("x", "1").add("y", "1");
  EXPECT_NE(a.hash(), b.hash());
}

TEST(CacheKey, OrderAndEscapingKeepTextsApart) {
  CacheKey ab, ba;
  ab.add("a", "1").add("b", "2");
  ba.add("b", "2").add("a", "1");
  EXPECT_NE(ab.text(), ba.text());
  // A value with a newline cannot forge a second part.
  CacheKey forged;
  forged.add("a", "1\nb=2");
  EXPECT_NE(forged.text(), ab.text());
  EXPECT_EQ(forged.text(), "a=1\\nb=2\n");
  CacheKey backslash;
  backslash.add("a", "1\\nb=2");
  EXPECT_NE(backslash.text(), forged.text());
}

TEST(CacheKey, RejectsBadAndDuplicateNames) {
  for (const char *bad : {"", "a=b", "a b", "a\nb"}) {
    CacheKey key;
    EXPECT_THROW(key.add(bad, "v"), RuntimeError) << "name '" << bad << "'";
  }
  CacheKey key;
  key.add("arch", "sm_90a");
  try {
    key.add("arch", "sm_80");
    ADD_FAILURE() << "a duplicate part was accepted";
  } catch (const RuntimeError &e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
}

TEST(CacheStatus, Names) {
  EXPECT_STREQ(toString(CacheStatus::Hit), "hit");
  EXPECT_STREQ(toString(CacheStatus::Miss), "miss");
  EXPECT_STREQ(toString(CacheStatus::Rebuilt), "rebuilt");
}

//===----------------------------------------------------------------------===//
// store / load
//===----------------------------------------------------------------------===//

TEST_F(DiskCacheTest, StoreThenLoadIsAHit) {
  DiskCache cache(dir_);
  CacheStatus status = CacheStatus::Hit;
  EXPECT_FALSE(cache.load("cubin", cubinKey(), status));
  EXPECT_EQ(status, CacheStatus::Miss);

  std::vector<char> payload =
      bytesOf(std::string("\177ELF") + std::string(1000, '\0') + "cubin");
  ASSERT_TRUE(cache.store("cubin", cubinKey(), payload));
  EXPECT_TRUE(fs::is_regular_file(entryPath("cubin", cubinKey())));
  auto loaded = cache.load("cubin", cubinKey(), status);
  EXPECT_EQ(status, CacheStatus::Hit);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(*loaded, payload);
  EXPECT_TRUE(tempFiles(dir_).empty());

  // Another key, or the same key in another kind, is a miss.
  EXPECT_FALSE(cache.load("cubin", cubinKey({{"arch", "sm_80"}}), status));
  EXPECT_EQ(status, CacheStatus::Miss);
  EXPECT_FALSE(cache.load("tuning", cubinKey(), status));
  EXPECT_EQ(status, CacheStatus::Miss);

  // Overwriting replaces; an empty payload is a payload.
  ASSERT_TRUE(cache.store("cubin", cubinKey(), {}));
  loaded = cache.load("cubin", cubinKey(), status);
  EXPECT_EQ(status, CacheStatus::Hit);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(loaded->empty());
}

TEST_F(DiskCacheTest, EntryFormat) {
  DiskCache cache(dir_);
  CacheKey key;
  key.add("k", "v");
  ASSERT_TRUE(cache.store("cubin", key, bytesOf("PAY")));
  std::vector<char> file = readFile(entryPath("cubin", key));
  ASSERT_EQ(file.size(), 40u + 4u + 3u);
  EXPECT_EQ(std::string(file.data(), 8), "FJCACHE1");
  EXPECT_EQ(file[8], 1);  // format version, little-endian
  EXPECT_EQ(file[16], 4); // key text length
  EXPECT_EQ(file[24], 3); // payload length
  EXPECT_EQ(std::string(file.data() + 40, 7), "k=v\nPAY");
}

TEST_F(DiskCacheTest, DifferentGpuTunesAgainSameGpuReuses) {
  DiskCache cache(dir_);
  ASSERT_TRUE(cache.store("tuning", tuningKey(), bytesOf("block_m=128")));
  CacheStatus status;
  auto same = cache.load("tuning", tuningKey(), status);
  EXPECT_EQ(status, CacheStatus::Hit);
  ASSERT_TRUE(same);
  EXPECT_EQ(std::string(same->begin(), same->end()), "block_m=128");
  for (auto [name, value] :
       std::map<std::string, std::string>{{"gpu_name", "NVIDIA H100"},
                                          {"gpu_cc", "8.9"},
                                          {"gpu_sms", "114"},
                                          {"driver", "12090"}}) {
    EXPECT_FALSE(cache.load("tuning", tuningKey({{name, value}}), status));
    EXPECT_EQ(status, CacheStatus::Miss) << name;
  }
}

TEST_F(DiskCacheTest, InvalidKindThrows) {
  DiskCache cache(dir_);
  CacheStatus status;
  for (const char *kind : {"", "../escape", "a/b", "."}) {
    EXPECT_THROW(cache.store(kind, cubinKey(), {}), RuntimeError) << kind;
    EXPECT_THROW(cache.load(kind, cubinKey(), status), RuntimeError) << kind;
  }
}

TEST_F(DiskCacheTest, UnwritableCacheDoesNotCacheAndWarnsOnce) {
  // A directory below a regular file cannot be created, even by root.
  fs::create_directories(dir_);
  writeFile(dir_ + "/file", bytesOf("x"));
  DiskCache cache(dir_ + "/file/cache");
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.store("cubin", cubinKey(), bytesOf("payload")));
  EXPECT_FALSE(cache.store("cubin", cubinKey(), bytesOf("payload")));
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(countOccurrences(err, "flashjit: cannot write the cache in"), 1u)
      << err;
  CacheStatus status;
  EXPECT_FALSE(cache.load("cubin", cubinKey(), status));
  EXPECT_EQ(status, CacheStatus::Miss);
}

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
// list / clear
//===----------------------------------------------------------------------===//

TEST_F(DiskCacheTest, ListAndClear) {
  DiskCache cache(dir_);
  EXPECT_TRUE(cache.list().empty()); // no directory yet
  EXPECT_EQ(cache.clear(), 0u);

  CacheKey a = cubinKey(), b = cubinKey({{"arch", "sm_80"}}), t = tuningKey();
  ASSERT_TRUE(cache.store("cubin", a, bytesOf("aaaa")));
  ASSERT_TRUE(cache.store("cubin", b, bytesOf("bb")));
  ASSERT_TRUE(cache.store("tuning", t, bytesOf("t")));
  // A corrupt entry, and a file that is not ours (clear must keep it).
  writeFile(dir_ + "/cubin/0123456789abcdef.entry", bytesOf("junk"));
  writeFile(dir_ + "/cubin/README", bytesOf("not a cache file"));

  std::vector<DiskCache::Entry> entries = cache.list();
  ASSERT_EQ(entries.size(), 4u);
  std::map<std::string, DiskCache::Entry> byPath;
  for (const auto &e : entries)
    byPath[e.path] = e;
  auto check = [&](const std::string &kind, const CacheKey &key,
                   size_t payload) {
    auto it = byPath.find(entryPath(kind, key));
    ASSERT_NE(it, byPath.end()) << kind << " " << key.hash();
    EXPECT_EQ(it->second.kind, kind);
    EXPECT_TRUE(it->second.valid);
    EXPECT_EQ(it->second.keyText, key.text());
    EXPECT_EQ(it->second.bytes, 40 + key.text().size() + payload);
  };
  check("cubin", a, 4);
  check("cubin", b, 2);
  check("tuning", t, 1);
  const auto &junk = byPath[dir_ + "/cubin/0123456789abcdef.entry"];
  EXPECT_FALSE(junk.valid);
  EXPECT_EQ(junk.bytes, 4u);
  EXPECT_EQ(junk.kind, "cubin");
  // Sorted by kind, then path.
  EXPECT_EQ(entries.back().kind, "tuning");

  EXPECT_EQ(cache.clear(), 4u);
  EXPECT_TRUE(cache.list().empty());
  EXPECT_TRUE(fs::exists(dir_ + "/cubin/README"));
  CacheStatus status;
  EXPECT_FALSE(cache.load("cubin", a, status));
  EXPECT_EQ(status, CacheStatus::Miss);
}

/// A directory named as an entry blocked its key forever (store() cannot
/// rename onto it) while clear() claimed success: it is removed (issue 16),
/// and what cannot be removed is reported.
TEST_F(DiskCacheTest, ClearRemovesADirectoryNamedAsAnEntry) {
  DiskCache cache(dir_);
  CacheKey a = cubinKey();
  fs::create_directories(entryPath("cubin", a) + "/inner");
  writeFile(entryPath("cubin", a) + "/inner/file", bytesOf("x"));
  EXPECT_FALSE(cache.store("cubin", a, bytesOf("aaaa"))); // blocked
  std::vector<std::string> failures;
  EXPECT_EQ(cache.clear(&failures), 1u);
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_FALSE(fs::exists(entryPath("cubin", a)));
  EXPECT_TRUE(cache.store("cubin", a, bytesOf("aaaa"))); // unblocked
  CacheStatus status;
  EXPECT_TRUE(cache.load("cubin", a, status));
  // What cannot be removed (a read-only kind directory) is named; root
  // removes from read-only directories, so that part needs a user.
  if (::geteuid() != 0) {
    fs::permissions(dir_ + "/cubin",
                    fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_EQ(cache.clear(&failures), 0u);
    fs::permissions(dir_ + "/cubin", fs::perms::owner_all);
    ASSERT_EQ(failures.size(), 1u);
    EXPECT_NE(failures[0].find("cannot remove '" + entryPath("cubin", a) +
                               "': Permission denied"),
              std::string::npos)
        << failures[0];
  }
}

TEST_F(DiskCacheTest, ListFlagsAMisplacedEntry) {
  // A well-formed entry whose file name is not the hash of its key.
  DiskCache cache(dir_);
  CacheKey a = cubinKey(), b = cubinKey({{"arch", "sm_80"}});
  ASSERT_TRUE(cache.store("cubin", b, bytesOf("sm_80")));
  fs::rename(entryPath("cubin", b), entryPath("cubin", a));
  std::vector<DiskCache::Entry> entries = cache.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_FALSE(entries[0].valid);
  EXPECT_EQ(entries[0].keyText, b.text());
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
