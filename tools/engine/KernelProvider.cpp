//===- KernelProvider.cpp - Cubins and tile configs, cached ---------------===//

#include "tools/engine/KernelProvider.h"
#include "compiler/Target/PTXEmitter.h"
#include "runtime/CudaDriver.h"
#include "runtime/NvJitLink.h"
#include "tools/engine/BuildId.h"
#include "tools/engine/Stopwatch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <optional>

namespace flashjit::engine {

rt::CacheKey cubinKey(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target, const KernelSource &source,
                      Assembler assembler) {
  rt::CacheKey key;
  // The version is the same for every build of a release: the build id
  // tells builds apart (a rebuilt compiler never reuses another's cubins).
  key.add("version", FLASHJIT_VERSION)
      .add("build_id", compilerBuildId())
      .add("codegen", kCodegenRevision)
      .add("pipeline", gpuPipelineText(config, target, &spec))
      .add("spec", spec.toJson())
      .add("config", config.toJson())
      .add("copy_bytes", std::to_string(target.copyBytes))
      .add("arch", target.arch)
      // The PTX ISA is a function of (arch, driver); naming the driver keeps
      // a cache hit from having to ask LLVM for the arch's minimum.
      .add("ptx_isa", target.driverVersion > 0
                          ? fmt::format("for driver {}", target.driverVersion)
                          : std::to_string(choosePtxVersion(target.arch, 0)))
      .add("nvjitlink", rt::nvJitLinkVersionString());
  if (!source.empty())
    key.add("source", source.text);
  // Where the driver's JIT is taken (buildCubin) the entry holds PTX.
  if (assembler == Assembler::Best && usesWgmma(target) &&
      rt::CudaDriver::get().available())
    key.add("assembler", "driver jit where whole-program");
  return key;
}

bool wholeProgramWanted(const std::string &ptx) {
  return ptx.find("wgmma.mma_async") != std::string::npos ||
         ptx.find("setmaxnreg") != std::string::npos;
}

namespace {

/// Cached cubins start with one line "registers=R spill=S whole=W
/// kernels=N" (W: CubinBuild::wholeProgram, 0 or 1), then the N kernels'
/// recorded launches (formatKernelLaunches), then the cubin.
std::vector<char> packCubin(const CubinBuild &b) {
  std::string head =
      fmt::format("registers={} spill={} whole={} kernels={}\n", b.registers,
                  b.spillBytes, int(b.wholeProgram), b.image.kernels.size()) +
      formatKernelLaunches(b.image.kernels);
  std::vector<char> out(head.begin(), head.end());
  out.insert(out.end(), b.image.cubin.begin(), b.image.cubin.end());
  return out;
}

/// The inverse of packCubin; false for a payload of another format (an
/// older flashjit's: then the entry is rebuilt) or a damaged one.
bool unpackCubin(const std::vector<char> &payload, CubinBuild &b) {
  auto nl = std::find(payload.begin(), payload.end(), '\n');
  if (nl == payload.end())
    return false;
  std::string head(payload.begin(), nl);
  int kernels = 0, whole = -1;
  char extra = 0;
  if (std::sscanf(head.c_str(), "registers=%d spill=%d whole=%d kernels=%d%c",
                  &b.registers, &b.spillBytes, &whole, &kernels, &extra) != 4 ||
      (whole != 0 && whole != 1) || kernels < 1 || kernels > 16)
    return false;
  b.wholeProgram = whole == 1;
  auto end = nl + 1;
  for (int i = 0; i < kernels; ++i) {
    end = std::find(end, payload.end(), '\n');
    if (end == payload.end())
      return false;
    ++end;
  }
  auto launches = parseKernelLaunches(std::string(nl + 1, end));
  if (!launches || launches->size() != size_t(kernels))
    return false;
  b.image.kernels = std::move(*launches);
  b.image.cubin.assign(end, payload.end());
  return b.image.cubin.size() > 4;
}

} // namespace

std::string loadedKernelKey(const AttentionSpec &spec, const TileConfig &config,
                            int64_t copyBytes, const std::string &arch,
                            const void *context) {
  return fmt::format("{}|{}|copy{}|{}|ctx{}", spec.name(), config.toJson(),
                     copyBytes, arch, context);
}

rt::CacheKey tuningKey(const AttentionSpec &spec, const Problem &p,
                       const rt::DeviceInfo &info) {
  rt::CacheKey key;
  // The build id too: another build's kernels may rank (or fit) otherwise.
  key.add("version", FLASHJIT_VERSION)
      .add("build_id", compilerBuildId())
      .add("codegen", kCodegenRevision)
      .add("spec", spec.toJson())
      .add("problem_class", rt::problemClass(p))
      .add("gpu_name", info.name)
      .add("gpu_cc", fmt::format("{}.{}", info.ccMajor, info.ccMinor))
      .add("gpu_sms", std::to_string(info.smCount))
      .add("driver", std::to_string(info.driverVersion));
  return key;
}

CubinBuild buildCubin(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target, rt::DiskCache &cache,
                      const KernelSource &source, Assembler assembler) {
  auto t0 = std::chrono::steady_clock::now();
  // FLASHJIT_ASSEMBLER=nvjitlink: nvJitLink's cubins throughout (the A/B
  // of T12, or a driver whose JIT misbehaves).
  const char *env = std::getenv("FLASHJIT_ASSEMBLER");
  if (env && std::string(env) == "nvjitlink")
    assembler = Assembler::Cubin;
  rt::CacheKey key = cubinKey(spec, config, target, source, assembler);
  CubinBuild b;
  if (auto payload = cache.load("cubin", key, b.cache)) {
    if (unpackCubin(*payload, b)) {
      b.prepareMs = msSince(t0);
      return b;
    }
    b.cache = rt::CacheStatus::Rebuilt;
  }
  GpuCompilation compiled = compileForGpu(spec, config, target, source);
  b.wholeProgram = wholeProgramWanted(compiled.ptx);
  rt::CubinResult r;
  std::optional<rt::ResourceUsage> fromFunctions;
  if (assembler == Assembler::Best && b.wholeProgram &&
      rt::CudaDriver::get().available()) {
    // Compiled now by the driver (so that its report is known, and errors
    // show here); the image is the PTX, compiled again (or from the
    // driver's compute cache) where it is loaded.
    rt::Module module(compiled.ptx);
    r.cubin.assign(compiled.ptx.begin(), compiled.ptx.end());
    r.infoLog = module.jitInfoLog();
    // The driver's compute cache answers without ptxas's report: then the
    // loaded functions' own attributes (local memory, counted as stores:
    // the spills' upper bound).
    if (rt::parseResourceUsage(r.infoLog).registers < 0) {
      fromFunctions.emplace();
      for (const KernelLaunch &k : compiled.kernels) {
        auto [regs, local] = module.resources(k.name);
        fromFunctions->registers = std::max(fromFunctions->registers, regs);
        fromFunctions->spillStoresBytes =
            std::max(fromFunctions->spillStoresBytes, local);
      }
    }
  } else {
    r = rt::ptxToCubin(compiled.ptx, target.arch);
  }
  rt::ResourceUsage use =
      fromFunctions ? *fromFunctions : rt::parseResourceUsage(r.infoLog);
  b.image.cubin = std::move(r.cubin);
  b.image.kernels = std::move(compiled.kernels);
  b.registers = use.registers;
  b.spillBytes = use.spillStoresBytes + use.spillLoadsBytes;
  cache.store("cubin", key, packCubin(b));
  b.prepareMs = msSince(t0);
  return b;
}

std::optional<TileConfig> loadTunedConfig(const AttentionSpec &spec,
                                          const Problem &p,
                                          const rt::DeviceInfo &gpu,
                                          rt::DiskCache &cache) {
  rt::CacheStatus status;
  auto payload = cache.load("tuning", tuningKey(spec, p, gpu), status);
  if (!payload)
    return std::nullopt;
  TileConfig tuned;
  std::string text(payload->begin(), payload->end());
  int end = 0;
  if (std::sscanf(text.c_str(),
                  "{\"block_m\":%ld,\"block_n\":%ld,\"warps\":%ld,"
                  "\"stages\":%ld%n",
                  &tuned.blockM, &tuned.blockN, &tuned.warps, &tuned.stages,
                  &end) != 4)
    return std::nullopt;
  // The rest: "}" or a split-KV tiling's ",\"splits\":..." (toJson), then
  // the flags set ("overlap_softmax", "persistent", "query_tma",
  // "output_tma", in that
  // order), read here from the last.
  std::string rest = text.substr(size_t(end));
  auto takeFlag = [&](const char *name, bool &flag) {
    const std::string tail = fmt::format(",\"{}\":true}}", name);
    if (rest.size() >= tail.size() &&
        rest.compare(rest.size() - tail.size(), tail.size(), tail) == 0) {
      flag = true;
      rest = rest.substr(0, rest.size() - tail.size()) + "}";
    }
  };
  takeFlag("output_tma", tuned.outputByTensorMap);
  takeFlag("query_tma", tuned.queryByTensorMap);
  takeFlag("persistent", tuned.persistent);
  takeFlag("overlap_softmax", tuned.overlapSoftmax);
  long splits = 0;
  int used = 0;
  if (rest == ",\"splits\":\"auto\"}")
    tuned.splits = TileConfig::kAutoSplits;
  else if (std::sscanf(rest.c_str(), ",\"splits\":%ld}%n", &splits, &used) ==
               1 &&
           size_t(used) == rest.size() && splits > 0)
    tuned.splits = splits;
  else if (rest != "}")
    return std::nullopt; // a corrupt entry: tuned again
  return tuned;
}

std::pair<double, double> timeLaunches(const std::function<void()> &launch,
                                       int64_t repeats, bool coldL2) {
  for (int i = 0; i < 3; ++i)
    launch();
  std::optional<rt::DeviceBuffer> flush;
  std::size_t flushBytes = 0;
  rt::CudaDriver &driver = rt::CudaDriver::get();
  if (coldL2) {
    const int l2Bytes =
        rt::queryDevice(driver.currentDevice(), driver).l2CacheBytes;
    flushBytes = std::max<std::size_t>(2 * std::size_t(std::max(l2Bytes, 0)),
                                       std::size_t(64) << 20);
    flush.emplace(flushBytes, driver);
  }
  std::vector<double> times;
  rt::EventTimer timer;
  for (int64_t i = 0; i < repeats; ++i) {
    if (flush)
      rt::zeroAsync(flush->ptr(), flushBytes, nullptr, driver);
    timer.start(nullptr);
    launch();
    timer.stop(nullptr);
    times.push_back(timer.elapsedMs());
  }
  if (times.empty())
    return {0.0, 0.0};
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

std::pair<double, double> timeLaunches(const rt::ForwardKernel &kernel,
                                       const Problem &p,
                                       const rt::ForwardArgs &args,
                                       int64_t repeats, bool coldL2) {
  return timeLaunches([&] { kernel.launch(p, args, nullptr); }, repeats,
                      coldL2);
}

std::pair<double, double> timeBackwardLaunches(const rt::BackwardKernel &kernel,
                                               const Problem &p,
                                               const rt::BackwardArgs &args,
                                               int64_t repeats, bool coldL2) {
  return timeLaunches([&] { kernel.launch(p, args, nullptr); }, repeats,
                      coldL2);
}

rt::TuneLimits tuneLimits(const rt::DeviceInfo &gpu) {
  rt::TuneLimits limits;
  limits.maxSharedBytes = gpu.maxSharedPerBlockOptin;
  limits.maxThreadsPerBlock = gpu.maxThreadsPerBlock;
  limits.registersPerBlock = gpu.regsPerBlock;
  GpuTarget target;
  target.arch = gpu.targetArch();
  limits.warpgroupMma = usesWgmma(target);
  limits.kvRing = usesKvRing(target);
  return limits;
}

namespace {

/// Times one compiled candidate: loads \p image for \p config, returns the
/// median ms of a few launches on the real inputs.
using TimeCubinFn = std::function<double(const TileConfig &config,
                                         const KernelImage &image)>;

/// The tuning glue shared by the forward and the backward: compiles the
/// candidates through the cubin cache, times them with \p time, stores the
/// winner under (spec, problem class, GPU).
rt::TuneResult tuneAndStore(const AttentionSpec &spec, const Problem &p,
                            const std::vector<TileConfig> &candidates,
                            const TimeCubinFn &time, const GpuTarget &target,
                            const rt::DeviceInfo &gpu, rt::DiskCache &cache,
                            const rt::ProgressFn &progress) {
  rt::TuneResult result = rt::autotune(
      candidates,
      [&](const TileConfig &c, int &regs, int &spill) {
        CubinBuild b = buildCubin(spec, c, target, cache);
        regs = b.registers;
        spill = b.spillBytes;
        return b.image;
      },
      time, progress);
  std::string text = result.best.toJson();
  cache.store("tuning", tuningKey(spec, p, gpu),
              std::vector<char>(text.begin(), text.end()));
  return result;
}

/// Launches per candidate when tuning (the median is kept).
constexpr int64_t kTuneRepeats = 5;

} // namespace

rt::TuneResult tuneOnDevice(const AttentionSpec &spec, const Problem &p,
                            const rt::ForwardArgs &args,
                            const GpuTarget &target, const rt::DeviceInfo &gpu,
                            rt::DiskCache &cache,
                            const rt::ProgressFn &progress) {
  if (spec.direction != Direction::Forward)
    throw SpecError("tuneOnDevice: a backward spec is tuned by "
                    "tuneBackwardOnDevice");
  std::vector<TileConfig> candidates =
      rt::tuningCandidates(spec, tuneLimits(gpu));
  if (std::optional<TileConfig> decode = decodeGpuConfig(spec, p)) {
    // Decode and short queries: the split-KV tilings first (splits chosen
    // at launch), one warp on 16 rows and 4 on 64 (bench/NOTES.md, T11).
    TileConfig wide = *decode;
    wide.blockM = 64;
    wide.warps = 4;
    candidates.insert(candidates.begin(), *decode);
    if (wide.blockM != decode->blockM)
      candidates.insert(candidates.begin() + 1, wide);
  }
  return tuneAndStore(
      spec, p, candidates,
      [&](const TileConfig &config, const KernelImage &image) {
        rt::ForwardKernel kernel(image, spec, target.copyBytes, config);
        return timeLaunches(kernel, p, args, kTuneRepeats).first;
      },
      target, gpu, cache, progress);
}

rt::TuneResult tuneBackwardOnDevice(const AttentionSpec &spec, const Problem &p,
                                    const rt::BackwardArgs &args,
                                    const GpuTarget &target,
                                    const rt::DeviceInfo &gpu,
                                    rt::DiskCache &cache,
                                    const rt::ProgressFn &progress) {
  if (spec.direction != Direction::Backward)
    throw SpecError("tuneBackwardOnDevice: the spec is not a backward one");
  return tuneAndStore(
      spec, p, rt::backwardTuningCandidates(spec, tuneLimits(gpu)),
      [&](const TileConfig &, const KernelImage &image) {
        rt::BackwardKernel kernel(image, spec, target.copyBytes);
        return timeBackwardLaunches(kernel, p, args, kTuneRepeats).first;
      },
      target, gpu, cache, progress);
}

} // namespace flashjit::engine
