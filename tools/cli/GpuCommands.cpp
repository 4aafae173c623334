//===- GpuCommands.cpp - The CLI's GPU side -------------------------------===//

#include "tools/cli/GpuCommands.h"
#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "runtime/AttentionLauncher.h"
#include "runtime/CudaDriver.h"
#include "runtime/Error.h"
#include "runtime/NvJitLink.h"
#include "tools/engine/Stopwatch.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fmt/format.h>
#include <future>

namespace flashjit::cli {

using engine::msSince;

bool gpuFound() {
  auto &driver = rt::CudaDriver::get();
  if (!driver.available())
    return false;
  try {
    return driver.deviceCount() > 0;
  } catch (const rt::RuntimeError &) {
    return false;
  }
}

Device resolveDevice(const CliOptions &o) {
  auto &driver = rt::CudaDriver::get();
  if (o.device == Device::Cuda) {
    driver.requireAvailable(); // "no CUDA driver found ..." -> exit 3
    return Device::Cuda;
  }
  if (o.device == Device::Cpu)
    return Device::Cpu;
  if (gpuFound())
    return Device::Cuda;
  fmt::print(stderr, "note: {}; running on the CPU (interpreter mode)\n",
             driver.available() ? "no CUDA device found"
                                : "no CUDA driver found");
  return Device::Cpu;
}

GpuTarget resolveTarget(const CliOptions &o, int64_t copyBytes) {
  GpuTarget t;
  t.copyBytes = copyBytes;
  if (gpuFound()) {
    rt::DeviceInfo info = rt::queryDevice(0);
    t.arch = info.targetArch();
    t.driverVersion = info.driverVersion;
  }
  if (!o.target.empty())
    t.arch = o.target;
  return t;
}

TileConfig targetDefaultTiling(const AttentionSpec &spec,
                               const GpuTarget &target) {
  return defaultGpuConfig(spec, usesWgmma(target), usesKvRing(target));
}

TileConfig deviceDefaultTiling(const AttentionSpec &spec, const Problem &p,
                               const GpuTarget &target) {
  return decodeGpuConfig(spec, p).value_or(targetDefaultTiling(spec, target));
}

GpuSession::GpuSession() {
  nvJitLinkLoaded = std::async(std::launch::async, [] {
    try {
      rt::nvJitLinkVersionString();
    } catch (const std::exception &) {
      // Reported when a compile needs it.
    }
  });
  auto &driver = rt::CudaDriver::get();
  driver.requireAvailable();
  driver.ensureContext(0);
  info = rt::queryDevice(0);
}

GpuTarget GpuSession::target(const CliOptions &o, int64_t copyBytes) {
  nvJitLinkLoaded.wait();
  return resolveTarget(o, copyBytes);
}

rt::DeviceBuffer &DeviceTensors::buffer(const HalfTensor &t) {
  auto it = std::find_if(bufs.begin(), bufs.end(),
                         [&](auto &e) { return e.first == t.buffer.get(); });
  if (it == bufs.end())
    throw std::logic_error("DeviceTensors: tensor not mapped");
  return it->second;
}

rt::DeviceTensor DeviceTensors::map(const HalfTensor &t, bool upload) {
  auto it = std::find_if(bufs.begin(), bufs.end(),
                         [&](auto &e) { return e.first == t.buffer.get(); });
  if (it == bufs.end()) {
    rt::DeviceBuffer d(t.buffer->size() * 2);
    if (upload)
      d.upload(t.buffer->data(), t.buffer->size() * 2);
    bufs.emplace_back(t.buffer.get(), std::move(d));
    it = bufs.end() - 1;
  }
  return {it->second.ptr() + CUdeviceptr(t.offset * 2), t.strides};
}

void DeviceTensors::poison(std::initializer_list<const HalfTensor *> tensors) {
  for (const HalfTensor *t : tensors)
    buffer(*t).memset8(0xff);
}

void DeviceTensors::download(
    std::initializer_list<const HalfTensor *> tensors) {
  std::vector<const std::vector<uint16_t> *> done;
  for (const HalfTensor *t : tensors) {
    if (std::find(done.begin(), done.end(), t->buffer.get()) != done.end())
      continue;
    buffer(*t).download(t->buffer->data(), t->buffer->size() * 2);
    done.push_back(t->buffer.get());
  }
}

DeviceProblem::DeviceProblem(const AttentionData &data,
                             const BlockSparseLayout *layout) {
  args.q = tensors.map(data.q);
  args.k = tensors.map(data.k);
  args.v = tensors.map(data.v);
  args.o = tensors.map(data.o, /*upload=*/false);
  lse = rt::DeviceBuffer(data.lse.size() * 4);
  args.lse = lse.ptr();
  if (layout) {
    counts = rt::DeviceBuffer(layout->counts.size() * 4);
    counts.uploadVector(layout->counts);
    indices = rt::DeviceBuffer(layout->indices.size() * 4);
    indices.uploadVector(layout->indices);
    args.counts = counts.ptr();
    args.indices = indices.ptr();
    args.countStrides = layout->countStrides();
    args.indexStrides = layout->indexStrides();
  }
  if (!data.cuSeqQ.empty()) {
    cuSeqQ = rt::DeviceBuffer(data.cuSeqQ.size() * 4);
    cuSeqQ.uploadVector(data.cuSeqQ);
    cuSeqKV = rt::DeviceBuffer(data.cuSeqKV.size() * 4);
    cuSeqKV.uploadVector(data.cuSeqKV);
    args.cuSeqQ = cuSeqQ.ptr();
    args.cuSeqKV = cuSeqKV.ptr();
  }
  if (data.captures.size() > args.captures.size())
    throw SpecError(fmt::format("{} captured tensors, at most {}",
                                data.captures.size(), args.captures.size()));
  for (const std::vector<float> &t : data.captures) {
    if (t.empty())
      throw SpecError("a captured tensor is empty");
    captures.emplace_back(t.size() * 4);
    captures.back().uploadVector(t);
    args.captures[captures.size() - 1] = captures.back().ptr();
  }
}

void DeviceProblem::poison(const AttentionData &data) {
  tensors.poison({&data.o});
  lse.memset8(0xff); // NaN in fp32 too
}

void DeviceProblem::download(AttentionData &data) {
  tensors.download({&data.o});
  lse.download(data.lse.data(), data.lse.size() * 4);
}

double forwardFlops(const AttentionSpec &spec, const Problem &p,
                    const AttentionData *data) {
  // Query-key pairs: B * Nq * Nkv, or a varlen batch's sum over sequences.
  double pairs = double(p.batch) * double(p.seqLenQ) * double(p.seqLenKV);
  if (spec.varlen && data && data->cuSeqQ.size() == size_t(p.batch + 1)) {
    pairs = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      pairs += double(data->cuSeqQ[size_t(b + 1)] - data->cuSeqQ[size_t(b)]) *
               double(data->cuSeqKV[size_t(b + 1)] - data->cuSeqKV[size_t(b)]);
  }
  double f = 4.0 * pairs * double(p.heads) *
             double(spec.headDimQK + spec.headDimV) / 2;
  return spec.mask == MaskKind::Causal ? f / 2 : f;
}

double backwardFlops(const AttentionSpec &spec, const Problem &p,
                     const AttentionData *data) {
  return 2.5 * forwardFlops(spec, p, data);
}

namespace {

/// Progress lines of a tuning run on stderr: in text mode, or with
/// FLASHJIT_PRINT_AUTOTUNING=1 under --json too.
rt::ProgressFn tuneProgress(const CliOptions &o) {
  bool verbose = !o.json || std::getenv("FLASHJIT_PRINT_AUTOTUNING");
  return [verbose](size_t i, size_t n, const rt::TunedCandidate &c) {
    if (!verbose)
      return;
    if (c.error.empty())
      fmt::print(stderr,
                 "tune: candidate {} of {}: {}x{} {} warps: {:.4f} ms\n", i + 1,
                 n, c.config.blockM, c.config.blockN, c.config.warps, c.ms);
    else
      fmt::print(stderr, "tune: candidate {} of {}: {}x{} {} warps: failed\n",
                 i + 1, n, c.config.blockM, c.config.blockN, c.config.warps);
  };
}

} // namespace

GpuRunResult prepareGpuRun(const CliOptions &o, GpuSession &session,
                           const AttentionSpec &spec, const GpuTarget &target,
                           const std::optional<TileConfig> &flags,
                           const TileConfig &fallback, const ConfigCheck &check,
                           const TuneFn &tune) {
  const Problem &p = o.problem;
  GpuRunResult r;
  r.copyBytes = target.copyBytes;
  r.arch = target.arch;
  // A kernel from --input runs with the command line's tiling (the file's
  // Br x Bc for the tile stage), never a tuned one.
  const bool fromFile = !o.source.empty() && spec.direction == o.spec.direction;
  const std::optional<TileConfig> given =
      fromFile ? std::optional<TileConfig>(o.config) : flags;
  r.config = given ? *given : fallback;
  r.configSource = given ? "flags" : "heuristic";
  if (tune) {
    rt::TuneResult result = tune(tuneProgress(o));
    r.tuneTable = rt::formatTuneTable(result);
    r.tuneTable += fmt::format("compile {:.1f} s, timing {:.1f} s\n",
                               result.compileSeconds, result.timeSeconds);
    r.tuneJson = "[";
    for (const rt::TunedCandidate &c : result.table)
      r.tuneJson += fmt::format(
          "{}{{\"config\":{},\"ms\":{},\"registers\":{},\"spill_bytes\":{}}}",
          r.tuneJson.size() > 1 ? "," : "", c.config.toJson(),
          c.error.empty() ? fmt::format("{:.5f}", c.ms) : "null", c.registers,
          c.spillBytes);
    r.tuneJson +=
        fmt::format("],\"tune_compile_s\":{:.3f},\"tune_time_s\":{:.3f}",
                    result.compileSeconds, result.timeSeconds);
    if (!given) {
      r.config = result.best;
      r.configSource = "tuned";
    }
  } else if (!given) {
    if (auto tuned =
            engine::loadTunedConfig(spec, p, session.info, session.cache)) {
      r.config = *tuned;
      r.configSource = "tuned";
    }
  }
  std::string problem = check(r.config);
  if (!problem.empty())
    throw SpecError(problem);
  // The kernel read from --input (the one of its direction: a backward
  // run's forward is flashjit's own).
  const KernelSource &source =
      spec.direction == o.spec.direction ? o.source : o.forwardSource;
  r.build = engine::buildCubin(spec, r.config, target, session.cache, source);
  r.compileMs = r.build.prepareMs;
  return r;
}

GpuRunResult runForwardOnDevice(const CliOptions &o, GpuSession &session,
                                const AttentionSpec &spec, DeviceProblem &dev,
                                AttentionData &data, int64_t repeats, bool tune,
                                bool useFlags) {
  const Problem &p = o.problem;
  GpuTarget target = session.target(o, rt::chooseCopyBytes(dev.args));
  TuneFn tuneFn;
  if (tune)
    tuneFn = [&](const rt::ProgressFn &progress) {
      return engine::tuneOnDevice(spec, p, dev.args, target, session.info,
                                  session.cache, progress);
    };
  const TileConfig fallback = deviceDefaultTiling(spec, p, target);
  const std::optional<TileConfig> flags =
      useFlags ? flagTiling(o, fallback) : std::nullopt;
  GpuRunResult r = prepareGpuRun(
      o, session, spec, target, flags, fallback,
      [&](const TileConfig &c) {
        return gpuConfigProblem(spec, c, session.info.maxSharedPerBlockOptin,
                                usesKvRing(target));
      },
      tuneFn);
  auto t0 = std::chrono::steady_clock::now();
  rt::ForwardKernel kernel(r.build.image, spec, r.copyBytes, r.config);
  r.moduleLoadMs = msSince(t0);
  r.kvSplits = kernel.splitsFor(p);
  r.tensorMaps = int64_t(kernel.recorded().tensorMaps.size());
  r.tileSchedule = kernel.tileSchedule(p, kernel.launchGrid(p, r.kvSplits)[0],
                                       nullptr) != nullptr;

  // The checked launch: on poisoned outputs.
  dev.poison(data);
  kernel.launch(p, dev.args, nullptr);
  rt::CudaDriver::get().synchronize();
  dev.download(data);
  if (repeats > 0)
    std::tie(r.medianMs, r.minMs) =
        engine::timeLaunches(kernel, p, dev.args, repeats, o.coldL2);
  return r;
}

GpuRunResult runOnGpu(const CliOptions &o, AttentionData &data,
                      const BlockSparseLayout *layout, int64_t repeats,
                      bool tune) {
  GpuSession session;
  DeviceProblem dev(data, layout);
  return runForwardOnDevice(o, session, o.spec, dev, data, repeats, tune,
                            /*useFlags=*/true);
}

std::string gpuJsonFields(const GpuRunResult &r, double tflops, int64_t repeats,
                          bool coldL2) {
  int64_t sharedBytes = 0;
  for (const KernelLaunch &k : r.build.image.kernels)
    sharedBytes = std::max(sharedBytes, k.sharedBytes);
  return fmt::format(",\"arch\":\"{}\",\"copy_bytes\":{},\"registers\":{},"
                     "\"spill_bytes\":{},\"shared_bytes\":{},"
                     "\"min_ms\":{:.4f},\"tflops\":{:.2f},"
                     "\"repeats\":{},\"cold_l2\":{},\"cache\":\"{}\","
                     "\"config_source\":"
                     "\"{}\",\"prepare_ms\":{:.3f},\"module_load_ms\":{:.3f}",
                     r.arch, r.copyBytes, r.build.registers, r.build.spillBytes,
                     sharedBytes, r.minMs, tflops, repeats, coldL2,
                     rt::toString(r.build.cache), r.configSource,
                     r.build.prepareMs, r.moduleLoadMs) +
         (r.tuneJson.empty() ? "" : ",\"candidates\":" + r.tuneJson);
}

std::string gpuTextSummary(const GpuRunResult &r, double tflops) {
  return fmt::format(", {:.1f} TFLOP/s on {}; {} registers, {} bytes spilled; "
                     "config {}, cubin cache {}",
                     tflops, r.arch, r.build.registers, r.build.spillBytes,
                     r.configSource, rt::toString(r.build.cache));
}

void printTuneOutcome(const CliOptions &o, const GpuRunResult &r,
                      const Problem &p) {
  if (r.tuneTable.empty() || o.json)
    return;
  fmt::print("{}winner: {}x{}, {} warps (stored for {} on this GPU)\n",
             r.tuneTable, r.config.blockM, r.config.blockN, r.config.warps,
             rt::problemClass(p));
}

int runCacheCommand(const CliOptions &o) {
  rt::DiskCache cache;
  const std::string &verb = o.cacheVerb;
  if (verb == "path") {
    fmt::print("{}\n", cache.directory());
  } else if (verb == "clear") {
    std::vector<std::string> failures;
    size_t n = cache.clear(&failures);
    fmt::print("removed {} entries from {}\n", n, cache.directory());
    if (!failures.empty()) {
      for (const std::string &f : failures)
        fmt::print(stderr, "flashjit: error: cache clear: {}\n", f);
      return 2; // what is left would block its key
    }
  } else if (verb == "list") {
    auto entries = cache.list();
    for (const auto &e : entries)
      fmt::print("{:<7} {:>9} {}  {}\n", e.kind, e.bytes,
                 e.valid ? "ok     " : "CORRUPT", e.path);
    fmt::print("{} entries in {}\n", entries.size(), cache.directory());
  } else {
    throw SpecError(fmt::format(
        "cache: unknown action '{}' (expected list, clear or path)", verb));
  }
  return 0;
}

} // namespace flashjit::cli
