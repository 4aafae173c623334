//===- CpuBackwardEngine.cpp - The CPU execution mode's backward ----------===//
//
/// \file
/// CpuBackwardKernel: the backward's tiled functions (kernels/KernelABI.h,
/// abi::bwd) JIT-compiled for the host and run as grids of programs on host
/// threads (CpuGrid.h), in the order the GPU launches them: the
/// preprocessing, the dK/dV loop, the dQ conversion or pass, and with
/// deterministic captured gradients their conversions.
//
//===----------------------------------------------------------------------===//

#include "compiler/CompilerInternal.h"
#include "compiler/Target/CpuGrid.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"

#include <cmath>
#include <fmt/format.h>

using namespace mlir;

namespace flashjit {

using namespace cpu;

struct CpuBackwardKernel::Impl {
  AttentionSpec spec;
  TileConfig config;
  std::unique_ptr<MLIRContext> ctx;
  std::unique_ptr<ExecutionEngine> engine;
  PackedEntry preprocess = nullptr, main = nullptr, dq = nullptr;
  /// Deterministic captured gradients: `@f_capture_grad<c>` of each
  /// captured tensor c with a gradient (null for the others).
  std::vector<PackedEntry> captureConvert;
};

CpuBackwardKernel::CpuBackwardKernel(std::unique_ptr<Impl> impl)
    : impl(std::move(impl)) {}
CpuBackwardKernel::~CpuBackwardKernel() = default;
const AttentionSpec &CpuBackwardKernel::spec() const { return impl->spec; }
const TileConfig &CpuBackwardKernel::config() const { return impl->config; }

std::unique_ptr<CpuBackwardKernel>
CpuBackwardKernel::compile(const AttentionSpec &spec, const TileConfig &config,
                           const KernelSource &source) {
  spec.validate();
  config.validate(spec);
  if (spec.direction != Direction::Backward)
    throw SpecError("CpuBackwardKernel needs a backward spec (direction "
                    "Backward)");
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->config = config;
  impl->ctx = createContext();
  impl->engine = jitCompile(*impl->ctx, spec, config, source);
  std::string name = kKernelName;
  impl->preprocess =
      lookupEntry(*impl->engine, name + abi::bwd::kPreprocessSuffix);
  impl->main = lookupEntry(*impl->engine, name);
  impl->dq = lookupEntry(*impl->engine, name + abi::bwd::kDqSuffix);
  if (abi::bwd::fixedPointCaptureGrads(spec))
    for (int64_t c = 0; c < spec.captures; ++c)
      impl->captureConvert.push_back(
          (spec.captureGrads >> c) & 1
              ? lookupEntry(*impl->engine, name + abi::bwd::kCaptureGradSuffix +
                                               std::to_string(c))
              : nullptr);
  return std::unique_ptr<CpuBackwardKernel>(
      new CpuBackwardKernel(std::move(impl)));
}

void CpuBackwardKernel::run(const Problem &p, const AttentionData &fwd,
                            AttentionGrads &g, const BlockSparseLayout *layout,
                            void *workspace, int64_t workspaceBytes) const {
  namespace bwd = abi::bwd;
  const AttentionSpec &spec = impl->spec;
  p.validate(spec);
  checkLayoutArg(spec, p, layout);
  checkVarlenData(spec, p, fwd);
  const std::pair<const HalfTensor *, const char *> views[] = {
      {&fwd.q, "q"}, {&fwd.k, "k"}, {&fwd.v, "v"}, {&fwd.o, "o"},
      {&g.dO, "do"}, {&g.dq, "dq"}, {&g.dk, "dk"}, {&g.dv, "dv"}};
  for (auto [t, name] : views)
    t->checkLayout(name);
  auto checkShape = [](const HalfTensor &t, const HalfTensor &like,
                       const char *what) {
    if (t.shape != like.shape)
      throw SpecError(fmt::format("{}: shape ({}, {}, {}, {}) differs from "
                                  "({}, {}, {}, {})",
                                  what, t.shape[0], t.shape[1], t.shape[2],
                                  t.shape[3], like.shape[0], like.shape[1],
                                  like.shape[2], like.shape[3]));
  };
  checkShape(g.dO, fwd.o, "do (shaped as o)");
  checkShape(g.dq, fwd.q, "dq (shaped as q)");
  checkShape(g.dk, fwd.k, "dk (shaped as k)");
  checkShape(g.dv, fwd.v, "dv (shaped as v)");
  const int64_t rows = p.batch * p.heads * p.seqLenQ;
  if (int64_t(fwd.lse.size()) < rows)
    throw SpecError(fmt::format("lse: {} values, the problem has {} rows",
                                fwd.lse.size(), rows));
  // The workspace: delta (f32 [2, B, H, Nq]: rowsum(dO * O), then -lse *
  // log2(e)), then, for atomic dQ, dq_accum (f32 [B, H, Nq, dqk]).
  const int64_t needBytes = backwardWorkspaceBytes(spec, p);
  std::vector<float> ownWorkspace;
  float *delta = static_cast<float *>(workspace);
  if (!workspace) {
    ownWorkspace.resize(size_t(needBytes / 4));
    delta = ownWorkspace.data();
  } else if (workspaceBytes < needBytes) {
    throw SpecError(fmt::format("workspace: {} bytes given, the backward "
                                "needs {} ({})",
                                workspaceBytes, needBytes,
                                spec.deterministic
                                    ? "deterministic: delta"
                                    : "atomic dQ: delta and dq_accum"));
  }
  const bool atomicDq = dqAccumulation(spec) == DqAccumulation::Atomic;

  abi::bwd::BackwardStrides strides = abi::bwd::tensorStrides(
      fwd.q, fwd.k, fwd.v, fwd.o, g.dO, g.dq, g.dk, g.dv);
  std::vector<int32_t> noLayout(1, 0);
  MemRef1D counts = describe(noLayout.data(), 1), indices = counts;
  MemRef1D kvCounts = counts, kvIndices = counts;
  BlockSparseLayout kvMajor;
  if (layout) {
    kvMajor = layout->transposed();
    strides.counts = layout->countStrides();
    strides.indices = layout->indexStrides();
    strides.kvCounts = kvMajor.countStrides();
    strides.kvIndices = kvMajor.indexStrides();
    auto describeI32 = [](const std::vector<int32_t> &v) {
      return describe(const_cast<int32_t *>(v.data()), int64_t(v.size()));
    };
    counts = describeI32(layout->counts);
    indices = describeI32(layout->indices);
    kvCounts = describeI32(kvMajor.counts);
    kvIndices = describeI32(kvMajor.indices);
  }
  std::array<int64_t, bwd::NumIndexArgs> idxArgs =
      bwd::indexArgs(spec, p, strides);
  std::vector<int64_t> idx(idxArgs.begin(), idxArgs.end());
  double scale = p.effectiveScale(spec);
  std::vector<float> f32s(bwd::NumF32Args);
  f32s[bwd::ScaleLog2e] = float(scale / std::log(2.0));
  f32s[bwd::Scale] = float(scale);

  // Deterministic kernels neither read nor write dq_accum.
  float noAccum = 0;
  std::vector<MemRef1D> bufs(bwd::NumBuffers);
  bufs[bwd::Q] = view(fwd.q);
  bufs[bwd::K] = view(fwd.k);
  bufs[bwd::V] = view(fwd.v);
  bufs[bwd::O] = view(fwd.o);
  bufs[bwd::DO] = view(g.dO);
  bufs[bwd::Lse] = describe(const_cast<float *>(fwd.lse.data()), rows);
  bufs[bwd::Delta] = describe(delta, 2 * rows);
  bufs[bwd::DqAccum] = atomicDq
                           ? describe(delta + bwd::dqAccumOffsetBytes(rows) / 4,
                                      rows * spec.headDimQK)
                           : describe(&noAccum, 1);
  bufs[bwd::DQ] = view(g.dq);
  bufs[bwd::DK] = view(g.dk);
  bufs[bwd::DV] = view(g.dv);
  bufs[bwd::Counts] = counts;
  bufs[bwd::Indices] = indices;
  bufs[bwd::KvCounts] = kvCounts;
  bufs[bwd::KvIndices] = kvIndices;
  bufs[bwd::CuSeqQ] = varlenOffsets(fwd.cuSeqQ, counts);
  bufs[bwd::CuSeqKV] = varlenOffsets(fwd.cuSeqKV, counts);

  const TileConfig &c = impl->config;
  auto blocks = [](int64_t n, int64_t per) { return (n + per - 1) / per; };
  const int64_t rowBlocks = blocks(p.seqLenQ, bwd::kRowBlockRows);
  const int64_t kvBlocks = blocks(p.seqLenKV, c.blockN);
  // The separate dQ pass: Q blocks of the rows the tiling pipeline gives
  // it (dqPassTiles, as on the GPU); atomic dQ's conversion: kRowBlockRows
  // rows.
  const int64_t dqRows =
      dqPassTiles(spec.headDimQK, spec.blockSparse ? spec.sparseBlock : 0, c)
          .rows;
  const int64_t dqBlocks = atomicDq ? rowBlocks : blocks(p.seqLenQ, dqRows);
  // In this order: the preprocessing writes delta (and zeroes dq_accum),
  // the main loop reads delta (and adds into dq_accum), @f_dq writes dQ.
  std::vector<MemRef1D> captured = capturedBuffers(spec, fwd);
  // Then a gradient buffer per captured tensor: g.captureGrads' for those
  // of spec.captureGrads, a dummy the kernel never touches for the others.
  float unused = 0;
  if (spec.captureGrads && g.captureGrads.size() != fwd.captures.size())
    throw SpecError(fmt::format("capture_grads: {} gradient buffers for {} "
                                "captured tensors",
                                g.captureGrads.size(), fwd.captures.size()));
  for (size_t c = 0; c < fwd.captures.size(); ++c) {
    if (!((spec.captureGrads >> c) & 1)) {
      captured.push_back(describe(&unused, 1));
      continue;
    }
    std::vector<float> &grad = g.captureGrads[c];
    if (grad.size() != fwd.captures[c].size())
      throw SpecError(fmt::format("the gradient of captured tensor {} has {} "
                                  "elements, the tensor {}",
                                  c, grad.size(), fwd.captures[c].size()));
    captured.push_back(describe(grad.data(), int64_t(grad.size())));
  }
  // Deterministic: the fixed-point words of each gradient (zero), then
  // every captured tensor's size (abi::bwd::fixedPointCaptureGrads).
  std::vector<std::vector<int64_t>> words;
  std::vector<int64_t> sizes;
  int64_t unusedWord = 0;
  if (abi::bwd::fixedPointCaptureGrads(spec)) {
    words.resize(2 * fwd.captures.size());
    for (size_t c = 0; c < fwd.captures.size(); ++c) {
      const int64_t n = int64_t(fwd.captures[c].size());
      if (((spec.captureGrads >> c) & 1) && n > INT32_MAX)
        throw SpecError(fmt::format("captured tensor {} has {} elements; its "
                                    "gradient takes 1 .. 2^31 - 1",
                                    c, n));
      sizes.push_back(n);
      for (int w = 0; w < 2; ++w) {
        std::vector<int64_t> &acc = words[2 * c + size_t(w)];
        // lo: one more word, the count of non-finite contributions.
        if ((spec.captureGrads >> c) & 1)
          acc.assign(size_t(abi::bwd::captureWords(n) + w), 0);
        captured.push_back(acc.empty()
                               ? describe(&unusedWord, 1)
                               : describe(acc.data(), int64_t(acc.size())));
      }
    }
  }
  runGrid(impl->preprocess, bufs, idx, f32s, rowBlocks, p.batch * p.heads, 0,
          captured, sizes);
  runGrid(impl->main, bufs, idx, f32s, kvBlocks, p.batch * p.kvHeads(spec), 0,
          captured, sizes);
  runGrid(impl->dq, bufs, idx, f32s, dqBlocks, p.batch * p.heads, 0, captured,
          sizes);
  for (size_t c = 0; c < impl->captureConvert.size(); ++c)
    if (impl->captureConvert[c])
      runGrid(impl->captureConvert[c], bufs, idx, f32s,
              abi::bwd::captureConvertPrograms(sizes[c]), 1, 0, captured,
              sizes);
}

} // namespace flashjit
