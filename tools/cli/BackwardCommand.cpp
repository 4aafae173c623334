//===- BackwardCommand.cpp - `flashjit run --backward` --------------------===//

#include "tools/cli/BackwardCommand.h"
#include "compiler/Compiler.h"
#include "kernels/GpuDefaults.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HostTensor.h"
#include "kernels/Varlen.h"
#include "runtime/BackwardLauncher.h"
#include "runtime/CudaDriver.h"
#include "tools/cli/GpuCommands.h"
#include "tools/cli/MaskBlocksRun.h"
#include "tools/engine/Stopwatch.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <optional>
#include <random>

namespace flashjit::cli {
namespace {

using engine::msSince;

/// --dump-io of a backward run: the forward's tensors plus do, dq, dk, dv.
void dumpBackwardIO(const std::string &dir, const AttentionSpec &spec,
                    const Problem &p, const AttentionData &d,
                    const AttentionGrads &g, const BlockSparseLayout *layout) {
  dumpForwardIO(dir, spec, p, d, layout);
  writeHalfNpy(dir + "/do.npy", spec.dtype, g.dO);
  writeHalfNpy(dir + "/dq.npy", spec.dtype, g.dq);
  writeHalfNpy(dir + "/dk.npy", spec.dtype, g.dk);
  writeHalfNpy(dir + "/dv.npy", spec.dtype, g.dv);
}

/// JSON has no infinity: a NaN reports 1e30.
double reportable(double e) { return std::isfinite(e) ? e : 1e30; }

/// The backward's tensors on the device beside the forward's (\p fwd): dO
/// uploaded, dq, dk, dv allocated (views of one packed gradient share one
/// buffer), the delta workspace, and for a block-sparse spec the layout's
/// KV-major transpose next to the forward's layout.
struct DeviceBackward {
  /// captureWords: deterministic captured gradients' fixed-point words.
  rt::DeviceBuffer delta, kvCounts, kvIndices, captureWords;
  /// Per captured tensor, its zeroed gradient buffer (empty where the
  /// spec's captureGrads does not name it).
  std::vector<rt::DeviceBuffer> captureGrads;
  rt::BackwardArgs args;

