//===- KernelProvider.cpp - Cubins and tile configs, cached ---------------===//

#include "tools/engine/KernelProvider.h"
#include "compiler/Target/PTXEmitter.h"
#include "runtime/CudaDriver.h"
#include "runtime/NvJitLink.h"
#include "tools/engine/Stopwatch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>

namespace flashjit::engine {

namespace {

/// The cubin cache key: everything that changes the bytes.
rt::CacheKey cubinKey(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target) {
  rt::CacheKey key;
  key.add("version", FLASHJIT_VERSION)
      .add("pipeline", gpuPipelineText(config, target.copyBytes))
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
  return key;
}

/// Cached cubins start with one line "registers=R spill=S".
std::vector<char> packCubin(const CubinBuild &b) {
  std::string head =
      fmt::format("registers={} spill={}\n", b.registers, b.spillBytes);
  std::vector<char> out(head.begin(), head.end());
  out.insert(out.end(), b.cubin.begin(), b.cubin.end());
  return out;
}

bool unpackCubin(const std::vector<char> &payload, CubinBuild &b) {
  auto nl = std::find(payload.begin(), payload.end(), '\n');
  if (nl == payload.end())
    return false;
  std::string head(payload.begin(), nl);
  if (std::sscanf(head.c_str(), "registers=%d spill=%d", &b.registers,
                  &b.spillBytes) != 2)
    return false;
  b.cubin.assign(nl + 1, payload.end());
  return b.cubin.size() > 4;
}

} // namespace

rt::CacheKey tuningKey(const AttentionSpec &spec, const Problem &p,
                       const rt::DeviceInfo &info) {
  rt::CacheKey key;
  key.add("version", FLASHJIT_VERSION)
      .add("spec", spec.toJson())
      .add("problem_class", rt::problemClass(p))
      .add("gpu_name", info.name)
      .add("gpu_cc", fmt::format("{}.{}", info.ccMajor, info.ccMinor))
      .add("gpu_sms", std::to_string(info.smCount))
      .add("driver", std::to_string(info.driverVersion));
  return key;
}

CubinBuild buildCubin(const AttentionSpec &spec, const TileConfig &config,
                      const GpuTarget &target, rt::DiskCache &cache) {
  auto t0 = std::chrono::steady_clock::now();
  rt::CacheKey key = cubinKey(spec, config, target);
  CubinBuild b;
  if (auto payload = cache.load("cubin", key, b.cache)) {
    if (unpackCubin(*payload, b)) {
      b.prepareMs = msSince(t0);
      return b;
    }
    b.cache = rt::CacheStatus::Rebuilt;
  }
  std::string ptx = compileToPtx(spec, config, target);
  rt::CubinResult r = rt::ptxToCubin(ptx, target.arch);
  rt::ResourceUsage use = rt::parseResourceUsage(r.infoLog);
  b.cubin = std::move(r.cubin);
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
  if (std::sscanf(text.c_str(),
                  "{\"block_m\":%ld,\"block_n\":%ld,\"warps\":%ld,"
                  "\"stages\":%ld}",
                  &tuned.blockM, &tuned.blockN, &tuned.warps,
                  &tuned.stages) != 4)
    return std::nullopt;
  return tuned;
}

/// Median of \p repeats launches, each timed alone, after a warm-up.
std::pair<double, double> timeLaunches(const rt::ForwardKernel &kernel,
                                       const Problem &p,
                                       const rt::ForwardArgs &args,
                                       int64_t repeats) {
  for (int i = 0; i < 3; ++i)
    kernel.launch(p, args, nullptr);
  std::vector<double> times;
  rt::EventTimer timer;
  for (int64_t i = 0; i < repeats; ++i) {
    timer.start(nullptr);
    kernel.launch(p, args, nullptr);
    timer.stop(nullptr);
    times.push_back(timer.elapsedMs());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

rt::TuneResult tuneOnDevice(const AttentionSpec &spec, const Problem &p,
                            const rt::ForwardArgs &args,
                            const GpuTarget &target, const rt::DeviceInfo &gpu,
                            rt::DiskCache &cache,
                            const rt::ProgressFn &progress) {
  rt::TuneLimits limits;
  limits.maxSharedBytes = gpu.maxSharedPerBlockOptin;
  limits.maxThreadsPerBlock = gpu.maxThreadsPerBlock;
  limits.registersPerBlock = gpu.regsPerBlock;
  rt::TuneResult result = rt::autotune(
      rt::tuningCandidates(spec, limits),
      [&](const TileConfig &c, int &regs, int &spill) {
        CubinBuild b = buildCubin(spec, c, target, cache);
        regs = b.registers;
        spill = b.spillBytes;
        return b.cubin;
      },
      [&](const TileConfig &c, const std::vector<char> &cubin) {
        rt::ForwardKernel kernel(cubin, spec, c, target.copyBytes);
        return timeLaunches(kernel, p, args, 5).first;
      },
      progress);
  std::string text = result.best.toJson();
  cache.store("tuning", tuningKey(spec, p, gpu),
              std::vector<char>(text.begin(), text.end()));
  return result;
}

} // namespace flashjit::engine
