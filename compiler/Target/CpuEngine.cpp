//===- CpuEngine.cpp - The CPU execution mode (MLIR ExecutionEngine) ------===//
//
/// \file
/// Lowers the tiled IR to host LLVM IR, JIT-compiles it with MLIR's
/// ExecutionEngine (inside libflashjit.so, statically linked) and runs every
/// program of the grid on host threads. This is how CI, which has no GPU,
/// tests tiling, online softmax, masks and block-sparse skipping on numbers.
///
/// Two traps of static linking are handled here: x86 lowers bf16/f16
/// conversions to compiler-rt builtins (__truncsfbf2, __truncsfhf2,
/// __extendhfsf2) that GCC 12's static libgcc lacks, so flashjit registers
/// its own; and the tiled IR uses no memref.copy, so no runtime-utils .so.
//
//===----------------------------------------------------------------------===//

#include "compiler/CompilerInternal.h"
#include "compiler/Pipelines/Pipelines.h"
#include "kernels/HalfFloat.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Pass/PassManager.h"

#include "llvm/ExecutionEngine/Orc/Mangling.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/TargetSelect.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fmt/format.h>
#include <thread>
#include <vector>

using namespace mlir;

namespace {
// The builtins' ABI passes 16-bit floats in XMM registers. _Float16 (GCC 12
// supports it on x86-64) is used only as a container for the bits, so no
// conversion libcall is emitted here.
_Float16 bitsToF16Container(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return h;
}
uint16_t f16ContainerBits(_Float16 h) {
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
extern "C" _Float16 flashjit_truncsfbf2(float f) {
  return bitsToF16Container(flashjit::floatToBf16(f));
}
extern "C" _Float16 flashjit_truncsfhf2(float f) {
  return bitsToF16Container(flashjit::floatToFp16(f));
}
extern "C" float flashjit_extendhfsf2(_Float16 h) {
  return flashjit::fp16ToFloat(f16ContainerBits(h));
}
extern "C" float flashjit_extendbfsf2(_Float16 h) {
  return flashjit::bf16ToFloat(f16ContainerBits(h));
}
// The older names, for the same conversions on an i16 ABI.
extern "C" uint16_t flashjit_gnu_f2h_ieee(float f) {
  return flashjit::floatToFp16(f);
}
extern "C" float flashjit_gnu_h2f_ieee(uint16_t h) {
  return flashjit::fp16ToFloat(h);
}

/// A (allocated, aligned, offset, size, stride) memref<?xT> descriptor.
struct MemRef1D {
  void *allocated;
  void *aligned;
  int64_t offset, size, stride;
};

MemRef1D describe(void *data, int64_t size) { return {data, data, 0, size, 1}; }
} // namespace

namespace flashjit {

namespace {
/// The packed entry point the ExecutionEngine makes for a function.
using PackedEntry = void (*)(void **);

void initializeNativeTarget() {
  static bool done = [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    return true;
  }();
  (void)done;
}

} // namespace

std::unique_ptr<ExecutionEngine> jitLoweredModule(ModuleOp module) {
  initializeNativeTarget();
  ExecutionEngineOptions engineOptions;
  auto transformer = makeOptimizingTransformer(/*optLevel=*/2,
                                               /*sizeLevel=*/0, nullptr);
  engineOptions.transformer = transformer;
  engineOptions.enableGDBNotificationListener = false;
  engineOptions.enablePerfNotificationListener = false;
  auto engine = ExecutionEngine::create(module, engineOptions);
  if (!engine)
    throw CompileError("CPU JIT failed: " + llvm::toString(engine.takeError()));
  (*engine)->registerSymbols([](llvm::orc::MangleAndInterner interner) {
    llvm::orc::SymbolMap map;
    auto add = [&](const char *name, auto *fn) {
      map[interner(name)] = {llvm::orc::ExecutorAddr::fromPtr(fn),
                             llvm::JITSymbolFlags::Exported};
    };
    add("__truncsfbf2", &flashjit_truncsfbf2);
    add("__truncsfhf2", &flashjit_truncsfhf2);
    add("__extendhfsf2", &flashjit_extendhfsf2);
    add("__extendbfsf2", &flashjit_extendbfsf2);
    add("__gnu_f2h_ieee", &flashjit_gnu_f2h_ieee);
    add("__gnu_h2f_ieee", &flashjit_gnu_h2f_ieee);
    return map;
  });
  return std::move(*engine);
}

namespace {

/// Runs the CPU pipeline on \p source (the attn stage of \p spec when
/// empty) and JIT-compiles it.
std::unique_ptr<ExecutionEngine> jitCompile(MLIRContext &ctx,
                                            const AttentionSpec &spec,
                                            const TileConfig &config,
                                            const KernelSource &source) {
  OwningOpRef<ModuleOp> module =
      loadSource(ctx, spec, source, config,
                 [](OpPassManager &pm) { buildCpuLoweringPipeline(pm); });
  return jitLoweredModule(*module);
}

PackedEntry lookupEntry(ExecutionEngine &engine, const std::string &name) {
  auto entry = engine.lookupPacked(name);
  if (!entry)
    throw CompileError("CPU JIT: kernel not found: " +
                       llvm::toString(entry.takeError()));
  return *entry;
}

/// The memrefs of \p d's captured tensors, after checking that they are
/// \p spec's (its count, none empty).
static std::vector<MemRef1D> capturedBuffers(const AttentionSpec &spec,
                                             const AttentionData &d) {
  if (int64_t(d.captures.size()) != spec.captures)
    throw SpecError(fmt::format("the score modifier captures {} tensors, "
                                "the call gives {}",
                                spec.captures, d.captures.size()));
  std::vector<MemRef1D> captured;
  for (const std::vector<float> &t : d.captures) {
    if (t.empty())
      throw SpecError("a captured tensor is empty");
    captured.push_back(
        describe(const_cast<float *>(t.data()), int64_t(t.size())));
  }
  return captured;
}

/// Runs \p entry for every (pid_m, pid_bh) in [0, gridM) x [0, gridBH) on
/// host threads. The argument list is: the buffers, the index arguments, the
/// f32 arguments, pid_m, pid_bh (kernels/KernelABI.h); with \p gridZ > 0
/// also pid_split, every one of [0, gridZ) (abi::split); then the
/// buffers of \p tail (a score modifier's captured tensors).
void runGrid(PackedEntry entry, const std::vector<MemRef1D> &bufs,
             const std::vector<int64_t> &idx, const std::vector<float> &f32s,
             int64_t gridM, int64_t gridBH, int64_t gridZ = 0,
             const std::vector<MemRef1D> &tail = {}) {
  const int64_t programs = gridM * gridBH * std::max<int64_t>(gridZ, 1);
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    // Each thread owns its argument storage: the packed calling convention
    // takes one pointer per expanded argument.
    std::vector<MemRef1D> myBufs = bufs;
    std::vector<int64_t> myIdx = idx;
    std::vector<float> myF32s = f32s;
    std::vector<MemRef1D> myTail = tail;
    int64_t pidM = 0, pidBH = 0, pidZ = 0;
    std::vector<void *> args;
    // A memref expands to five packed arguments.
    auto pushMemRefs = [&args](std::vector<MemRef1D> &memrefs) {
      for (MemRef1D &m : memrefs)
        args.insert(args.end(),
                    {&m.allocated, &m.aligned, &m.offset, &m.size, &m.stride});
    };
    pushMemRefs(myBufs);
    for (int64_t &v : myIdx)
      args.push_back(&v);
    for (float &v : myF32s)
      args.push_back(&v);
    args.insert(args.end(), {&pidM, &pidBH});
    if (gridZ > 0)
      args.push_back(&pidZ);
    pushMemRefs(myTail);
    for (int64_t t; (t = next.fetch_add(1)) < programs;) {
      pidM = t % gridM;
      pidBH = (t / gridM) % gridBH;
      pidZ = t / (gridM * gridBH);
      entry(args.data());
    }
  };
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  threads = unsigned(std::min<int64_t>(threads, programs));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i)
    pool.emplace_back(worker);
  worker();
  for (auto &t : pool)
    t.join();
}

/// The whole buffer behind a view, from the view's offset on.
MemRef1D view(const HalfTensor &t) {
  return describe(t.buffer->data() + t.offset,
                  int64_t(t.buffer->size()) - t.offset);
}

/// A varlen kernel's offsets (AttentionData::cuSeqQ or cuSeqKV), or
/// \p unused (a valid buffer the kernel never reads) when there are none.
MemRef1D varlenOffsets(const std::vector<int32_t> &cu, MemRef1D unused) {
  if (cu.empty())
    return unused;
  return describe(const_cast<int32_t *>(cu.data()), int64_t(cu.size()));
}

/// Checks the layout argument against \p spec and \p p.
void checkLayoutArg(const AttentionSpec &spec, const Problem &p,
                    const BlockSparseLayout *layout) {
  if (spec.blockSparse != (layout != nullptr))
    throw SpecError(spec.blockSparse
                        ? "a block-sparse kernel needs a layout"
                        : "a dense kernel takes no block-sparse layout");
  if (layout)
    layout->checkFits(p, spec.sparseBlock);
}
} // namespace

