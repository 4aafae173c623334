//===- Autotuner.cpp - Choose Br x Bc (warps, stages) on the GPU ----------===//

#include "runtime/Autotuner.h"
#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "runtime/Error.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fmt/format.h>
#include <thread>

namespace flashjit::rt {

/// Registers the fp32 accumulators of a config take per thread: O
/// (mTiles x dvChunk / 8 x 4) and S (mTiles x Bc / 8 x 4). Past ~200, with
/// addresses and softmax state on top, ptxas spills heavily.
static int64_t accumulatorRegisters(const AttentionSpec &spec,
                                    const TileConfig &c) {
  GpuGeometry g = gpuGeometry(spec, c);
  return g.mTiles * (g.dvChunk / 8) * 4 + g.mTiles * (c.blockN / 8) * 4;
}

std::vector<TileConfig> tuningCandidates(const AttentionSpec &spec,
                                         const TuneLimits &limits) {
  std::vector<TileConfig> out;
  auto fits = [&](const TileConfig &c) {
    if (!gpuConfigProblem(spec, c, limits.maxSharedBytes, limits.kvRing)
             .empty())
      return false;
    if (gpuGeometry(spec, c).mTiles > 2)
      return false;
    if (gpuGeometry(spec, c, limits.kvRing).threads >
        limits.maxThreadsPerBlock)
      return false;
    if (accumulatorRegisters(spec, c) > 200)
      return false;
    if (spec.blockSparse &&
        (spec.sparseBlock % c.blockM != 0 || spec.sparseBlock % c.blockN != 0))
      return false;
    return true;
  };
  TileConfig heuristic =
      defaultGpuConfig(spec, limits.warpgroupMma, limits.kvRing);
  if (fits(heuristic))
    out.push_back(heuristic);
  // 192 x Bc with 12 warps: three warpgroups, each on its 64 rows
  // (warpgroup MMAs on sm_90a).
  for (int64_t bm : {64, 128, 192, 256})
    for (int64_t bn : {32, 64, 128})
      for (int64_t warps : {4, 8, 12}) {
        if ((bm == 192) != (warps == 12))
          continue;
        TileConfig c;
        c.blockM = bm;
        c.blockN = bn;
        c.warps = warps;
        c.stages = 2; // K and V overlap (FA-2); deeper pipelines: later
        bool dup =
            std::any_of(out.begin(), out.end(), [&](const TileConfig &o) {
              return o.blockM == bm && o.blockN == bn && o.warps == warps;
            });
        if (!dup && fits(c))
          out.push_back(c);
      }
  // The warpgroup-MMA forward's K/V ring: the first candidate also with
  // one more stage, with none (the loop's own copies) and with the
  // overlapped loop switched (on where it is off, and off where on).
  if (limits.kvRing && !out.empty() &&
      gpuGeometry(spec, out.front(), true).ringStages) {
    const TileConfig first = out.front();
    for (int64_t stages : {first.stages + 1, int64_t(1)}) {
      TileConfig c = first;
      c.stages = stages;
      c.overlapSoftmax = c.overlapSoftmax && stages > 1;
      if (fits(c))
        out.push_back(c);
    }
    // The overlapped loop is tested on two consumer warpgroups only.
    TileConfig c = first;
    c.overlapSoftmax = !c.overlapSoftmax;
    if (c.warps == GpuGeometry::kRingConsumerWarps && fits(c))
      out.push_back(c);
    // The persistent kernel with Q by its tensor map, switched likewise.
    if (!first.splits && spec.direction == Direction::Forward) {
      TileConfig p = first;
      p.persistent = p.queryByTensorMap = !first.persistent;
      if (fits(p))
        out.push_back(p);
      // O by its tensor map too (with Q's), the first's tiling otherwise
      // (T36, H100: d 96 +6%, d 64 to 256 -1% to -11%).
      TileConfig o = first;
      o.queryByTensorMap = o.outputByTensorMap = true;
      if (!first.outputByTensorMap && fits(o))
        out.push_back(o);
    }
  }
  return out;
}

int64_t backwardAccumulatorRegisters(const AttentionSpec &spec,
                                     const TileConfig &c) {
  GpuBackwardGeometry g = gpuBackwardGeometry(spec, c);
  int64_t kvOut =
      g.kvCombined ? g.dkChunk + g.dvChunk : std::max(g.dkChunk, g.dvChunk);
  // A warp's keys x its columns (kvOut / kvQuerySplit) and x its queries
  // (Br / kvQuerySplit) for S^T and dP^T, over 32 lanes.
  const int64_t q = g.kvQuerySplit;
  int64_t kv =
      g.keyTiles * kvOut / (2 * q) + 2 * g.keyTiles * c.blockM / (2 * q);
  if (g.atomicDq) // no dQ kernel; the dK/dV kernel's dQ slab: 64 at most
    return kv;
  int64_t dq = g.rowTiles * g.dqChunk / 2 + 2 * g.rowTiles * g.dqKeys / 2;
  return std::max(kv, dq);
}

std::vector<TileConfig> backwardTuningCandidates(const AttentionSpec &spec,
                                                 const TuneLimits &limits) {
  std::vector<TileConfig> out;
  auto valid = [&](const TileConfig &c) {
    return gpuBackwardConfigProblem(spec, c, limits.maxSharedBytes).empty() &&
           32 * c.warps <= limits.maxThreadsPerBlock &&
           (!spec.blockSparse || (spec.sparseBlock % c.blockM == 0 &&
                                  spec.sparseBlock % c.blockN == 0));
  };
  auto listed = [&](const TileConfig &c) {
    return std::any_of(out.begin(), out.end(), [&](const TileConfig &o) {
      return o.blockM == c.blockM && o.blockN == c.blockN &&
             o.warps == c.warps && o.stages == c.stages;
    });
  };
  TileConfig fallback = defaultGpuBackwardConfig(spec);
  if (valid(fallback))
    out.push_back(fallback);
  for (int64_t bm : {32, 64, 128})
    for (int64_t bn : {32, 64, 128})
      for (int64_t warps : {2, 4, 8}) {
        TileConfig c;
        c.blockM = bm;
        c.blockN = bn;
        c.warps = warps;
        c.stages = 2;
        if (!listed(c) && valid(c) &&
            backwardAccumulatorRegisters(spec, c) <= 200)
          out.push_back(c);
      }
  return out;
}

TuneResult autotune(const std::vector<TileConfig> &candidates,
                    const CompileFn &compile, const TimeFn &time,
                    const ProgressFn &progress, unsigned threads) {
  TuneResult r;
  r.table.resize(candidates.size());
  std::vector<KernelImage> cubins(candidates.size());
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < candidates.size();) {
      TunedCandidate &c = r.table[i];
      c.config = candidates[i];
      try {
        cubins[i] = compile(c.config, c.registers, c.spillBytes);
      } catch (const std::exception &e) {
        c.error = e.what();
      }
    }
  };
  if (threads == 0)
    threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  threads = unsigned(std::min<size_t>(threads, candidates.size()));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i)
    pool.emplace_back(worker);
  worker();
  for (auto &t : pool)
    t.join();
  auto t1 = std::chrono::steady_clock::now();
  r.compileSeconds = std::chrono::duration<double>(t1 - t0).count();

  for (size_t i = 0; i < r.table.size(); ++i) {
    TunedCandidate &c = r.table[i];
    if (c.error.empty()) {
      try {
        c.ms = time(c.config, cubins[i]);
      } catch (const std::exception &e) {
        c.error = e.what();
      }
    }
    if (c.error.empty() && (r.bestMs < 0 || c.ms < r.bestMs)) {
      r.bestMs = c.ms;
      r.best = c.config;
    }
    if (progress)
      progress(i, r.table.size(), c);
  }
  r.timeSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1)
          .count();
  if (r.bestMs < 0)
    throw RuntimeError(
        ErrorCode::InvalidArgument,
        fmt::format(
            "autotune: none of {} candidates compiled "
            "and ran{}",
            candidates.size(),
            r.table.empty() ? "" : "; first error: " + r.table.front().error));
  return r;
}

