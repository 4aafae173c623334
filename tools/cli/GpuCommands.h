//===- GpuCommands.h - The CLI's GPU side -----------------------*- C++ -*-===//
//
/// \file
/// Compiling, launching and timing a forward kernel on the GPU for
/// `flashjit run --device cuda`, `flashjit bench` and `compile --emit cubin`.
/// Wires the compiler (PTX) to the runtime (nvJitLink, driver).
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_CLI_GPUCOMMANDS_H
#define FLASHJIT_TOOLS_CLI_GPUCOMMANDS_H

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"
#include "tools/cli/CliOptions.h"

#include <string>
#include <vector>

namespace flashjit::cli {

/// Is a CUDA driver with at least one device present?
bool gpuFound();

/// The --target to compile for: the flag, else the GPU's, else sm_90a.
GpuTarget resolveTarget(const CliOptions &o, int64_t copyBytes);

/// PTX -> cubin through nvJitLink, with the resource report.
struct CubinBuild {
  std::vector<char> cubin;
  std::string infoLog;
  int registers = -1, spillBytes = 0, sharedBytes = 0;
};
CubinBuild buildCubin(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target);

/// One GPU run: poisoned outputs, one checked launch, then timed launches.
struct GpuRunResult {
  double medianMs = 0, minMs = 0, compileMs = 0;
  int64_t copyBytes = 0;
  std::string arch;
  CubinBuild build;
};
GpuRunResult runOnGpu(const CliOptions &o, AttentionData &data,
                      const BlockSparseLayout *layout, int64_t repeats);

/// FLOPs of the forward pass (4 * B * H * Nq * Nkv * d, halved for causal).
double forwardFlops(const AttentionSpec &spec, const Problem &p);

} // namespace flashjit::cli

#endif // FLASHJIT_TOOLS_CLI_GPUCOMMANDS_H
