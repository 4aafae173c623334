//===- AutotunerTests.cpp - Candidate pruning and selection, on the CPU ---===//

#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "runtime/Autotuner.h"
#include "runtime/Error.h"

#include <gtest/gtest.h>

#include <algorithm>
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

/// With the K/V ring (sm_90a), the first candidate is the ring default and
/// comes back with one more stage, with none (no ring, so without the
/// overlapped loop, which needs it) and, on two consumer warpgroups (the
/// overlapped loop's tested shapes), with the overlapped loop switched;
/// every candidate is a valid tiling for the ring target.
TEST(Autotuner, RingCandidatesVaryTheFirstOne) {
  TuneLimits limits;
  limits.warpgroupMma = limits.kvRing = true;
  for (int64_t d : {64, 128, 256})
    for (MaskKind mask : {MaskKind::None, MaskKind::Causal}) {
      AttentionSpec spec = specWith(d);
      spec.mask = mask;
      const TileConfig first = defaultGpuConfig(spec, true, true);
      std::vector<TileConfig> cands = tuningCandidates(spec, limits);
      ASSERT_FALSE(cands.empty());
      EXPECT_EQ(cands.front().toJson(), first.toJson());
      for (const TileConfig &c : cands)
        EXPECT_EQ(gpuConfigProblem(spec, c, limits.maxSharedBytes, true), "")
            << c.toJson();
      auto has = [&](int64_t stages, bool overlap) {
        return std::any_of(
            cands.begin(), cands.end(), [&](const TileConfig &c) {
              return c.blockM == first.blockM && c.blockN == first.blockN &&
                     c.warps == first.warps && c.stages == stages &&
                     c.overlapSoftmax == overlap;
            });
      };
      SCOPED_TRACE(spec.name() + " " + first.toJson());
      if (!gpuGeometry(spec, first, true).ringStages)
        continue;
      // One more stage where its shared memory fits (d = 256 at 128 x 64:
      // Q and three stages take 256 KiB).
      TileConfig deeper = first;
      ++deeper.stages;
      EXPECT_EQ(
          has(deeper.stages, first.overlapSoftmax),
          gpuConfigProblem(spec, deeper, limits.maxSharedBytes, true).empty());
      EXPECT_TRUE(has(1, false));
      // The overlapped loop switched: on two consumer warpgroups only.
      EXPECT_EQ(has(first.stages, !first.overlapSoftmax),
                first.warps == GpuGeometry::kRingConsumerWarps);
      // The persistent kernel (with Q by its tensor map) switched: the
      // first's tiling otherwise.
      EXPECT_EQ(std::count_if(cands.begin(), cands.end(),
                              [&](const TileConfig &c) {
                                TileConfig same = c;
                                same.persistent = first.persistent;
                                same.queryByTensorMap = first.queryByTensorMap;
                                return c.persistent != first.persistent &&
                                       c.queryByTensorMap == c.persistent &&
                                       same.toJson() == first.toJson();
                              }),
                1);
      // O by its tensor map (with Q's): the first's tiling otherwise,
      // where its shared memory fits.
      TileConfig byMap = first;
      byMap.queryByTensorMap = byMap.outputByTensorMap = true;
      EXPECT_EQ(
          std::count_if(
              cands.begin(), cands.end(),
              [&](const TileConfig &c) { return c.outputByTensorMap; }),
          gpuConfigProblem(spec, byMap, limits.maxSharedBytes, true).empty()
              ? 1
              : 0);
      EXPECT_EQ(
          std::count_if(cands.begin(), cands.end(),
                        [&](const TileConfig &c) {
                          return c.toJson() == byMap.toJson();
                        }),
          gpuConfigProblem(spec, byMap, limits.maxSharedBytes, true).empty()
              ? 1
              : 0);
    }
}

AttentionSpec backwardSpec(int64_t dqk, int64_t dv, bool sparse = false,
                           int64_t block = 128) {
  AttentionSpec s = specWith(dqk, sparse, block);
  s.headDimV = dv;
  s.direction = Direction::Backward;
  return s;
}

bool sameTiling(const TileConfig &a, const TileConfig &b) {
  return a.blockM == b.blockM && a.blockN == b.blockN && a.warps == b.warps &&
         a.stages == b.stages;
}