struct CpuKernel::Impl {
  AttentionSpec spec;
  TileConfig config;
  std::unique_ptr<MLIRContext> ctx;
  std::unique_ptr<ExecutionEngine> engine;
  PackedEntry entry = nullptr;
  PackedEntry combine = nullptr; ///< split-KV only
  /// Block-sparse with a mask_mod only: its block classes and lists.
  PackedEntry blocks = nullptr, blockLists = nullptr;
};

CpuKernel::CpuKernel(std::unique_ptr<Impl> impl) : impl(std::move(impl)) {}
CpuKernel::~CpuKernel() = default;
const AttentionSpec &CpuKernel::spec() const { return impl->spec; }
const TileConfig &CpuKernel::config() const { return impl->config; }

std::unique_ptr<CpuKernel> CpuKernel::compile(const AttentionSpec &spec,
                                              const TileConfig &config,
                                              const KernelSource &source) {
  spec.validate();
  config.validate(spec);
  if (spec.direction != Direction::Forward)
    throw SpecError("CpuKernel runs the forward; the backward is "
                    "CpuBackwardKernel");
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->config = config;
  impl->ctx = createContext();
  impl->engine = jitCompile(*impl->ctx, spec, config, source);
  impl->entry = lookupEntry(*impl->engine, kKernelName);
  if (config.splits)
    impl->combine = lookupEntry(*impl->engine, std::string(kKernelName) +
                                                   abi::split::kCombineSuffix);
  if (spec.blockSparse && !spec.maskModRegion.empty()) {
    impl->blocks = lookupEntry(*impl->engine,
                               std::string(kKernelName) + abi::blocks::kSuffix);
    impl->blockLists = lookupEntry(*impl->engine, std::string(kKernelName) +
                                                      abi::blocks::kListSuffix);
  }
  return std::unique_ptr<CpuKernel>(new CpuKernel(std::move(impl)));
}

