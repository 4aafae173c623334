//===- DiskCacheTestUtil.h - Helpers of the disk cache's tests -*- C++ -*-===//
//
/// \file
/// What DiskCacheTests.cpp and DiskCacheIntegrityTests.cpp share: the keys
/// of a cubin and of a tuning result, file helpers, and the DiskCacheTest
/// fixture (a fresh, private cache directory per test).
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TESTS_UNIT_RUNTIME_DISKCACHETESTUTIL_H
#define FLASHJIT_TESTS_UNIT_RUNTIME_DISKCACHETESTUTIL_H

#include "runtime/DiskCache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace flashjit::cachetest {

using rt::CacheKey;
namespace fs = std::filesystem;

/// The key of a cubin, with every part the issue names.
inline CacheKey
cubinKey(const std::map<std::string, std::string> &overrides = {}) {
  std::vector<std::pair<std::string, std::string>> parts = {
      {"version", "0.1.0"},
      {"build_id", "3f8e2c0d9b1a4e5f60718293a4b5c6d7e8f90a1b"},
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

/// The key of a tuning result: version, build, spec, problem class, GPU
/// identity.
inline CacheKey
tuningKey(const std::map<std::string, std::string> &overrides = {}) {
  std::vector<std::pair<std::string, std::string>> parts = {
      {"version", "0.1.0"},
      {"build_id", "3f8e2c0d9b1a4e5f60718293a4b5c6d7e8f90a1b"},
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

inline std::vector<char> bytesOf(const std::string &s) {
  return std::vector<char>(s.begin(), s.end());
}

inline std::vector<char> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

inline void writeFile(const std::string &path, const std::vector<char> &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Every file under \p dir whose name contains ".tmp.".
inline std::vector<std::string> tempFiles(const std::string &dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->path().filename().string().find(".tmp.") != std::string::npos)
      found.push_back(it->path().string());
  return found;
}

inline size_t countOccurrences(const std::string &haystack,
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

} // namespace flashjit::cachetest

#endif // FLASHJIT_TESTS_UNIT_RUNTIME_DISKCACHETESTUTIL_H