TEST(Autotuner, BackwardRegisterEstimate) {
  TileConfig c; // 64 x 64, 4 warps: one 16-key and one 16-row tile per warp
  // d = 128: dK and dV in one program: (128 + 128) / 2 + S^T, dP^T 2 * 32.
  EXPECT_EQ(backwardAccumulatorRegisters(backwardSpec(128, 128), c), 192);
  // d = 256: dK and dV split; the larger chunk (256) counts.
  EXPECT_EQ(backwardAccumulatorRegisters(backwardSpec(256, 256), c), 192);
  // d = 64 with 128 rows: the dQ kernel holds two row tiles:
  // 2 * 64 / 2 + 2 * 2 * 64 / 2 = 192; the dK/dV kernel 64 + 128.
  c.blockM = 128;
  EXPECT_EQ(backwardAccumulatorRegisters(backwardSpec(64, 64), c), 192);
  // Two key tiles per warp at d = 128: 2 * 128 + 2 * 2 * 128 / 2.
  c.blockN = 128;
  EXPECT_EQ(backwardAccumulatorRegisters(backwardSpec(128, 128), c), 512);
  // d = 512 split into 256-column chunks at 32 x 32, 2 warps: 128 + 32.
  TileConfig small;
  small.blockM = small.blockN = 32;
  small.warps = 2;
  EXPECT_EQ(backwardAccumulatorRegisters(backwardSpec(512, 512), small), 160);
}

/// The dK/dV kernel's 2-D warp grid: only with atomic dQ, one program for
/// dK and dV, Br = 64, an even number of warps and head dims in multiples
/// of 32; it halves a warp's queries and columns, doubles its keys, and
/// adds the P^T tile.
TEST(Autotuner, BackwardWarpGrid) {
  TileConfig c;
  c.blockM = 64;
  c.blockN = 128;
  c.warps = 8;
  GpuBackwardGeometry g = gpuBackwardGeometry(backwardSpec(128, 128), c);
  EXPECT_EQ(g.kvQuerySplit, 2);
  EXPECT_EQ(g.keyTiles, 2); // 128 keys over 4 key parts
  EXPECT_EQ(g.kvSmem.dqStage - g.kvSmem.pTile, 128 * 64 * 2);
  // Registers: 32 keys x 128 columns (dK, dV) + 32 x 32 (S^T, dP^T) twice.
  EXPECT_EQ(backwardAccumulatorRegisters(backwardSpec(128, 128), c),
            32 * 128 / 32 + 2 * 32 * 32 / 32);
  AttentionSpec det = backwardSpec(128, 128);
  det.deterministic = true;
  for (auto [spec, config] :
       {std::pair(det, c), std::pair(backwardSpec(80, 80), c),
        std::pair(backwardSpec(256, 256), c),
        std::pair(backwardSpec(128, 128), TileConfig{128, 128, 8, 2}),
        std::pair(backwardSpec(128, 128), TileConfig{64, 128, 1, 2})}) {
    GpuBackwardGeometry one = gpuBackwardGeometry(spec, config);
    EXPECT_EQ(one.kvQuerySplit, 1) << spec.name() << " " << config.toJson();
    EXPECT_EQ(one.keyTiles, config.blockN / (16 * config.warps));
    EXPECT_EQ(one.kvSmem.dqStage, one.kvSmem.pTile);
  }
}

/// The dK/dV kernel on warpgroup MMAs stages dQ for bulk reductions after
/// its other tiles (1 KiB aligned): each warpgroup 64 rows of its columns
/// (64 of 128, or all where the warpgroups split the keys); only where
/// dQ's columns are a multiple of 16 and the block still fits 227 KiB.
TEST(Autotuner, BackwardDqStagingRows) {
  struct Case {
    int64_t dqk, dv;
    TileConfig config;
    int64_t cols; ///< 0: no staging
  };
  const Case cases[] = {{128, 128, TileConfig{64, 128, 8, 2}, 64},
                        {64, 64, TileConfig{64, 128, 8, 2}, 64},
                        {96, 96, TileConfig{64, 128, 8, 2}, 96},
                        {128, 128, TileConfig{64, 64, 4, 2}, 128},
                        {80, 80, TileConfig{64, 128, 8, 2}, 80},
                        {72, 72, TileConfig{64, 128, 8, 2}, 0},
                        {192, 64, TileConfig{64, 128, 8, 2}, 0},
                        {128, 128, TileConfig{128, 128, 8, 2}, 0}};
  for (const Case &c : cases) {
    GpuBackwardGeometry g =
        gpuBackwardGeometry(backwardSpec(c.dqk, c.dv), c.config);
    SCOPED_TRACE(std::to_string(c.dqk) + " " + c.config.toJson());
    EXPECT_EQ(g.bulkDq, c.cols > 0);
    EXPECT_LE(g.kvSmem.total, kSm90MaxSharedBytes);
    if (!g.bulkDq) {
      EXPECT_EQ(g.kvSmem.dqStage, g.kvSmem.total);
      continue;
    }
    EXPECT_EQ(g.dqStageCols, c.cols);
    EXPECT_EQ(g.kvSmem.dqStage % 1024, 0);
    EXPECT_GE(g.kvSmem.dqStage, g.kvSmem.pTile);
    EXPECT_EQ(g.kvSmem.total - g.kvSmem.dqStage,
              c.config.warps / 4 * 64 * c.cols * 4);
  }
}

