//===- CpuEngine.cpp - The CPU execution mode (MLIR ExecutionEngine) ------===//
//
/// \file
/// Lowers the tiled IR to host LLVM IR, JIT-compiles it with MLIR's
/// ExecutionEngine (inside libflashjit.so, statically linked) and runs every
/// program of the grid on host threads (CpuGrid.h); the forward and its
/// block classification here, the backward in CpuBackwardEngine.cpp. This
/// is how CI, which has no GPU, tests tiling, online softmax, masks and
/// block-sparse skipping on numbers.
///
/// Two traps of static linking are handled here: x86 lowers bf16/f16
/// conversions to compiler-rt builtins (__truncsfbf2, __truncsfhf2,
/// __extendhfsf2) that GCC 12's static libgcc lacks, so flashjit registers
/// its own; and the tiled IR uses no memref.copy, so no runtime-utils .so.
//
//===----------------------------------------------------------------------===//

#include "compiler/CompilerInternal.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Target/CpuGrid.h"
#include "kernels/GpuGeometry.h"
#include "kernels/HalfFloat.h"
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

} // namespace

namespace flashjit {

namespace {
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

namespace cpu {

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

std::vector<MemRef1D> capturedBuffers(const AttentionSpec &spec,
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

void runGrid(PackedEntry entry, const std::vector<MemRef1D> &bufs,
             const std::vector<int64_t> &idx, const std::vector<float> &f32s,
             int64_t gridM, int64_t gridBH, int64_t gridZ,
             const std::vector<MemRef1D> &tail,
             const std::vector<int64_t> &tailIdx) {
  const int64_t programs = gridM * gridBH * std::max<int64_t>(gridZ, 1);
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    // Each thread owns its argument storage: the packed calling convention
    // takes one pointer per expanded argument.
    std::vector<MemRef1D> myBufs = bufs;
    std::vector<int64_t> myIdx = idx;
    std::vector<float> myF32s = f32s;
    std::vector<MemRef1D> myTail = tail;
    std::vector<int64_t> myTailIdx = tailIdx;
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
    for (int64_t &v : myTailIdx)
      args.push_back(&v);
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

MemRef1D view(const HalfTensor &t) {
  return describe(t.buffer->data() + t.offset,
                  int64_t(t.buffer->size()) - t.offset);
}

MemRef1D varlenOffsets(const std::vector<int32_t> &cu, MemRef1D unused) {
  if (cu.empty())
    return unused;
  return describe(const_cast<int32_t *>(cu.data()), int64_t(cu.size()));
}

void checkLayoutArg(const AttentionSpec &spec, const Problem &p,
                    const BlockSparseLayout *layout) {
  if (spec.blockSparse != (layout != nullptr))
    throw SpecError(spec.blockSparse
                        ? "a block-sparse kernel needs a layout"
                        : "a dense kernel takes no block-sparse layout");
  if (layout)
    layout->checkFits(p, spec.sparseBlock);
}
} // namespace cpu

using namespace cpu;

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
  if (spec.varlen) {
    checkSeqOffsets("mask blocks: cu_seqlens_q", d.cuSeqQ, p.batch, p.seqLenQ,
                    INT32_MAX);
    checkSeqOffsets("mask blocks: cu_seqlens_kv", d.cuSeqKV, p.batch,
                    p.seqLenKV, INT32_MAX);
  }
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
      varlenOffsets(d.cuSeqQ, none),
      varlenOffsets(d.cuSeqKV, none)};
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
          p.batch * p.heads, abi::split::combineChunks(spec.headDimV));
}

} // namespace flashjit
