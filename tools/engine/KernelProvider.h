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
#include "runtime/BackwardLauncher.h"
#include "runtime/DiskCache.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace flashjit::engine {

/// A cubin with its kernels' recorded launches, and what ptxas said about
/// it.
struct CubinBuild {
  KernelImage image;
  int registers = -1, spillBytes = 0;
  /// Its PTX wants whole-program assembly (wholeProgramWanted): where
  /// nvJitLink made the image (Assembler::Cubin), ptxas serialised its
  /// warpgroup MMAs and ignored setmaxnreg.
  bool wholeProgram = false;
  rt::CacheStatus cache = rt::CacheStatus::Miss;
  double prepareMs = 0; ///< flashjit's own time: cache lookup or compile
};

/// How the PTX becomes a loadable image.
enum class Assembler {
  /// The driver's JIT where wholeProgramWanted() and a driver is there
  /// (the image is then the PTX, which the driver compiles on load), else
  /// nvJitLink.
  Best,
  Cubin, ///< always an ELF cubin by nvJitLink (`compile --emit cubin`)
};

/// Whether \p ptx loses speed as a separately compiled unit, which is how
/// nvJitLink compiles PTX: ptxas then serialises warpgroup MMAs (C7509:
/// "wgmma.mma_async instructions are serialized due to the presence of
/// Extern calls") and ignores setmaxnreg (C7504), as measured on the H200
/// (bench/NOTES.md, T12). The driver's JIT compiles a module as a whole.
bool wholeProgramWanted(const std::string &ptx);

/// The kernel image for (spec, config, target), compiled from \p source
/// when given (an IR file: KernelSource): from the on-disk cache, else
/// compiled (PTX -> \p assembler) and stored. Thread-safe.
CubinBuild buildCubin(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target, rt::DiskCache &cache,
                      const KernelSource &source = {},
                      Assembler assembler = Assembler::Best);

/// The cubin cache key: everything that changes the bytes (flashjit's
/// version, the build id of the compiler's binary (compilerBuildId(), so
/// that a rebuilt flashjit of the same version never reuses another build's
/// cubins) and its code generator, the pipeline, the spec with its direction,
/// the config, the copy width, arch, PTX ISA, nvJitLink's version, and the
/// source IR's text when the kernel comes from a file).
rt::CacheKey cubinKey(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target, const KernelSource &source = {},
                      Assembler assembler = Assembler::Best);

/// The key of a loaded kernel in a process's memory (the C API handle's
/// kernel maps): \p spec's name, every field of \p config (toJson(): the
/// tiling and the flags that change the kernel, splits, the overlapped loop,
/// persistent, Q by TMA), the copy width, \p arch and the CUDA \p context
/// (null on the CPU). Cheap: no build id or driver query, unlike cubinKey().
std::string loadedKernelKey(const AttentionSpec &spec, const TileConfig &config,
                            int64_t copyBytes, const std::string &arch,
                            const void *context);

/// The cache key of tuning results: flashjit's version, build id and code
/// generator, spec (with its direction: forward and backward are tuned
/// apart), problem class, GPU identity.
rt::CacheKey tuningKey(const AttentionSpec &spec, const Problem &problem,
                       const rt::DeviceInfo &gpu);

/// A tuned config stored for (spec, problem class, GPU), if any.
std::optional<TileConfig> loadTunedConfig(const AttentionSpec &spec,
                                          const Problem &problem,
                                          const rt::DeviceInfo &gpu,
                                          rt::DiskCache &cache);

/// What the tuner may use of \p gpu (shared memory, threads, registers).
rt::TuneLimits tuneLimits(const rt::DeviceInfo &gpu);

/// Tunes the forward on the device with \p args (real inputs; the outputs
/// are overwritten), stores the winner and every candidate's cubin, returns
/// the result. Never call it on a stream being captured.
rt::TuneResult tuneOnDevice(const AttentionSpec &spec, const Problem &problem,
                            const rt::ForwardArgs &args,
                            const GpuTarget &target, const rt::DeviceInfo &gpu,
                            rt::DiskCache &cache,
                            const rt::ProgressFn &progress = {});

/// Tunes the backward (a Direction::Backward \p spec) as tuneOnDevice does
/// the forward, over rt::backwardTuningCandidates, timing the three kernels
/// together on \p args (dq, dk, dv and the delta workspace are
/// overwritten). Stored under the backward spec's tuning key.
rt::TuneResult
tuneBackwardOnDevice(const AttentionSpec &spec, const Problem &problem,
                     const rt::BackwardArgs &args, const GpuTarget &target,
                     const rt::DeviceInfo &gpu, rt::DiskCache &cache,
                     const rt::ProgressFn &progress = {});

/// Median of \p repeats calls of \p launch (one launch of whatever it runs
/// on the legacy default stream), each timed alone with CUDA events after a
/// warm-up of three calls; returns (median, min) in ms. With \p coldL2,
/// each timed call comes after a zeroing of twice the L2 (at least 64 MiB):
/// it starts with none of its inputs in the L2, and the GPU is busy while
/// the host enqueues it, so the host's launch latency is not in the time
/// (triton's do_bench, which times the peers, does both). Without, the
/// start event is recorded on an idle GPU: the first launch's latency is in
/// the time, which matters for kernels of a few microseconds.
std::pair<double, double> timeLaunches(const std::function<void()> &launch,
                                       int64_t repeats, bool coldL2 = false);

/// timeLaunches of one forward launch.
std::pair<double, double> timeLaunches(const rt::ForwardKernel &kernel,
                                       const Problem &problem,
                                       const rt::ForwardArgs &args,
                                       int64_t repeats, bool coldL2 = false);

/// timeLaunches of one backward (its three kernels, in stream order).
std::pair<double, double> timeBackwardLaunches(const rt::BackwardKernel &kernel,
                                               const Problem &problem,
                                               const rt::BackwardArgs &args,
                                               int64_t repeats,
                                               bool coldL2 = false);

} // namespace flashjit::engine

#endif // FLASHJIT_TOOLS_ENGINE_KERNELPROVIDER_H
