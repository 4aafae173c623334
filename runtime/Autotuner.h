//===- Autotuner.h - Choose Br x Bc (warps, stages) on the GPU --*- C++ -*-===//
//
/// \file
/// The autotuner: enumerates the tile configs a device's limits allow,
/// prunes by rule before compiling, compiles the rest on host threads in
/// parallel and times each on the real inputs. Compiling and timing are
/// injected (the runtime knows no MLIR; tests inject fakes), so the
/// selection logic runs on the CPU in CI.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_RUNTIME_AUTOTUNER_H
#define FLASHJIT_RUNTIME_AUTOTUNER_H

#include "kernels/AttentionSpec.h"
#include "kernels/GpuDefaults.h"
#include "kernels/KernelLaunch.h"

#include <functional>
#include <string>
#include <vector>

namespace flashjit::rt {

/// What the device allows (read off it with queryDevice).
struct TuneLimits {
  int64_t maxSharedBytes = 227 * 1024; ///< opt-in shared memory per block
  int64_t maxThreadsPerBlock = 1024;
  int64_t registersPerBlock = 65536;
  /// The target runs the forward's products on warpgroup MMAs where the
  /// tiles allow (sm_90a): the heuristic candidate is then the warpgroup
  /// default (defaultGpuConfig).
  bool warpgroupMma = false;
  /// ... and takes their K/V ring (usesKvRing): the first candidate is
  /// also tried with one more stage and with none.
  bool kvRing = false;
};

/// Candidate configs for \p spec within \p limits, pruned by rule: Br a
/// multiple of 16 * warps with at most two 16-row MMA tiles per warp;
/// accumulators (O and S) that fit the 255-register file with room to
/// spare; shared memory and threads within the limits; Br and Bc dividing
/// the sparse block. Always contains defaultGpuConfig(spec,
/// limits.warpgroupMma, limits.kvRing) when that fits, first; 192 rows only
/// with 12 warps. With the K/V ring, where that first one takes it, also
/// the first with one more stage, with none, (on 8 warps) with the
/// overlapped loop switched and with the persistent kernel (with Q by its
/// tensor map) switched.
std::vector<TileConfig> tuningCandidates(const AttentionSpec &spec,
                                         const TuneLimits &limits);

/// Candidate configs of the GPU backward of \p spec (Direction::Backward)
/// within \p limits: Br and Bc in {32, 64, 128} and warps in {2, 4, 8},
/// valid per gpuBackwardConfigProblem, threads within the limit, Br and Bc
/// dividing the sparse block, and backwardAccumulatorRegisters <= 200.
/// defaultGpuBackwardConfig(spec) comes first whenever it is valid (even
/// past the register estimate: it is the measured default).
std::vector<TileConfig> backwardTuningCandidates(const AttentionSpec &spec,
                                                 const TuneLimits &limits);

/// fp32 accumulator registers per thread of the backward's hungrier kernel
/// (a 16 x n MMA accumulator tile of a warp is n / 2 floats per thread):
///   dK/dV kernel: keyTiles * (dkChunk + dvChunk) / 2 when one program
///     computes both (kvCombined), else keyTiles * max(dkChunk, dvChunk) / 2;
///     plus S^T and dP^T: 2 * keyTiles * Br / 2; all divided by
///     kvQuerySplit (a 2-D warp grid halves a warp's columns and queries);
///   dQ kernel: rowTiles * dqChunk / 2 + S and dP: 2 * rowTiles * dqKeys / 2.
int64_t backwardAccumulatorRegisters(const AttentionSpec &spec,
                                     const TileConfig &config);

/// One candidate's outcome.
struct TunedCandidate {
  TileConfig config;
  double ms = -1;    ///< median time; < 0 if it failed
  std::string error; ///< why it failed to compile or run
  int registers = -1, spillBytes = 0;
};

struct TuneResult {
  TileConfig best;
  double bestMs = -1;
  std::vector<TunedCandidate> table; ///< in candidate order
  double compileSeconds = 0, timeSeconds = 0;
};

/// Compiles one config to a cubin with its recorded launches; called from
/// several host threads at once. Fills registers / spill bytes when known.
/// Throws on failure.
using CompileFn = std::function<KernelImage(const TileConfig &config,
                                            int &registers, int &spillBytes)>;
/// Times a compiled candidate on the real inputs; returns the median ms.
/// Called on the calling thread, one candidate after another.
using TimeFn =
    std::function<double(const TileConfig &, const KernelImage &image)>;
/// Progress: candidate i of n done (its entry filled in).
using ProgressFn =
    std::function<void(size_t i, size_t n, const TunedCandidate &)>;

/// Compiles every candidate (\p threads host threads), times those that
/// compiled, returns the fastest. Throws RuntimeError(InvalidArgument) if
/// none compiled and ran.
TuneResult autotune(const std::vector<TileConfig> &candidates,
                    const CompileFn &compile, const TimeFn &time,
                    const ProgressFn &progress = {}, unsigned threads = 0);

/// The problem class tuning results are stored under: sequence lengths and
/// batch * heads rounded up to powers of two, e.g. "q16384_kv16384_bh16".
std::string problemClass(const Problem &problem);

/// The printable table of a tuning run (one line per candidate, winner
/// marked).
std::string formatTuneTable(const TuneResult &result);

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_AUTOTUNER_H
