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

MemRef1D describe(void *data, int64_t size) {
  return {data, data, 0, size, 1};
}
} // namespace

namespace flashjit {

struct CpuKernel::Impl {
  AttentionSpec spec;
  TileConfig config;
  std::unique_ptr<MLIRContext> ctx;
  std::unique_ptr<ExecutionEngine> engine;
  void (*entry)(void **) = nullptr;
};

CpuKernel::CpuKernel(std::unique_ptr<Impl> impl) : impl(std::move(impl)) {}
CpuKernel::~CpuKernel() = default;
const AttentionSpec &CpuKernel::spec() const { return impl->spec; }
const TileConfig &CpuKernel::config() const { return impl->config; }

static void initializeNativeTarget() {
  static bool done = [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    return true;
  }();
  (void)done;
}

std::unique_ptr<CpuKernel> CpuKernel::compile(const AttentionSpec &spec,
                                              const TileConfig &config) {
  spec.validate();
  config.validate(spec);
  initializeNativeTarget();
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->config = config;
  impl->ctx = createContext();
  OwningOpRef<ModuleOp> module = parseAttnModule(*impl->ctx, spec);
  runPipeline(*module,
              [&](OpPassManager &pm) { buildCpuPipeline(pm, config); });

  ExecutionEngineOptions engineOptions;
  auto transformer = makeOptimizingTransformer(/*optLevel=*/2,
                                               /*sizeLevel=*/0, nullptr);
  engineOptions.transformer = transformer;
  engineOptions.enableGDBNotificationListener = false;
  engineOptions.enablePerfNotificationListener = false;
  auto engine = ExecutionEngine::create(*module, engineOptions);
  if (!engine)
    throw CompileError("CPU JIT failed: " +
                       llvm::toString(engine.takeError()));
  impl->engine = std::move(*engine);
  impl->engine->registerSymbols([](llvm::orc::MangleAndInterner interner) {
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
  auto entry = impl->engine->lookupPacked(kKernelName);
  if (!entry)
    throw CompileError("CPU JIT: kernel not found: " +
                       llvm::toString(entry.takeError()));
  impl->entry = *entry;
  return std::unique_ptr<CpuKernel>(new CpuKernel(std::move(impl)));
}

void CpuKernel::run(const Problem &p, AttentionData &d,
                    const BlockSparseLayout *layout) const {
  const AttentionSpec &spec = impl->spec;
  p.validate(spec);
  if (spec.blockSparse != (layout != nullptr))
    throw SpecError(spec.blockSparse
                        ? "a block-sparse kernel needs a layout"
                        : "a dense kernel takes no block-sparse layout");
  if (layout)
    layout->checkFits(p, spec.sparseBlock);
  d.q.checkLayout("q");
  d.k.checkLayout("k");
  d.v.checkLayout("v");
  d.o.checkLayout("o");

  auto [left, right] = effectiveWindow(spec, p);
  int64_t idx[abi::NumIndexArgs] = {};
  idx[abi::Batch] = p.batch;
  idx[abi::Heads] = p.heads;
  idx[abi::SeqQ] = p.seqLenQ;
  idx[abi::SeqKV] = p.seqLenKV;
  auto setStrides = [&](int first, const HalfTensor &t) {
    for (int i = 0; i < 3; ++i)
      idx[first + i] = t.strides[i];
  };
  setStrides(abi::QStrideB, d.q);
  setStrides(abi::KStrideB, d.k);
  setStrides(abi::VStrideB, d.v);
  setStrides(abi::OStrideB, d.o);
  idx[abi::WindowLeft] = left;
  idx[abi::WindowRight] = right;
  std::vector<int32_t> noLayout(1, 0);
  MemRef1D counts = describe(noLayout.data(), 1);
  MemRef1D indices = describe(noLayout.data(), 1);
  if (layout) {
    auto cs = layout->countStrides();
    auto is = layout->indexStrides();
    idx[abi::CountsStrideB] = cs[0];
    idx[abi::CountsStrideH] = cs[1];
    idx[abi::IndicesStrideB] = is[0];
    idx[abi::IndicesStrideH] = is[1];
    idx[abi::IndicesStrideM] = is[2];
    counts = describe(const_cast<int32_t *>(layout->counts.data()),
                      int64_t(layout->counts.size()));
    indices = describe(const_cast<int32_t *>(layout->indices.data()),
                       int64_t(layout->indices.size()));
  }
  float scaleLog2 = float(p.effectiveScale(spec) / std::log(2.0));
  auto view = [](HalfTensor &t) {
    return describe(t.buffer->data() + t.offset,
                    int64_t(t.buffer->size()) - t.offset);
  };
  MemRef1D bufs[abi::NumBuffers] = {
      view(d.q), view(d.k), view(d.v), view(d.o),
      describe(d.lse.data(), int64_t(d.lse.size())), counts, indices};

  const int64_t qBlocks = (p.seqLenQ + impl->config.blockM - 1) /
                          impl->config.blockM;
  const int64_t programs = qBlocks * p.batch * p.heads;
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    // Each thread owns its argument storage: the packed calling convention
    // takes one pointer per expanded argument.
    MemRef1D myBufs[abi::NumBuffers];
    std::copy(std::begin(bufs), std::end(bufs), myBufs);
    int64_t myIdx[abi::NumIndexArgs];
    std::copy(std::begin(idx), std::end(idx), myIdx);
    float myScale = scaleLog2;
    int64_t pidM = 0, pidBH = 0;
    std::vector<void *> args;
    for (MemRef1D &m : myBufs)
      args.insert(args.end(), {&m.allocated, &m.aligned, &m.offset, &m.size,
                               &m.stride});
    for (int64_t &v : myIdx)
      args.push_back(&v);
    args.insert(args.end(), {&myScale, &pidM, &pidBH});
    for (int64_t t; (t = next.fetch_add(1)) < programs;) {
      pidM = t % qBlocks;
      pidBH = t / qBlocks;
      impl->entry(args.data());
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

} // namespace flashjit
