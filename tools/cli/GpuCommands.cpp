//===- GpuCommands.cpp - The CLI's GPU side -------------------------------===//

#include "tools/cli/GpuCommands.h"
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

namespace {

using engine::msSince;

/// A host problem's tensors on the device; q, k, v views of one host buffer
/// share one device buffer.
struct DeviceProblem {
  std::vector<std::pair<const std::vector<uint16_t> *, rt::DeviceBuffer>> bufs;
  rt::DeviceBuffer o, lse, counts, indices;
  rt::ForwardArgs args;

  rt::DeviceTensor map(const HalfTensor &t) {
    auto it = std::find_if(bufs.begin(), bufs.end(),
                           [&](auto &e) { return e.first == t.buffer.get(); });
    if (it == bufs.end()) {
      rt::DeviceBuffer d(t.buffer->size() * 2);
      d.upload(t.buffer->data(), t.buffer->size() * 2);
      bufs.emplace_back(t.buffer.get(), std::move(d));
      it = bufs.end() - 1;
    }
    return {it->second.ptr() + CUdeviceptr(t.offset * 2), t.strides};
  }

  DeviceProblem(const AttentionData &data, const BlockSparseLayout *layout) {
    args.q = map(data.q);
    args.k = map(data.k);
    args.v = map(data.v);
    o = rt::DeviceBuffer(data.o.buffer->size() * 2);
    lse = rt::DeviceBuffer(data.lse.size() * 4);
    args.o = {o.ptr(), data.o.strides};
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
  }
  /// NaN in bf16, fp16 and fp32: an element the kernel skips fails.
  void poison() {
    o.memset8(0xff);
    lse.memset8(0xff);
  }
};

} // namespace

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

double forwardFlops(const AttentionSpec &spec, const Problem &p) {
  double f = 4.0 * double(p.batch) * double(p.heads) * double(p.seqLenQ) *
             double(p.seqLenKV) * double(spec.headDimQK + spec.headDimV) / 2;
  return spec.mask == MaskKind::Causal ? f / 2 : f;
}

GpuRunResult runOnGpu(const CliOptions &o, AttentionData &data,
                      const BlockSparseLayout *layout, int64_t repeats,
                      bool tune) {
  // nvJitLink (~100 MB) loads on a helper thread while the driver starts:
  // the cubin cache key names its version.
  auto nvJitLinkLoaded = std::async(std::launch::async, [] {
    try {
      rt::nvJitLinkVersionString();
    } catch (const std::exception &) {
      // Reported when a compile needs it.
    }
  });
  auto &driver = rt::CudaDriver::get();
  driver.requireAvailable();
  driver.ensureContext(0);
  const AttentionSpec &spec = o.spec;
  const Problem &p = o.problem;
  rt::DeviceInfo info = rt::queryDevice(0);
  rt::DiskCache cache;

  DeviceProblem dev(data, layout);
  nvJitLinkLoaded.wait();
  GpuRunResult r;
  r.copyBytes = rt::chooseCopyBytes(dev.args);
  GpuTarget target = resolveTarget(o, r.copyBytes);
  r.arch = target.arch;

  // The config: flags, else a tuning result for this GPU and problem class
  // (tuning now if asked), else the heuristic.
  r.config = o.config;
  r.configSource = o.configFromFlags ? "flags" : "heuristic";
  if (tune) {
    bool verbose = !o.json || std::getenv("FLASHJIT_PRINT_AUTOTUNING");
    rt::TuneResult result = engine::tuneOnDevice(
        spec, p, dev.args, target, info, cache,
        [&](size_t i, size_t n, const rt::TunedCandidate &c) {
          if (!verbose)
            return;
          if (c.error.empty())
            fmt::print(stderr,
                       "tune: candidate {} of {}: {}x{} {} warps: "
                       "{:.4f} ms\n",
                       i + 1, n, c.config.blockM, c.config.blockN,
                       c.config.warps, c.ms);
          else
            fmt::print(stderr,
                       "tune: candidate {} of {}: {}x{} {} warps: "
                       "failed\n",
                       i + 1, n, c.config.blockM, c.config.blockN,
                       c.config.warps);
        });
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
    if (!o.configFromFlags) {
      r.config = result.best;
      r.configSource = "tuned";
    }
  } else if (!o.configFromFlags) {
    if (auto tuned = engine::loadTunedConfig(spec, p, info, cache)) {
      r.config = *tuned;
      r.configSource = "tuned";
    }
  }
  std::string problem =
      gpuConfigProblem(spec, r.config, info.maxSharedPerBlockOptin);
  if (!problem.empty())
    throw SpecError(problem);

  r.build = engine::buildCubin(spec, r.config, target, cache);
  r.compileMs = r.build.prepareMs;
  auto t0 = std::chrono::steady_clock::now();
  rt::ForwardKernel kernel(r.build.cubin, spec, r.config, r.copyBytes);
  r.moduleLoadMs = msSince(t0);

  // The checked launch: on poisoned outputs.
  dev.poison();
  kernel.launch(p, dev.args, nullptr);
  driver.synchronize();
  dev.o.download(data.o.buffer->data(), data.o.buffer->size() * 2);
  dev.lse.download(data.lse.data(), data.lse.size() * 4);
  std::tie(r.medianMs, r.minMs) =
      engine::timeLaunches(kernel, p, dev.args, repeats);
  return r;
}

int runCacheCommand(const CliOptions &o) {
  rt::DiskCache cache;
  const std::string &verb = o.cacheVerb;
  if (verb == "path") {
    fmt::print("{}\n", cache.directory());
  } else if (verb == "clear") {
    size_t n = cache.clear();
    fmt::print("removed {} entries from {}\n", n, cache.directory());
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
