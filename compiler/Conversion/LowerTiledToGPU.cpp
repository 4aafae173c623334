//===- LowerTiledToGPU.cpp - flashjit-lower-tiled-to-gpu ------------------===//
//
/// \file
/// The pass driver: creates `gpu.module @flashjit_kernels` with the dynamic
/// shared memory symbol, lowers every tiled function (the forward's tile IR
/// and the backward's three functions alike, by the tile lowering,
/// TileToGPU.h) and erases it. Before:
///
///   func.func @attention(...) attributes {attn.kernel = {...}}
///
/// After:
///
///   module attributes {gpu.container_module} {
///     gpu.module @flashjit_kernels {
///       llvm.mlir.global external @flashjit_smem() {addr_space = 3 : i32}
///       gpu.func @attention(...) kernel attributes {attn.shared_bytes = ..,
///           attn.grid = {heads = "heads", rows = .., sequence = "seq_q",
///                        z = ..}, known_block_size = ..}
///     }
///   }
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/KernelEmitters.h"
#include "compiler/Conversion/Passes.h"
#include "dialects/Tile/IR/TileDialect.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelLaunch.h"

#include "mlir/IR/BuiltinOps.h"

namespace flashjit::conversion {
#define GEN_PASS_DEF_LOWERTILEDTOGPU
#include "compiler/Conversion/Passes.h.inc"
} // namespace flashjit::conversion

using namespace mlir;
using namespace flashjit;

AttentionSpec conversion::describedSpec(Direction direction, int64_t headDimQk,
                                        int64_t headDimV, Type elementType,
                                        StringRef mask, int64_t gqa,
                                        int64_t sparseBlock,
                                        bool deterministic) {
  AttentionSpec spec;
  spec.direction = direction;
  spec.headDimQK = headDimQk;
  spec.headDimV = headDimV;
  spec.dtype = elementType.isF16() ? DType::FP16 : DType::BF16;
  spec.mask = mask == "none"     ? MaskKind::None
              : mask == "causal" ? MaskKind::Causal
                                 : MaskKind::SlidingWindow;
  spec.gqaGroup = gqa;
  spec.blockSparse = sparseBlock > 0;
  if (spec.blockSparse) // a dense spec keeps the default (unused) block
    spec.sparseBlock = sparseBlock;
  spec.deterministic = deterministic;
  return spec;
}

AttentionSpec conversion::specFromAttr(attn::KernelAttr attr) {
  return describedSpec(attr.isBackward() ? Direction::Backward
                                         : Direction::Forward,
                       attr.getHeadDimQk(), attr.getHeadDimV(),
                       attr.getElementType(), attr.getMask(), attr.getGqa(),
                       attr.getSparseBlock(), attr.getDeterministic());
}

LogicalResult conversion::checkGpuOptions(func::FuncOp fn,
                                          const AttentionSpec &spec,
                                          const TileConfig &config,
                                          int64_t copyBytes, bool kvRing) {
  if (config.warps < 1 || config.warps > 16)
    return fn.emitError() << "warps must be in [1, 16], got " << config.warps;
  if (copyBytes != 2 && copyBytes != 4 && copyBytes != 8 && copyBytes != 16)
    return fn.emitError() << "copy-bytes must be 2, 4, 8 or 16, got "
                          << copyBytes;
  if (spec.direction == Direction::Backward)
    return success(); // checked per role (TileToGPUPlacement.cpp)
  if (std::string p =
          gpuConfigProblem(spec, config, conversion::kMaxSharedBytes, kvRing);
      !p.empty())
    return fn.emitError() << p;
  GpuGeometry geo = gpuGeometry(spec, config, kvRing);
  int64_t accumulators = geo.mTiles * (config.blockN / 8 + geo.dvChunk / 8) * 4;
  if (accumulators > 255)
    return fn.emitError() << "the tiles need " << accumulators
                          << " f32 accumulator registers per thread (S and "
                             "O), more than a thread has (255)";
  return success();
}

mlir::gpu::GPUFuncOp conversion::createKernelFunc(
    ImplicitLocOpBuilder &b, mlir::gpu::GPUModuleOp gpuModule,
    func::FuncOp tiled, TypeRange argTys, int64_t threads, int64_t sharedBytes,
    DictionaryAttr grid) {
  MLIRContext *ctx = b.getContext();
  b.setInsertionPointToEnd(gpuModule.getBody());
  auto kernel = mlir::gpu::GPUFuncOp::create(
      b, tiled.getName(), FunctionType::get(ctx, argTys, {}));
  kernel->setAttr(mlir::gpu::GPUDialect::getKernelFuncAttrName(),
                  UnitAttr::get(ctx));
  kernel.setKnownBlockSizeAttr(
      b.getDenseI32ArrayAttr({int32_t(threads), 1, 1}));
  kernel->setAttr("attn.shared_bytes", b.getI64IntegerAttr(sharedBytes));
  kernel->setAttr("attn.grid", grid);
  if (Attribute a = tiled->getAttr("attn.kernel"))
    kernel->setAttr("attn.kernel", a);
  return kernel;
}