/// The dQ kernel's own tiling: two row tiles per warp and 32 keys per step
/// where Br gives each warp one tile and dQ fits; else Br and Bc.
TEST(Autotuner, BackwardDqKernelTiling) {
  TileConfig c; // 64 x 64, 4 warps
  AttentionSpec det = backwardSpec(128, 128);
  det.deterministic = true;
  GpuBackwardGeometry g = gpuBackwardGeometry(det, c);
  EXPECT_FALSE(g.atomicDq);
  EXPECT_EQ(g.rowTiles, 2);
  EXPECT_EQ(g.dqRows, 128);
  EXPECT_EQ(g.dqKeys, 32);
  Problem p;
  p.heads = 2;
  p.seqLenQ = p.seqLenKV = 300;
  EXPECT_EQ(g.dqGrid(p)[0], 3); // ceil(300 / 128)
  EXPECT_EQ(g.dqGrid(p)[1], 2);
  EXPECT_EQ(g.dqThreads(), 128);
  EXPECT_EQ(g.dqSharedBytes(), g.dqSmem.total);
  // Atomic dQ: the third kernel converts dq_accum, a warp per row as the
  // preprocess; the dK/dV kernel holds dS^T and, in its 2-D warp grid,
  // P^T (Bc keys x Br queries each).
  GpuBackwardGeometry atomic = gpuBackwardGeometry(backwardSpec(128, 128), c);
  EXPECT_TRUE(atomic.atomicDq);
  EXPECT_EQ(atomic.dqGrid(p), atomic.preprocessGrid(p));
  EXPECT_EQ(atomic.dqThreads(), GpuBackwardGeometry::kPreprocessThreads);
  EXPECT_EQ(atomic.dqSharedBytes(), 0);
  EXPECT_EQ(atomic.kvQuerySplit, 2);
  EXPECT_EQ(atomic.kvSmem.pTile - atomic.kvSmem.dsTile, 64 * 64 * 2);
  EXPECT_EQ(atomic.kvSmem.dqStage - atomic.kvSmem.pTile, 64 * 64 * 2);
  EXPECT_EQ(g.kvQuerySplit, 1);
  EXPECT_EQ(g.kvSmem.total, g.kvSmem.dsTile);
  EXPECT_FALSE(g.bulkDq);
  // Already two row tiles per warp (128 rows): Br x Bc as given.
  c.blockM = 128;
  g = gpuBackwardGeometry(backwardSpec(64, 64), c);
  EXPECT_EQ(g.dqRows, 128);
  EXPECT_EQ(g.dqKeys, 64);
  // dQ chunks of 256 columns would not fit twice: one tile per warp.
  c.blockM = 64;
  g = gpuBackwardGeometry(backwardSpec(256, 256), c);
  EXPECT_EQ(g.rowTiles, 1);
  EXPECT_EQ(g.dqRows, 64);
  EXPECT_EQ(g.dqKeys, 64);
  // A sparse block of 64 cannot hold 128 rows.
  g = gpuBackwardGeometry(backwardSpec(128, 128, /*sparse=*/true, 64), c);
  EXPECT_EQ(g.dqRows, 64);
  EXPECT_EQ(g.dqKeys, 64);
}