  DeviceBackward(DeviceProblem &fwd, const AttentionSpec &spec,
                 const Problem &p, const AttentionGrads &g,
                 const BlockSparseLayout *layout) {
    args.q = fwd.args.q;
    args.k = fwd.args.k;
    args.v = fwd.args.v;
    args.o = fwd.args.o;
    args.lse = fwd.args.lse;
    args.captures = fwd.args.captures;
    args.cuSeqQ = fwd.args.cuSeqQ;
    args.cuSeqKV = fwd.args.cuSeqKV;
    captureGrads.resize(g.captureGrads.size());
    for (size_t c = 0; c < g.captureGrads.size(); ++c) {
      if (g.captureGrads[c].empty())
        continue;
      captureGrads[c] = rt::DeviceBuffer(g.captureGrads[c].size() * 4);
      captureGrads[c].uploadVector(g.captureGrads[c]);
      args.captureGrads[c] = captureGrads[c].ptr();
      args.captureSizes[c] = int64_t(g.captureGrads[c].size());
    }
    if (abi::bwd::fixedPointCaptureGrads(spec)) {
      captureWords = rt::DeviceBuffer(size_t(
          abi::bwd::captureWordLayout(spec, args.captureSizes.data()).bytes));
      args.captureWords = captureWords.ptr();
    }
    args.dO = fwd.tensors.map(g.dO);
    args.dq = fwd.tensors.map(g.dq, /*upload=*/false);
    args.dk = fwd.tensors.map(g.dk, /*upload=*/false);
    args.dv = fwd.tensors.map(g.dv, /*upload=*/false);
    delta = rt::DeviceBuffer(size_t(backwardWorkspaceBytes(spec, p)));
    args.delta = delta.ptr();
    if (layout) {
      args.counts = fwd.args.counts;
      args.indices = fwd.args.indices;
      args.countStrides = fwd.args.countStrides;
      args.indexStrides = fwd.args.indexStrides;
      BlockSparseLayout t = layout->transposed();
      kvCounts = rt::DeviceBuffer(t.counts.size() * 4);
      kvCounts.uploadVector(t.counts);
      kvIndices = rt::DeviceBuffer(t.indices.size() * 4);
      kvIndices.uploadVector(t.indices);
      args.kvCounts = kvCounts.ptr();
      args.kvIndices = kvIndices.ptr();
      args.kvCountStrides = t.countStrides();
      args.kvIndexStrides = t.indexStrides();
    }
  }
};

/// FNV-1a (64-bit) of the bits of \p g's captured tensors' gradients, in
/// order, as a JSON string of 16 hex digits; null when there are none. Two
/// runs of one seed give the same digits where the gradients are the same
/// bits (--deterministic).
std::string capturedGradsFnv(const AttentionGrads &g) {
  uint64_t h = 0xcbf29ce484222325ull;
  bool any = false;
  for (const std::vector<float> &c : g.captureGrads)
    for (float x : c) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      for (int i = 0; i < 4; ++i) {
        h ^= (bits >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
      }
      any = true;
    }
  return any ? fmt::format("\"{:016x}\"", h) : std::string("null");
}

/// What the forward and the backward of one run measured.
struct BackwardRunResult {
  double runMs = 0, compileMs = 0;
  std::optional<double> forwardMs; ///< the CPU's; the GPU's is not timed
  std::optional<GpuRunResult> gpu, gpuForward;
};

/// The forward, then the tiled backward, on the CPU (interpreter mode).
BackwardRunResult runBackwardOnCpu(const CliOptions &o,
                                   const AttentionSpec &forwardSpec,
                                   AttentionData &data, AttentionGrads &grads,
                                   const BlockSparseLayout *layout) {
  const Problem &p = o.problem;
  BackwardRunResult r;
  auto t0 = std::chrono::steady_clock::now();
  CpuKernel::compile(forwardSpec, o.config, o.forwardSource)
      ->run(p, data, layout);
  r.forwardMs = msSince(t0);
  t0 = std::chrono::steady_clock::now();
  auto kernel = CpuBackwardKernel::compile(o.spec, o.config, o.source);
  r.compileMs = msSince(t0);
  t0 = std::chrono::steady_clock::now();
  kernel->run(p, data, grads, layout);
  r.runMs = msSince(t0);
  return r;
}

/// The forward kernel (its own tuned or default tiling: the tiling flags
/// are the backward's), then the backward's kernels on NaN-poisoned
/// gradients, once checked, then \p repeats timed launches of the backward
/// alone. O, lse and the gradients come back into \p data and \p grads.
/// With \p tune, tunes the backward first and stores the winner.
BackwardRunResult runBackwardOnGpu(const CliOptions &o,
                                   const AttentionSpec &forwardSpec,
                                   AttentionData &data, AttentionGrads &grads,
                                   const BlockSparseLayout *layout,
                                   int64_t repeats, bool tune) {
  const AttentionSpec &spec = o.spec;
  const Problem &p = o.problem;
  GpuSession session;
  DeviceProblem dev(data, layout);
  BackwardRunResult r;
  r.gpuForward = runForwardOnDevice(o, session, forwardSpec, dev, data,
                                    /*repeats=*/0, /*tune=*/false,
                                    /*useFlags=*/false);

  DeviceBackward bwd(dev, spec, p, grads, layout);
  GpuTarget target = session.target(o, rt::chooseCopyBytes(bwd.args));
  TuneFn tuneFn;
  if (tune)
    tuneFn = [&](const rt::ProgressFn &progress) {
      return engine::tuneBackwardOnDevice(
          spec, p, bwd.args, target, session.info, session.cache, progress);
    };
  GpuRunResult g = prepareGpuRun(
      o, session, spec, target,
      o.configFromFlags ? std::optional<TileConfig>(o.config) : std::nullopt,
      defaultGpuBackwardConfig(spec),
      [&](const TileConfig &c) {
        return gpuBackwardConfigProblem(spec, c,
                                        session.info.maxSharedPerBlockOptin);
      },
      tuneFn);
  auto t0 = std::chrono::steady_clock::now();
  rt::BackwardKernel kernel(g.build.image, spec, g.copyBytes);
  g.moduleLoadMs = msSince(t0);

  // The checked launch: on poisoned gradients.
  dev.tensors.poison({&grads.dq, &grads.dk, &grads.dv});
  kernel.launch(p, bwd.args, nullptr);
  rt::CudaDriver::get().synchronize();
  dev.tensors.download({&grads.dq, &grads.dk, &grads.dv});
  for (size_t c = 0; c < grads.captureGrads.size(); ++c)
    if (!grads.captureGrads[c].empty())
      bwd.captureGrads[c].download(grads.captureGrads[c].data(),
                                   grads.captureGrads[c].size() * 4);
  std::tie(g.medianMs, g.minMs) =
      engine::timeBackwardLaunches(kernel, p, bwd.args, repeats, o.coldL2);
  r.runMs = g.medianMs;
  r.compileMs = g.compileMs;
  r.gpu = std::move(g);
  return r;
}

/// The float64 check's budget: `bench` checks less (as the forward's).
double checkWork(const CliOptions &o) {
  return o.command == "bench" ? 5e8 : 4e9;
}

} // namespace

int runBackward(const CliOptions &o) {
  const bool bench = o.command == "bench", tune = o.command == "tune";
  Device device = bench || tune ? Device::Cuda : resolveDevice(o);
  if (device == Device::Cuda)
    rt::CudaDriver::get().requireAvailable();
  const AttentionSpec &spec = o.spec;
  AttentionSpec forwardSpec = spec;
  forwardSpec.direction = Direction::Forward;
  const Problem &p = o.problem;

  RandomRun inputs = makeRandomRun(o, forwardSpec);
  const uint64_t layoutSeed = inputs.layoutSeed, inputSeed = inputs.inputSeed;
  std::unique_ptr<BlockSparseLayout> layout = std::move(inputs.layout);
  AttentionData &data = inputs.data;
  std::optional<MaskBlocksRun> blocks;
  if (o.maskBlocks) {
    blocks = classifyMaskBlocks(o, forwardSpec, data, device == Device::Cuda,
                                bench ? o.repeats : 5);
    layout = std::move(blocks->layout);
  }
  // --mask-blocks: the references of the mask alone, with no layout.
  const BlockSparseLayout *checkLayout = blocks ? nullptr : layout.get();
  // dO from a stream derived from the reported input seed (replayable).
  std::mt19937_64 rng(inputSeed ^ 0x9e3779b97f4a7c15ull);
  AttentionGrads grads = makeRandomGrads(spec, p, data, rng);

  const int64_t repeats = bench ? o.repeats : 5;
  BackwardRunResult run =
      device == Device::Cuda
          ? runBackwardOnGpu(o, forwardSpec, data, grads, layout.get(), repeats,
                             tune || o.tune)
          : runBackwardOnCpu(o, forwardSpec, data, grads, layout.get());
  if (run.gpu)
    printTuneOutcome(o, *run.gpu, p);

  // The forward as the backward got it (sampled rows for large problems),
  // then the gradients.
  // A varlen batch: every sequence against its own float64 reference,
  // whole with `run`, within bench's budget with `bench`.
  ErrorReport forwardErr;
  BackwardCheck check;
  if (spec.varlen) {
    const double work = o.command == "bench" ? checkWork(o) : 1e300;
    forwardErr =
        checkVarlenForward(forwardSpec, p, data, work, nullptr, checkLayout);
    check.err =
        checkVarlenBackward(forwardSpec, p, data, grads, work, checkLayout);
    check.checkedHeads = p.batch * p.heads;
  } else {
    forwardErr = compareWithReference(
        forwardSpec, p, data,
        referenceForward(forwardSpec, p, data, checkLayout, checkWork(o)));
    check = checkBackward(spec, p, data, grads, checkLayout, checkWork(o));
  }
  const BackwardErrorReport &err = check.err;
  double bound = errorBound(spec.dtype);
  double relErr = reportable(err.relErr());
  double forwardRelErr = reportable(forwardErr.relErr());
  bool ok = relErr < bound && forwardRelErr < bound &&
            (!blocks || !blocks->checked || blocks->matches);
  if (!o.dumpDir.empty())
    dumpBackwardIO(o.dumpDir, spec, p, data, grads, layout.get());

  const char *deviceName = device == Device::Cuda ? "cuda" : "cpu";
  const TileConfig &config = run.gpu ? run.gpu->config : o.config;
  double tflops =
      run.gpu ? backwardFlops(spec, p, &data) / (run.runMs * 1e-3) / 1e12 : 0.0;
  auto optional = [](const std::optional<int64_t> &v) {
    return v ? std::to_string(*v) : std::string("null");
  };
  if (o.json) {
    std::string gpuFields = ",\"cache\":null";
    if (run.gpu) {
      GpuBackwardGeometry geo = gpuBackwardGeometry(spec, config);
      GpuTarget target;
      target.arch = run.gpu->arch;
      const bool wgmma = usesWgmma(target) && geo.wgmmaShape;
      gpuFields =
          gpuJsonFields(*run.gpu, tflops, repeats, o.coldL2) +
          fmt::format(",\"forward_config\":{},"
                      "\"forward_config_source\":\"{}\",\"kv_mma\":\"{}\"",
                      run.gpuForward->config.toJson(),
                      run.gpuForward->configSource,
                      wgmma ? "wgmma" : "mma.sync");
    }
    fmt::print(
        "{{\"spec\":{},\"config\":{},\"problem\":{},\"device\":\"{}\","
        "\"rel_err\":{:.6e},\"dq_rel_err\":{:.6e},\"dk_rel_err\":{:.6e},"
        "\"dv_rel_err\":{:.6e},\"capture_grads_rel_err\":{},"
        "\"capture_grads_fnv\":{},"
        "\"nan_count\":{},\"forward_rel_err\":{:.6e},"
        "\"bound\":{},\"ok\":{},\"dq_mode\":\"{}\","
        "\"deterministic\":{},\"checked_heads\":{},\"checked_rows\":{},"
        "\"checked_keys\":{},\"time_ms\":{:.4f},\"forward_time_ms\":{},"
        "\"compile_ms\":{:.3f},\"input_seed\":{},\"layout_seed\":{},"
        "\"density\":{}{}{}}}\n",
        spec.toJson(), config.toJson(), p.toJson(spec), deviceName, relErr,
        reportable(err.dqRelErr), reportable(err.dkRelErr),
        reportable(err.dvRelErr),
        err.capturesChecked
            ? fmt::format("{:.6e}", reportable(err.captureRelErr))
            : std::string("null"),
        capturedGradsFnv(grads), err.nanCount, forwardRelErr, bound,
        ok ? "true" : "false", toString(dqAccumulation(spec)),
        spec.deterministic, check.checkedHeads, optional(check.sampledRows),
        optional(check.sampledKeys), run.runMs,
        run.forwardMs ? fmt::format("{:.4f}", *run.forwardMs) : "null",
        run.compileMs, inputSeed,
        spec.blockSparse && o.layoutPath.empty() ? std::to_string(layoutSeed)
                                                 : "null",
        layout ? fmt::format("{:.4f}", layout->density()) : "null",
        gpuFields + (blocks ? maskBlocksJson(*blocks) : ""), seqLensJson(o));
  } else {
    fmt::print("{} on {}: rel_err {:.3e} (dQ {:.3e}, dK {:.3e}, dV {:.3e}; "
               "forward {:.3e}; bound {}) -> {}\n",
               spec.name(), deviceName, relErr, err.dqRelErr, err.dkRelErr,
               err.dvRelErr, forwardRelErr, bound, ok ? "ok" : "FAILED");
    if (check.checkedHeads < p.batch * p.heads || check.sampledRows)
      fmt::print("checked: batch 0's KV head 0 with its {} query head(s), of "
                 "{} query heads{}{}\n",
                 check.checkedHeads, p.batch * p.heads,
                 check.sampledRows
                     ? fmt::format("; sampled: {} dQ rows, {} dK/dV keys",
                                   *check.sampledRows, *check.sampledKeys)
                     : "",
                 spec.captureGrads ? "; captured tensors' gradients not "
                                     "checked (they sum over every head)"
                                   : "");
    fmt::print("compile {:.1f} ms, backward {:.3f} ms", run.compileMs,
               run.runMs);
    if (run.forwardMs)
      fmt::print(", forward {:.3f} ms", *run.forwardMs);
    fmt::print(" (Br {} x Bc {}, {} warps; dQ {})", config.blockM,
               config.blockN, config.warps,
               spec.deterministic ? "by a separate pass, deterministic"
                                  : "by atomic adds");
    if (run.gpu)
      fmt::print("{}", gpuTextSummary(*run.gpu, tflops));
    fmt::print("\n");
    if (blocks)
      fmt::print("{}", maskBlocksText(*blocks));
  }
  if (!ok && !o.source.empty())
    fmt::print(stderr,
               "flashjit: {} does not compute the gradients of the attention "
               "its description names ({}); an edit that changes the "
               "arithmetic fails this check\n",
               o.source.name, o.spec.name());
  return ok ? 0 : 1;
}

} // namespace flashjit::cli