DictionaryAttr conversion::gridAttr(Builder &b, int64_t rows, bool overKeys,
                                    bool kvHeads, int64_t programsZ,
                                    bool kvSplit, bool persistent,
                                    bool scheduled) {
  SmallVector<NamedAttribute> fields = {
      b.getNamedAttr("heads",
                     b.getStringAttr(kvHeads ? kGridKvHeads : kGridAllHeads)),
      b.getNamedAttr("rows", b.getI64IntegerAttr(rows)),
      b.getNamedAttr("sequence",
                     b.getStringAttr(overKeys ? kGridKeys : kGridQueries)),
      b.getNamedAttr("z", b.getI64IntegerAttr(programsZ))};
  if (kvSplit) // grid.z: the launch's split count (kernels/KernelLaunch.h)
    fields.push_back(b.getNamedAttr("split", b.getUnitAttr()));
  if (persistent) // grid.x: the launch's programs (kernels/KernelLaunch.h)
    fields.push_back(b.getNamedAttr("persistent", b.getUnitAttr()));
  if (scheduled) // a tile schedule before the tensor maps
    fields.push_back(b.getNamedAttr("scheduled", b.getUnitAttr()));
  return b.getDictionaryAttr(fields);
}

Value conversion::sharedMemoryBase(ImplicitLocOpBuilder &b,
                                   gpu::GpuBuilder &g) {
  return LLVM::AddressOfOp::create(b, g.ptrShared, "flashjit_smem");
}

namespace {

struct LowerTiledToGPUPass
    : public conversion::impl::LowerTiledToGPUBase<LowerTiledToGPUPass> {
  LowerTiledToGPUPass() = default;
  /// Options are not copied by members: clonePass copies their values.
  LowerTiledToGPUPass(const LowerTiledToGPUPass &other)
      : LowerTiledToGPUBase(other) {}
  LowerTiledToGPUPass(int64_t warps, const GpuLoweringConfig &config) {
    this->warps = warps;
#define FLASHJIT_GPU_KNOB(Type, Name, Flag, Default, Description)              \
  this->Name = config.Name;
#include "compiler/Conversion/GpuLoweringKnobs.def"
  }

  Option<int64_t> warps{*this, "warps",
                        llvm::cl::desc("warps per thread block"),
                        llvm::cl::init(4)};
#define FLASHJIT_GPU_KNOB(Type, Name, Flag, Default, Description)              \
  Option<Type> Name{*this, Flag, llvm::cl::desc(Description),                  \
                    llvm::cl::init(Default)};
#include "compiler/Conversion/GpuLoweringKnobs.def"

  /// The knobs' values as the lowerings take them.
  GpuLoweringConfig config() const {
    GpuLoweringConfig config;
#define FLASHJIT_GPU_KNOB(Type, Name, Flag, Default, Description)              \
  config.Name = Name;
#include "compiler/Conversion/GpuLoweringKnobs.def"
    return config;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> forward, backward;
    bool bad = false;
    module.walk([&](func::FuncOp fn) {
      if (!fn->hasAttr("attn.kernel"))
        return;
      auto attr = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
      if (!attr) {
        fn.emitError() << "attn.kernel must be an #attn.kernel<...>";
        bad = true;
        return;
      }
      (attr.isBackward() ? backward : forward).push_back(fn);
    });
    if (bad)
      return signalPassFailure();
    if (forward.empty() && backward.empty()) {
      module.emitError() << "flashjit-lower-tiled-to-gpu: no kernel to lower "
                            "(no function carries attn.kernel)";
      return signalPassFailure();
    }
    MLIRContext *ctx = &getContext();
    module->setAttr("gpu.container_module", UnitAttr::get(ctx));
    ImplicitLocOpBuilder b(module.getLoc(), ctx);
    b.setInsertionPointToEnd(module.getBody());
    auto gpuModule = mlir::gpu::GPUModuleOp::create(b, "flashjit_kernels");
    b.setInsertionPointToStart(gpuModule.getBody());
    auto smemTy = LLVM::LLVMArrayType::get(b.getI8Type(), 0);
    LLVM::GlobalOp::create(b, smemTy, /*isConstant=*/false,
                           LLVM::Linkage::External, "flashjit_smem",
                           Attribute(), /*alignment=*/1024, /*addrSpace=*/3);
    const GpuLoweringConfig knobs = config();
    // The shares in eighths of a tile's registers.
    for (auto [name, value] : {std::pair<const char *, int64_t>{
                                   "exp2-emulation", knobs.exp2Emulation},
                               {"tanh-polynomial", knobs.tanhPolynomial}})
      if (value < 0 || value > 8) {
        module.emitError() << name << " must be in [0, 8], got " << value;
        return signalPassFailure();
      }
    for (func::FuncOp fn : forward) {
      if (failed(conversion::lowerTileKernel(fn, gpuModule, warps, knobs)))
        return signalPassFailure();
      fn.erase();
    }
    for (func::FuncOp fn : backward) {
      TileConfig tiling;
      auto attr = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
      tiling.blockM = attr.getBlockM();
      tiling.blockN = attr.getBlockN();
      tiling.warps = warps;
      if (failed(tile::verifyWritesOutput(fn)) ||
          failed(conversion::checkGpuOptions(fn, conversion::specFromAttr(attr),
                                             tiling, copyBytes, false)))
        return signalPassFailure();
      if (failed(
              conversion::lowerTileBackwardKernel(fn, gpuModule, warps, knobs)))
        return signalPassFailure();
      fn.erase();
    }
  }
};

} // namespace

std::unique_ptr<Pass>
conversion::createLowerTiledToGPU(int64_t warps,
                                  const GpuLoweringConfig &config) {
  return std::make_unique<LowerTiledToGPUPass>(warps, config);
}