/// The candidates are exactly the default (first, when valid) and the grid
/// configs that are valid and within the register estimate.
TEST(Autotuner, BackwardCandidatesAreTheValidPrunedGrid) {
  struct Dims {
    int64_t dqk, dv;
  };
  for (Dims d : {Dims{16, 16}, Dims{64, 64}, Dims{96, 96}, Dims{128, 128},
                 Dims{160, 128}, Dims{256, 256}, Dims{33, 512}, Dims{512, 512}})
    for (int64_t sparseBlock : {0, 16, 64, 128})
      for (int64_t shared : {48 * 1024, 100 * 1024, 227 * 1024})
        for (int64_t threads : {128, 1024}) {
          TuneLimits limits;
          limits.maxSharedBytes = shared;
          limits.maxThreadsPerBlock = threads;
          AttentionSpec spec =
              backwardSpec(d.dqk, d.dv, sparseBlock > 0,
                           sparseBlock > 0 ? sparseBlock : 128);
          auto valid = [&](const TileConfig &c) {
            return gpuBackwardConfigProblem(spec, c, shared).empty() &&
                   32 * c.warps <= threads &&
                   (!spec.blockSparse || (spec.sparseBlock % c.blockM == 0 &&
                                          spec.sparseBlock % c.blockN == 0));
          };
          SCOPED_TRACE(spec.name() + " shared " + std::to_string(shared) +
                       " threads " + std::to_string(threads));
          std::vector<TileConfig> cands =
              backwardTuningCandidates(spec, limits);
          TileConfig fallback = defaultGpuBackwardConfig(spec);
          size_t at = 0;
          if (valid(fallback)) {
            ASSERT_FALSE(cands.empty());
            EXPECT_TRUE(sameTiling(cands[0], fallback)) << cands[0].toJson();
            at = 1;
          }
          std::vector<TileConfig> expected;
          for (int64_t bm : {32, 64, 128})
            for (int64_t bn : {32, 64, 128})
              for (int64_t warps : {2, 4, 8}) {
                TileConfig c;
                c.blockM = bm;
                c.blockN = bn;
                c.warps = warps;
                if (valid(c) && backwardAccumulatorRegisters(spec, c) <= 200 &&
                    !(at == 1 && sameTiling(c, fallback)))
                  expected.push_back(c);
              }
          ASSERT_EQ(cands.size(), at + expected.size());
          for (size_t i = 0; i < expected.size(); ++i)
            EXPECT_TRUE(sameTiling(cands[at + i], expected[i]))
                << cands[at + i].toJson() << " vs " << expected[i].toJson();
          for (const TileConfig &c : cands) {
            EXPECT_TRUE(valid(c)) << c.toJson();
            GpuBackwardGeometry g = gpuBackwardGeometry(spec, c);
            EXPECT_LE(std::max(g.kvSmem.total, g.dqSharedBytes()), shared);
          }
        }
}

TEST(Autotuner, BackwardCandidatesPruneAndKeepTheDefault) {
  TuneLimits limits;
  AttentionSpec spec = backwardSpec(128, 128);
  spec.deterministic = true;
  auto cands = backwardTuningCandidates(spec, limits);
  ASSERT_GT(cands.size(), 1u);
  EXPECT_TRUE(sameTiling(cands[0], defaultGpuBackwardConfig(spec)));
  auto has = [&](int64_t bm, int64_t bn, int64_t warps) {
    return std::any_of(cands.begin(), cands.end(), [&](const TileConfig &c) {
      return c.blockM == bm && c.blockN == bn && c.warps == warps;
    });
  };
  EXPECT_TRUE(has(64, 64, 4));
  EXPECT_TRUE(has(32, 32, 2));
  EXPECT_FALSE(has(128, 128, 4)) << "512 accumulator floats per thread";
  EXPECT_FALSE(has(32, 64, 4)) << "Br = 32 cannot be split by 4 warps";
  // Atomic dQ: no dQ kernel splits Br, and Bc = 128 with 8 warps leads.
  AttentionSpec atomic = backwardSpec(128, 128);
  auto atomicCands = backwardTuningCandidates(atomic, limits);
  EXPECT_TRUE(sameTiling(atomicCands[0], defaultGpuBackwardConfig(atomic)));
  EXPECT_EQ(atomicCands[0].blockN, 128);
  EXPECT_EQ(atomicCands[0].warps, 8);
  EXPECT_TRUE(std::any_of(
      atomicCands.begin(), atomicCands.end(), [](const TileConfig &c) {
        return c.blockM == 32 && c.blockN == 64 && c.warps == 4;
      }));
  // A sparse block of 16 leaves only the (shrunk) default.
  AttentionSpec tiny = backwardSpec(64, 64, true, 16);
  cands = backwardTuningCandidates(tiny, limits);
  ASSERT_EQ(cands.size(), 1u);
  EXPECT_EQ(cands[0].blockM, 16);
  EXPECT_EQ(cands[0].blockN, 16);
  EXPECT_EQ(cands[0].warps, 1);
  // Too little shared memory for anything: no candidate.
  limits.maxSharedBytes = 1024;
  EXPECT_TRUE(backwardTuningCandidates(spec, limits).empty());
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
    return KernelImage{std::vector<char>(size_t(c.blockN), 'x'), {}};
  };
  // Bc = 64 is the fastest; the cubin handed to the timer is its own.
  std::map<int64_t, double> times = {{32, 2.0}, {64, 1.25}, {128, 1.5}};
  TimeFn timeFn = [&](const TileConfig &c, const KernelImage &image) {
    EXPECT_EQ(int64_t(image.cubin.size()), c.blockN);
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
  TimeFn failing = [](const TileConfig &, const KernelImage &) -> double {
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
