//===- GpuCommands.h - The CLI's GPU side -----------------------*- C++ -*-===//
//
/// \file
/// Compiling (through the on-disk cubin cache), tuning, launching and timing
/// kernels on the GPU for `flashjit run --device cuda`, `bench`, `tune` and
/// `compile --emit cubin`, forward and backward. Wires the compiler (PTX) to
/// the runtime (nvJitLink, driver, autotuner, cache).
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

#include <functional>
#include <future>
#include <optional>
#include <string>
#include <vector>

namespace flashjit::cli {

/// Is a CUDA driver with at least one device present?
bool gpuFound();

/// Resolves the device: --device, else cuda when a driver and a GPU are
/// found, else cpu with a note on stderr. --device cuda without a driver
/// throws the driver's NoDriver error (exit 3).
Device resolveDevice(const CliOptions &o);

/// The --target to compile for: the flag, else the GPU's, else sm_90a.
GpuTarget resolveTarget(const CliOptions &o, int64_t copyBytes);

/// The forward's tiling on \p target for any problem that is not a decode,
/// without flags or tuning: defaultGpuConfig with the target's warpgroup
/// MMAs and K/V ring.
TileConfig targetDefaultTiling(const AttentionSpec &spec,
                               const GpuTarget &target);

/// The forward's tiling on \p target for problem \p p without flags or
/// tuning: the split-KV decode tiling where \p p is a decode
/// (decodeGpuConfig), else targetDefaultTiling.
TileConfig deviceDefaultTiling(const AttentionSpec &spec, const Problem &p,
                               const GpuTarget &target);

using engine::CubinBuild;

/// The GPU side of one CLI run: the driver started with device 0's context
/// current, the device's identity and the on-disk cache. nvJitLink (~100
/// MB) loads on a helper thread meanwhile: the cubin cache key names its
/// version.
class GpuSession {
public:
  GpuSession();
  /// What to compile for, with \p copyBytes (waits for nvJitLink).
  GpuTarget target(const CliOptions &o, int64_t copyBytes);

  rt::DeviceInfo info;
  rt::DiskCache cache;

private:
  std::future<void> nvJitLinkLoaded;
};

/// Device copies of host tensors. Views of one host buffer share one device
/// buffer (q, k, v of a packed qkv tensor; dq, dk, dv of its gradient).
class DeviceTensors {
public:
  /// The device view of \p t; on first use its buffer is allocated and, if
  /// \p upload, copied up.
  rt::DeviceTensor map(const HalfTensor &t, bool upload = true);
  /// Fills the device buffer of each tensor with 0xff bytes (NaN in bf16 and
  /// fp16): an element the kernel skips fails the check.
  void poison(std::initializer_list<const HalfTensor *> tensors);
  /// Copies the device buffer of each tensor back into its host buffer
  /// (once per buffer).
  void download(std::initializer_list<const HalfTensor *> tensors);

private:
  rt::DeviceBuffer &buffer(const HalfTensor &t);
  std::vector<std::pair<const std::vector<uint16_t> *, rt::DeviceBuffer>> bufs;
};

/// A forward problem on the device: q, k, v uploaded, o and lse allocated,
/// the layout uploaded if any.
struct DeviceProblem {
  DeviceTensors tensors;
  rt::DeviceBuffer lse, counts, indices;
  rt::DeviceBuffer cuSeqQ, cuSeqKV; ///< a varlen batch's offsets
  std::vector<rt::DeviceBuffer> captures; ///< the score modifier's tensors
  rt::ForwardArgs args;

