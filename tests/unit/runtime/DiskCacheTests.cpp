//===- DiskCacheTests.cpp - The on-disk cache -----------------------------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The cache directory's resolution, the cache key (it changes when any part
/// changes and not otherwise), store/load, and list/clear. The detection and
/// rebuilding of damaged entries and the multi-process test are in
/// DiskCacheIntegrityTests.cpp.
///
//===----------------------------------------------------------------------===//

#include "runtime/DiskCache.h"
#include "runtime/Error.h"

#include "tests/unit/runtime/DiskCacheTestUtil.h"
#include "tests/unit/runtime/ScopedEnv.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

using namespace flashjit::rt;
using namespace flashjit::cachetest;

namespace {

using flashjit::test::ScopedEnv;

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
      // Another build of the same version: a rebuilt compiler.
      {"build_id", "3f8e2c0d9b1a4e5f60718293a4b5c6d7e8f90a1c"},
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
  EXPECT_EQ(hashes.size(), 10u);
}

TEST(CacheKey, TuningHashChangesWithEveryPart) {
  std::set<std::string> hashes = {tuningKey().hash()};
  std::map<std::string, std::string> changed = {
      {"version", "0.1.1"},
      {"build_id", "3f8e2c0d9b1a4e5f60718293a4b5c6d7e8f90a1c"},
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
  EXPECT_EQ(hashes.size(), 9u);
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

/// A rebuilt compiler of the same version (another build_id) never loads
/// the cubins or tuning results of the build that stored them.
TEST_F(DiskCacheTest, AnotherBuildOfTheSameVersionMisses) {
  DiskCache cache(dir_);
  ASSERT_TRUE(cache.store("cubin", cubinKey(), bytesOf("old cubin")));
  ASSERT_TRUE(cache.store("tuning", tuningKey(), bytesOf("block_m=128")));
  const std::string rebuilt = "0123456789abcdef0123456789abcdef01234567";
  CacheStatus status;
  EXPECT_FALSE(cache.load("cubin", cubinKey({{"build_id", rebuilt}}), status));
  EXPECT_EQ(status, CacheStatus::Miss);
  EXPECT_FALSE(
      cache.load("tuning", tuningKey({{"build_id", rebuilt}}), status));
  EXPECT_EQ(status, CacheStatus::Miss);
  EXPECT_TRUE(cache.load("cubin", cubinKey(), status));
  EXPECT_EQ(status, CacheStatus::Hit);
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

} // namespace
