//===- AutotunerTests.cpp - Candidate pruning and selection, on the CPU ---===//

#include "kernels/GpuGeometry.h"
#include "runtime/Autotuner.h"
#include "runtime/Error.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

using namespace flashjit;
using namespace flashjit::rt;

namespace {

AttentionSpec specWith(int64_t d, bool sparse = false, int64_t block = 128) {
  AttentionSpec s;
  s.headDimQK = s.headDimV = d;
  s.blockSparse = sparse;
  s.sparseBlock = block;
  return s;
}

TEST(Autotuner, CandidatesNeverExceedTheLimits) {
  for (int64_t d : {16, 64, 96, 128, 256, 512})
    for (int64_t shared : {48 * 1024, 100 * 1024, 227 * 1024})
      for (int64_t threads : {128, 256, 1024}) {
        TuneLimits limits;
        limits.maxSharedBytes = shared;
        limits.maxThreadsPerBlock = threads;
        AttentionSpec spec = specWith(d);
        for (const TileConfig &c : tuningCandidates(spec, limits)) {
          GpuGeometry g = gpuGeometry(spec, c);
          EXPECT_LE(g.sharedBytes, shared) << d << " " << c.toJson();
          EXPECT_LE(g.threads, threads);
          EXPECT_EQ(c.blockM % (16 * c.warps), 0);
          EXPECT_LE(g.mTiles, 2);
          EXPECT_EQ(c.blockN % 16, 0);
        }
      }
}

TEST(Autotuner, CandidatesIncludeTheHeuristicAndRespectSparseBlocks) {
  TuneLimits limits;
  AttentionSpec dense = specWith(128);
  auto cands = tuningCandidates(dense, limits);
  ASSERT_FALSE(cands.empty());
  TileConfig h = defaultGpuConfig(dense);
  EXPECT_EQ(cands.front().blockM, h.blockM);
  EXPECT_EQ(cands.front().blockN, h.blockN);
  EXPECT_EQ(cands.front().warps, h.warps);
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
  for (const TileConfig &c : cands)
    EXPECT_TRUE(seen.insert({c.blockM, c.blockN, c.warps}).second)
        << "duplicate " << c.toJson();

  AttentionSpec sparse = specWith(64, true, 64);
  for (const TileConfig &c : tuningCandidates(sparse, limits)) {
    EXPECT_EQ(64 % c.blockM, 0) << c.toJson();
    EXPECT_EQ(64 % c.blockN, 0) << c.toJson();
  }
  // Too little shared memory for anything: no candidate.
  limits.maxSharedBytes = 1024;
  EXPECT_TRUE(tuningCandidates(specWith(512), limits).empty());
}

TEST(Autotuner, PicksTheFastestWithAnInjectedTimingSource) {
  std::vector<TileConfig> cands;
  for (int64_t bn : {32, 64, 128}) {
    TileConfig c;
    c.blockM = 128;
    c.blockN = bn;
    cands.push_back(c);
  }
  TileConfig broken;
  broken.blockM = 64;
  broken.blockN = 16;
  cands.push_back(broken);

  std::atomic<int> compiles{0};
  std::mutex mu;
  std::set<std::thread::id> compileThreads;
  CompileFn compile = [&](const TileConfig &c, int &regs, int &spill) {
    ++compiles;
    {
      std::lock_guard<std::mutex> lock(mu);
      compileThreads.insert(std::this_thread::get_id());
    }
    if (c.blockN == 16)
      throw RuntimeError(ErrorCode::InvalidArgument, "does not compile");
    regs = 200 + int(c.blockN / 32);
    spill = 0;
    return std::vector<char>(size_t(c.blockN), 'x');
  };
  // Bc = 64 is the fastest; the cubin handed to the timer is its own.
  std::map<int64_t, double> times = {{32, 2.0}, {64, 1.25}, {128, 1.5}};
  TimeFn timeFn = [&](const TileConfig &c, const std::vector<char> &cubin) {
    EXPECT_EQ(int64_t(cubin.size()), c.blockN);
    return times.at(c.blockN);
  };
  std::vector<size_t> progress;
  TuneResult r = autotune(
      cands, compile, timeFn,
      [&](size_t i, size_t n, const TunedCandidate &) {
        EXPECT_EQ(n, cands.size());
        progress.push_back(i);
      },
      /*threads=*/3);
  EXPECT_EQ(compiles.load(), 4);
  EXPECT_GE(compileThreads.size(), 1u);
  EXPECT_EQ(progress, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.best.blockN, 64);
  EXPECT_DOUBLE_EQ(r.bestMs, 1.25);
  EXPECT_EQ(r.table[3].error, "does not compile");
  EXPECT_LT(r.table[3].ms, 0);
  for (const TunedCandidate &c : r.table)
    if (c.error.empty())
      EXPECT_LE(r.bestMs, c.ms);
  std::string table = formatTuneTable(r);
  EXPECT_NE(table.find("best"), std::string::npos);
  EXPECT_NE(table.find("failed: does not compile"), std::string::npos);

  // Nothing runs: a named error.
  TimeFn failing = [](const TileConfig &, const std::vector<char> &) -> double {
    throw RuntimeError(ErrorCode::DriverError, "launch failed");
  };
  EXPECT_THROW(autotune(cands, compile, failing), RuntimeError);
}

TEST(Autotuner, ProblemClassesBucketByPowersOfTwo) {
  Problem p;
  p.seqLenQ = 1000;
  p.seqLenKV = 4097;
  p.batch = 3;
  p.heads = 5;
  EXPECT_EQ(problemClass(p), "q1024_kv8192_bh16");
  p.seqLenQ = 1024;
  EXPECT_EQ(problemClass(p), "q1024_kv8192_bh16");
  p.seqLenQ = 1025;
  EXPECT_EQ(problemClass(p), "q2048_kv8192_bh16");
  p.seqLenQ = p.seqLenKV = 1;
  p.batch = p.heads = 1;
  EXPECT_EQ(problemClass(p), "q16_kv16_bh16");
}

} // namespace
