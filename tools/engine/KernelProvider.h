//===- KernelProvider.h - Cubins and tile configs, cached -------*- C++ -*-===//
//
/// \file
/// Where the CLI and the C API get GPU kernels from: the cubin for a (spec,
/// config, target) through the on-disk cache (compiled on a miss), and the
/// tile config for a (spec, problem class, GPU): tuned on the device with
/// the real inputs, or from the cache, or the heuristic.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_ENGINE_KERNELPROVIDER_H
#define FLASHJIT_TOOLS_ENGINE_KERNELPROVIDER_H

#include "compiler/Compiler.h"
#include "runtime/AttentionLauncher.h"
#include "runtime/Autotuner.h"
#include "runtime/DiskCache.h"

#include <optional>
#include <string>
#include <vector>

namespace flashjit::engine {

/// A cubin and what ptxas said about it.
struct CubinBuild {
  std::vector<char> cubin;
  int registers = -1, spillBytes = 0;
  rt::CacheStatus cache = rt::CacheStatus::Miss;
  double prepareMs = 0; ///< flashjit's own time: cache lookup or compile
};

/// The cubin for (spec, config, target): from the on-disk cache, else
/// compiled (PTX -> nvJitLink) and stored. Thread-safe.
CubinBuild buildCubin(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target, rt::DiskCache &cache);

/// The cache key of tuning results: spec, problem class, GPU identity.
rt::CacheKey tuningKey(const AttentionSpec &spec, const Problem &problem,
                       const rt::DeviceInfo &gpu);

/// A tuned config stored for (spec, problem class, GPU), if any.
std::optional<TileConfig> loadTunedConfig(const AttentionSpec &spec,
                                          const Problem &problem,
                                          const rt::DeviceInfo &gpu,
                                          rt::DiskCache &cache);

/// Tunes on the device with \p args (real inputs; the outputs are
/// overwritten), stores the winner and every candidate's cubin, returns the
/// result. Never call it on a stream being captured.
rt::TuneResult tuneOnDevice(const AttentionSpec &spec, const Problem &problem,
                            const rt::ForwardArgs &args,
                            const GpuTarget &target, const rt::DeviceInfo &gpu,
                            rt::DiskCache &cache,
                            const rt::ProgressFn &progress = {});

/// Median of \p repeats launches on the legacy default stream, each timed
/// alone with CUDA events after a warm-up; returns (median, min) in ms.
std::pair<double, double> timeLaunches(const rt::ForwardKernel &kernel,
                                       const Problem &problem,
                                       const rt::ForwardArgs &args,
                                       int64_t repeats);

} // namespace flashjit::engine

#endif // FLASHJIT_TOOLS_ENGINE_KERNELPROVIDER_H
