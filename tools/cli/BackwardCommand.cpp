//===- BackwardCommand.cpp - `flashjit run --backward` --------------------===//

#include "tools/cli/BackwardCommand.h"
#include "kernels/HostTensor.h"
#include "tools/engine/Stopwatch.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
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

} // namespace

void checkBackwardStage(const CliOptions &o, Stage stage) {
  if (o.spec.direction != Direction::Backward)
    return;
  (void)stage; // every stage exists for the backward
}

int runBackward(const CliOptions &o) {
  if (o.command != "run" || o.device == Device::Cuda || o.tune)
    throwGpuBackwardNotImplemented();
  if (!o.device)
    fmt::print(stderr, "note: the backward runs on the CPU (interpreter "
                       "mode)\n");
  const AttentionSpec &spec = o.spec;
  AttentionSpec forwardSpec = spec;
  forwardSpec.direction = Direction::Forward;
  const Problem &p = o.problem;

  RandomRun inputs = makeRandomRun(o, forwardSpec);
  const uint64_t layoutSeed = inputs.layoutSeed, inputSeed = inputs.inputSeed;
  std::unique_ptr<BlockSparseLayout> layout = std::move(inputs.layout);
  AttentionData &data = inputs.data;

  // The forward, as a user runs it before the backward: O and lse.
  auto t0 = std::chrono::steady_clock::now();
  CpuKernel::compile(forwardSpec, o.config)->run(p, data, layout.get());
  double forwardMs = msSince(t0);
  ErrorReport forwardErr = compareWithReference(
      forwardSpec, p, data,
      referenceForward(forwardSpec, p, data, layout.get(), 4e9));

  // dO from a stream derived from the reported input seed (replayable).
  std::mt19937_64 rng(inputSeed ^ 0x9e3779b97f4a7c15ull);
  AttentionGrads grads = makeRandomGrads(spec, p, data, rng);
  t0 = std::chrono::steady_clock::now();
  auto kernel = CpuBackwardKernel::compile(spec, o.config);
  double compileMs = msSince(t0);
  t0 = std::chrono::steady_clock::now();
  kernel->run(p, data, grads, layout.get());
  double runMs = msSince(t0);

  BackwardErrorReport err = compareBackward(
      spec, p, grads, referenceBackward(spec, p, data, grads, layout.get()));
  double bound = errorBound(spec.dtype);
  double relErr = reportable(err.relErr());
  double forwardRelErr = reportable(forwardErr.relErr());
  bool ok = relErr < bound && forwardRelErr < bound;
  if (!o.dumpDir.empty())
    dumpBackwardIO(o.dumpDir, spec, p, data, grads, layout.get());

  if (o.json) {
    fmt::print(
        "{{\"spec\":{},\"config\":{},\"problem\":{},\"device\":\"cpu\","
        "\"rel_err\":{:.6e},\"dq_rel_err\":{:.6e},\"dk_rel_err\":{:.6e},"
        "\"dv_rel_err\":{:.6e},\"nan_count\":{},\"forward_rel_err\":{:.6e},"
        "\"bound\":{},\"ok\":{},\"dq_mode\":\"separate_pass\","
        "\"deterministic\":true,\"time_ms\":{:.4f},\"forward_time_ms\":{:.4f},"
        "\"compile_ms\":{:.3f},\"input_seed\":{},\"layout_seed\":{},"
        "\"density\":{},\"cache\":null}}\n",
        spec.toJson(), o.config.toJson(), p.toJson(spec), relErr,
        reportable(err.dqRelErr), reportable(err.dkRelErr),
        reportable(err.dvRelErr), err.nanCount, forwardRelErr, bound,
        ok ? "true" : "false", runMs, forwardMs, compileMs, inputSeed,
        spec.blockSparse && o.layoutPath.empty() ? std::to_string(layoutSeed)
                                                 : "null",
        layout ? fmt::format("{:.4f}", layout->density()) : "null");
  } else {
    fmt::print("{} on cpu: rel_err {:.3e} (dQ {:.3e}, dK {:.3e}, dV {:.3e}; "
               "forward {:.3e}; bound {}) -> {}\n",
               spec.name(), relErr, err.dqRelErr, err.dkRelErr, err.dvRelErr,
               forwardRelErr, bound, ok ? "ok" : "FAILED");
    fmt::print("compile {:.1f} ms, backward {:.3f} ms, forward {:.3f} ms "
               "(Br {} x Bc {}; dQ by a separate pass, deterministic)\n",
               compileMs, runMs, forwardMs, o.config.blockM, o.config.blockN);
  }
  return ok ? 0 : 1;
}

} // namespace flashjit::cli
