//===- MaskBlocksRun.cpp - The layout of --mask-blocks, found by a kernel -===//
//
/// \file
/// `run` / `bench --mask-mod ... --mask-blocks`: before the attention, the
/// kernel's own block classification (`@f_blocks`, kernels/KernelABI.h
/// abi::blocks) evaluates the mask_mod region on every block pair, on the
/// run's device (the CPU kernel; on CUDA the forward kernel's image, the
/// layout downloaded for the float64 check), timed. `run` compares it with
/// the float64 classification of every element when that is cheap enough,
/// and the attention's check then uses no layout at all: a block the
/// classification drops, or marks full wrongly, fails the run. A varlen
/// batch's layout has a row per sequence, each classified on its own.
//
//===----------------------------------------------------------------------===//

#include "tools/cli/MaskBlocksRun.h"
#include "compiler/Compiler.h"
#include "runtime/AttentionLauncher.h"
#include "runtime/CudaDriver.h"
#include "tools/cli/GpuCommands.h"
#include "tools/engine/KernelProvider.h"
#include "tools/engine/Stopwatch.h"

#include <algorithm>
#include <fmt/format.h>

namespace flashjit::cli {

/// The float64 classification checks at most this many evaluations of the
/// region (batch * heads * Nq * Nkv): seconds of the reference evaluator.
static constexpr double kCheckEvaluations = 2e8;

/// The layout classified on the GPU by the forward kernel of \p spec (the
/// run's tiling), timed over \p repeats launches after a first one.
static BlockSparseLayout classifyOnGpu(const CliOptions &o,
                                       const AttentionSpec &spec,
                                       const AttentionData &data, int64_t batch,
                                       int64_t heads, int64_t repeats,
                                       double &ms) {
  const Problem &p = o.problem;
  GpuSession session;
  GpuTarget target = session.target(o, 16);
  const TileConfig fallback = deviceDefaultTiling(spec, p, target);
  TileConfig config = flagTiling(o, fallback).value_or(fallback);
  CubinBuild build = engine::buildCubin(spec, config, target, session.cache);
  rt::ForwardKernel kernel(build.image, spec, 16, config);
  BlockSparseLayout out = maskBlocksLaunch(spec, p, batch, heads).layout();
  rt::DeviceBuffer counts(out.counts.size() * 4),
      indices(out.indices.size() * 4);
  counts.memset8(0xff); // -1 everywhere: what is not written shows
  indices.memset8(0xff);
  std::vector<rt::DeviceBuffer> captured;
  std::array<CUdeviceptr, abi::kMaxCaptures> ptrs{};
  for (const std::vector<float> &t : data.captures) {
    captured.emplace_back(t.size() * 4);
    captured.back().uploadVector(t);
    ptrs[captured.size() - 1] = captured.back().ptr();
  }
  // Varlen: the sequences' offsets on the device.
  rt::DeviceBuffer cuQ, cuKV;
  if (spec.varlen) {
    cuQ = rt::DeviceBuffer(data.cuSeqQ.size() * 4);
    cuQ.uploadVector(data.cuSeqQ);
    cuKV = rt::DeviceBuffer(data.cuSeqKV.size() * 4);
    cuKV.uploadVector(data.cuSeqKV);
  }
  rt::CudaDriver &driver = rt::CudaDriver::get();
  auto launch = [&] {
    kernel.classifyBlocks(p, batch, heads, counts.ptr(), indices.ptr(), ptrs,
                          nullptr, cuQ.ptr(), cuKV.ptr());
  };
  launch();
  driver.synchronize();
  counts.download(out.counts.data(), out.counts.size() * 4);
  indices.download(out.indices.data(), out.indices.size() * 4);
  std::vector<double> times;
  for (int64_t r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    launch();
    driver.synchronize();
    times.push_back(engine::msSince(t0));
  }
  std::sort(times.begin(), times.end());
  ms = times.empty() ? 0 : times[times.size() / 2];
  return out;
}

MaskBlocksRun classifyMaskBlocks(const CliOptions &o,
                                 const AttentionSpec &forwardSpec,
                                 const AttentionData &data, bool onGpu,
                                 int64_t repeats) {
  const Problem &p = o.problem;
  MaskBlocksRun r;
  // A mask that reads neither its batch nor its head is classified once
  // and broadcast (varlen: a row per sequence, whatever it reads).
  auto [readsBatch, readsHead] = maskModReadsBatchHead(forwardSpec);
  const int64_t batch = readsBatch || forwardSpec.varlen ? p.batch : 1,
                heads = readsHead ? p.heads : 1;
  if (onGpu) {
    r.layout = std::make_unique<BlockSparseLayout>(
        classifyOnGpu(o, forwardSpec, data, batch, heads, repeats, r.ms));
  } else {
    auto kernel = CpuKernel::compile(forwardSpec, o.config);
    auto t0 = std::chrono::steady_clock::now();
    r.layout = std::make_unique<BlockSparseLayout>(
        kernel->classifyBlocks(p, data, batch, heads));
    r.ms = engine::msSince(t0);
  }
  r.layout->checkFits(p, forwardSpec.sparseBlock);
  r.batch = batch;
  r.heads = heads;
  r.density = r.layout->density();
  for (size_t row = 0; row < r.layout->counts.size(); ++row)
    for (int32_t t = 0; t < r.layout->counts[row]; ++t)
      r.full += r.layout->indices[row * size_t(r.layout->kvBlocks) + t] < 0;
  const double evaluations =
      double(batch * heads) * double(p.seqLenQ) * double(p.seqLenKV);
  r.checked = o.command == "run" && evaluations <= kCheckEvaluations;
  if (r.checked)
    r.matches = sameListedBlocks(
        *r.layout, referenceMaskBlocks(forwardSpec, p, data.captures, batch,
                                       heads, data.cuSeqQ, data.cuSeqKV));
  return r;
}

std::string maskBlocksJson(const MaskBlocksRun &r) {
  return fmt::format(",\"mask_blocks\":{{\"ms\":{:.4f},\"density\":{:.4f},"
                     "\"full_blocks\":{},\"batch\":{},\"heads\":{},"
                     "\"checked\":{},\"matches\":{}}}",
                     r.ms, r.density, r.full, r.batch, r.heads,
                     r.checked ? "true" : "false",
                     r.checked ? (r.matches ? "true" : "false") : "null");
}

std::string maskBlocksText(const MaskBlocksRun &r) {
  return fmt::format("mask blocks: classified in {:.3f} ms, density {:.3f}, "
                     "{} full, a {} x {} layout; {}\n",
                     r.ms, r.density, r.full, r.batch, r.heads,
                     !r.checked  ? "not checked (too large)"
                     : r.matches ? "the float64 classification's"
                                 : "NOT the float64 classification's");
}

} // namespace flashjit::cli