  DeviceProblem(const AttentionData &data, const BlockSparseLayout *layout);
  /// NaN into o and lse.
  void poison(const AttentionData &data);
  /// o and lse back into \p data.
  void download(AttentionData &data);
};

/// One GPU run: poisoned outputs, one checked launch, then timed launches.
struct GpuRunResult {
  double medianMs = 0, minMs = 0, compileMs = 0, moduleLoadMs = 0;
  int64_t copyBytes = 0;
  std::string arch;
  TileConfig config;
  std::string configSource; ///< "flags", "tuned" or "heuristic"
  int64_t kvSplits = 0;     ///< split-KV: the launches' split count (else 0)
  /// The tensor maps the kernel takes (its K/V ring's copies by the TMA).
  int64_t tensorMaps = 0;
  /// A scheduled persistent kernel took a tile schedule (not the stride).
  bool tileSchedule = false;
  CubinBuild build;
  std::string tuneTable; ///< when `--tune` or `flashjit tune` tuned
  std::string tuneJson;  ///< the same, as a JSON array
};

/// Tunes on the device with the run's inputs, reporting progress.
using TuneFn = std::function<rt::TuneResult(const rt::ProgressFn &)>;
/// Why a config cannot run on the device ("" if it can).
using ConfigCheck = std::function<std::string(const TileConfig &)>;

/// The part of a GPU run that the forward and the backward share: the
/// config of \p spec is \p flags if given, else a fresh tuning run of
/// \p tune if given (\p tune also runs with flags: the table is printed,
/// the flags win), else the config `tune` stored for (spec, problem class,
/// GPU), else \p fallback; \p check must accept it (else SpecError); then
/// the cubin through the cache. Fills every field but the times and the
/// module load.
GpuRunResult prepareGpuRun(const CliOptions &o, GpuSession &session,
                           const AttentionSpec &spec, const GpuTarget &target,
                           const std::optional<TileConfig> &flags,
                           const TileConfig &fallback, const ConfigCheck &check,
                           const TuneFn &tune);

/// The forward of \p spec on \p dev: prepareGpuRun (the tiling flags if
/// \p useFlags, else tuned or default), one launch on poisoned outputs, O
/// and lse copied into \p data (and left on the device), then \p repeats
/// timed launches (none if 0). With \p tune, tunes first and stores the
/// winner.
GpuRunResult runForwardOnDevice(const CliOptions &o, GpuSession &session,
                                const AttentionSpec &spec, DeviceProblem &dev,
                                AttentionData &data, int64_t repeats, bool tune,
                                bool useFlags);

/// Runs the forward of o.spec on the GPU (runForwardOnDevice with the
/// tiling flags); with \p tune (or `flashjit tune`), tunes first and stores
/// the winner.
GpuRunResult runOnGpu(const CliOptions &o, AttentionData &data,
                      const BlockSparseLayout *layout, int64_t repeats,
                      bool tune);

/// The JSON fields a GPU run adds (each with a leading comma): arch,
/// copy_bytes, registers, spill_bytes, shared_bytes (the most any kernel
/// records), min_ms, tflops, repeats, cold_l2, cache, config_source,
/// prepare_ms, module_load_ms and, after tuning, candidates; cold_l2: whether
/// each timed launch came after a zeroing of twice the L2 (--cold-l2).
std::string gpuJsonFields(const GpuRunResult &r, double tflops, int64_t repeats,
                          bool coldL2);

/// The text form's GPU summary: TFLOP/s, arch, registers, spills, config
/// source, cubin cache.
std::string gpuTextSummary(const GpuRunResult &r, double tflops);

/// Prints the tuning table and the winner, in text mode after tuning.
void printTuneOutcome(const CliOptions &o, const GpuRunResult &r,
                      const Problem &p);

/// FLOPs of the forward pass (4 * B * H * Nq * Nkv * d, halved for causal;
/// with a varlen \p data, the sum of Nq * Nkv over its sequences).
double forwardFlops(const AttentionSpec &spec, const Problem &p,
                    const AttentionData *data = nullptr);

/// FLOPs of the backward pass: 2.5 x the forward's (dV, dP, dQ, dK and the
/// recomputed S: five matmuls to the forward's two), halved for causal as
/// the forward's.
double backwardFlops(const AttentionSpec &spec, const Problem &p,
                     const AttentionData *data = nullptr);

/// `flashjit cache list|clear|path`.
int runCacheCommand(const CliOptions &o);

} // namespace flashjit::cli

#endif // FLASHJIT_TOOLS_CLI_GPUCOMMANDS_H