/// Smallest power of two >= \p x (at least 16).
static int64_t bucket(int64_t x) {
  int64_t b = 16;
  while (b < x)
    b *= 2;
  return b;
}

std::string problemClass(const Problem &p) {
  return fmt::format("q{}_kv{}_bh{}", bucket(p.seqLenQ), bucket(p.seqLenKV),
                     bucket(p.batch * p.heads));
}

std::string formatTuneTable(const TuneResult &r) {
  std::string out =
      fmt::format("{:>4} {:>9} {:>6} {:>6} {:>10} {:>5} {:>6}\n", "", "Br x Bc",
                  "warps", "stages", "ms", "regs", "spill");
  for (const TunedCandidate &c : r.table) {
    bool best = c.error.empty() && c.ms == r.bestMs &&
                c.config.blockM == r.best.blockM &&
                c.config.blockN == r.best.blockN &&
                c.config.warps == r.best.warps;
    std::string tile = fmt::format("{}x{}", c.config.blockM, c.config.blockN);
    if (c.error.empty())
      out += fmt::format("{:>4} {:>9} {:>6} {:>6} {:>10.4f} {:>5} {:>6}\n",
                         best ? "best" : "", tile, c.config.warps,
                         c.config.stages, c.ms, c.registers, c.spillBytes);
    else
      out += fmt::format("{:>4} {:>9} {:>6} {:>6} failed: {}\n", "", tile,
                         c.config.warps, c.config.stages,
                         c.error.substr(0, c.error.find('\n')));
  }
  return out;
}

} // namespace flashjit::rt