BlockSparseLayout CpuKernel::classifyBlocks(const Problem &p,
                                            const AttentionData &d,
                                            int64_t batch,
                                            int64_t heads) const {
  const AttentionSpec &spec = impl->spec;
  p.validate(spec);
  MaskBlocksLaunch launch = maskBlocksLaunch(spec, p, batch, heads);
  std::vector<MemRef1D> captured = capturedBuffers(spec, d);
  BlockSparseLayout layout = launch.layout();
  std::vector<int64_t> idx(launch.index.begin(), launch.index.end());
  std::vector<int32_t> unused(1, 0);
  MemRef1D none = describe(unused.data(), 1);
  std::vector<MemRef1D> bufs = {
      none,
      none,
      none,
      none,
      none,
      describe(layout.counts.data(), int64_t(layout.counts.size())),
      describe(layout.indices.data(), int64_t(layout.indices.size())),
      none,
      none};
  runGrid(impl->blocks, bufs, idx, {0.0f}, launch.classPrograms, batch * heads,
          0, captured);
  runGrid(impl->blockLists, bufs, idx, {0.0f}, launch.listPrograms,
          batch * heads, 0, captured);
  return layout;
}

void CpuKernel::run(const Problem &p, AttentionData &d,
                    const BlockSparseLayout *layout) const {
  const AttentionSpec &spec = impl->spec;
  p.validate(spec);
  checkLayoutArg(spec, p, layout);
  checkVarlenData(spec, p, d);
  d.q.checkLayout("q");
  d.k.checkLayout("k");
  d.v.checkLayout("v");
  d.o.checkLayout("o");
  std::vector<MemRef1D> captured = capturedBuffers(spec, d);

  abi::TensorStrides strides;
  strides.q = d.q.strides;
  strides.k = d.k.strides;
  strides.v = d.v.strides;
  strides.o = d.o.strides;
  std::vector<int32_t> noLayout(1, 0);
  MemRef1D counts = describe(noLayout.data(), 1);
  MemRef1D indices = describe(noLayout.data(), 1);
  if (layout) {
    strides.counts = layout->countStrides();
    strides.indices = layout->indexStrides();
    counts = describe(const_cast<int32_t *>(layout->counts.data()),
                      int64_t(layout->counts.size()));
    indices = describe(const_cast<int32_t *>(layout->indices.data()),
                       int64_t(layout->indices.size()));
  }
  auto idxArray = abi::indexArgs(spec, p, strides);
  std::vector<int64_t> idx(idxArray.begin(), idxArray.end());
  float scaleLog2 = float(p.effectiveScale(spec) / std::log(2.0));
  std::vector<MemRef1D> bufs = {view(d.q),
                                view(d.k),
                                view(d.v),
                                view(d.o),
                                describe(d.lse.data(), int64_t(d.lse.size())),
                                counts,
                                indices,
                                varlenOffsets(d.cuSeqQ, counts),
                                varlenOffsets(d.cuSeqKV, counts)};

  const TileConfig &config = impl->config;
  if (!config.splits) {
    const int64_t qBlocks = (p.seqLenQ + config.blockM - 1) / config.blockM;
    runGrid(impl->entry, bufs, idx, {scaleLog2}, qBlocks, p.batch * p.heads, 0,
            captured);
    return;
  }
  // Split-KV: the partial on a grid.z of S (launchSplits: the config's,
  // or chooseKvSplits' for the host's threads) into workspaces of its
  // own, then the combine (kernels/KernelABI.h, abi::split).
  auto [gridM, gridBH] = abi::split::splitGrid(spec, p, config.blockM);
  const int64_t splits = abi::split::launchSplits(
      spec, p, config, std::thread::hardware_concurrency());
  const int64_t rows = splits * p.batch * p.heads * p.seqLenQ;
  std::vector<float> oPart(static_cast<size_t>(rows * spec.headDimV));
  std::vector<float> lsePart(static_cast<size_t>(rows));
  bufs.push_back(describe(oPart.data(), int64_t(oPart.size())));
  bufs.push_back(describe(lsePart.data(), int64_t(lsePart.size())));
  idx.push_back(splits);
  runGrid(impl->entry, bufs, idx, {scaleLog2}, gridM, gridBH, splits, captured);
  runGrid(impl->combine, bufs, idx, {scaleLog2},
          (p.seqLenQ + abi::bwd::kRowBlockRows - 1) / abi::bwd::kRowBlockRows,
          p.batch * p.heads, 1);
}

//===----------------------------------------------------------------------===//
// The backward
//===----------------------------------------------------------------------===//

struct CpuBackwardKernel::Impl {
  AttentionSpec spec;
  TileConfig config;
  std::unique_ptr<MLIRContext> ctx;
  std::unique_ptr<ExecutionEngine> engine;
  PackedEntry preprocess = nullptr, main = nullptr, dq = nullptr;
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
                           ? describe(delta + 2 * rows, rows * spec.headDimQK)
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
  runGrid(impl->preprocess, bufs, idx, f32s, rowBlocks, p.batch * p.heads, 0,
          captured);
  runGrid(impl->main, bufs, idx, f32s, kvBlocks, p.batch * p.kvHeads(spec), 0,
          captured);
  runGrid(impl->dq, bufs, idx, f32s, dqBlocks, p.batch * p.heads, 0,
          captured);
}

} // namespace flashjit
