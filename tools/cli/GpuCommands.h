//===- GpuCommands.h - The CLI's GPU side -----------------------*- C++ -*-===//
//
/// \file
/// Compiling (through the on-disk cubin cache), tuning, launching and timing
/// a forward kernel on the GPU for `flashjit run --device cuda`, `bench`,
/// `tune` and `compile --emit cubin`. Wires the compiler (PTX) to the
/// runtime (nvJitLink, driver, autotuner, cache).
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_CLI_GPUCOMMANDS_H
#define FLASHJIT_TOOLS_CLI_GPUCOMMANDS_H

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"
#include "runtime/Autotuner.h"
#include "runtime/DiskCache.h"
#include "tools/cli/CliOptions.h"
#include "tools/engine/KernelProvider.h"

#include <string>
#include <vector>

namespace flashjit::cli {

/// Is a CUDA driver with at least one device present?
bool gpuFound();

/// The --target to compile for: the flag, else the GPU's, else sm_90a.
GpuTarget resolveTarget(const CliOptions &o, int64_t copyBytes);

using engine::CubinBuild;

/// One GPU run: poisoned outputs, one checked launch, then timed launches.
struct GpuRunResult {
  double medianMs = 0, minMs = 0, compileMs = 0, moduleLoadMs = 0;
  int64_t copyBytes = 0;
  std::string arch;
  TileConfig config;
  std::string configSource; ///< "flags", "tuned" or "heuristic"
  CubinBuild build;
  std::string tuneTable; ///< when `--tune` or `flashjit tune` tuned
  std::string tuneJson;  ///< the same, as a JSON array
};
/// Runs on the GPU; with \p tune (or `flashjit tune`), tunes first and
/// stores the winner.
GpuRunResult runOnGpu(const CliOptions &o, AttentionData &data,
                      const BlockSparseLayout *layout, int64_t repeats,
                      bool tune);

/// FLOPs of the forward pass (4 * B * H * Nq * Nkv * d, halved for causal).
double forwardFlops(const AttentionSpec &spec, const Problem &p);

/// `flashjit cache list|clear|path`.
int runCacheCommand(const CliOptions &o);

} // namespace flashjit::cli

#endif // FLASHJIT_TOOLS_CLI_GPUCOMMANDS_H
