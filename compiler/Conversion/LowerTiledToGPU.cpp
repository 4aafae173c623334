//===- LowerTiledToGPU.cpp - flashjit-lower-tiled-to-gpu ------------------===//
//
/// \file
/// The pass driver: creates `gpu.module @flashjit_kernels` with the dynamic
/// shared memory symbol, lowers every tiled function through its op
/// family's emitter (KernelEmitters.h) and erases it. Before:
///
///   func.func @attention(...) attributes {attn.kernel = {...}}
///
/// After:
///
///   module attributes {gpu.container_module} {
///     gpu.module @flashjit_kernels {
///       llvm.mlir.global external @flashjit_smem() {addr_space = 3 : i32}
///       gpu.func @attention(...) kernel attributes {attn.shared_bytes = ..}
///     }
///   }
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/KernelEmitters.h"
#include "compiler/Conversion/Passes.h"

#include "mlir/IR/BuiltinOps.h"

namespace flashjit::conversion {
#define GEN_PASS_DEF_LOWERTILEDTOGPU
#include "compiler/Conversion/Passes.h.inc"
} // namespace flashjit::conversion

using namespace mlir;
using namespace flashjit;

int64_t conversion::intAttr(DictionaryAttr attrs, StringRef name) {
  auto a = attrs.getAs<IntegerAttr>(name);
  return a ? a.getInt() : int64_t(0);
}

AttentionSpec conversion::specFromAttrs(DictionaryAttr attrs) {
  AttentionSpec spec;
  auto maskName = attrs.getAs<StringAttr>("mask");
  spec.mask = !maskName || maskName.getValue() == "none" ? MaskKind::None
              : maskName.getValue() == "causal"          ? MaskKind::Causal
                                                : MaskKind::SlidingWindow;
  spec.headDimQK = intAttr(attrs, "head_dim_qk");
  spec.headDimV = intAttr(attrs, "head_dim_v");
  spec.gqaGroup = intAttr(attrs, "gqa");
  spec.sparseBlock = intAttr(attrs, "sparse_block");
  spec.blockSparse = spec.sparseBlock > 0;
  if (auto det = attrs.getAs<BoolAttr>("deterministic"))
    spec.deterministic = det.getValue();
  auto et = attrs.getAs<TypeAttr>("element_type");
  spec.dtype = et && et.getValue().isF16() ? DType::FP16 : DType::BF16;
  auto deterministic = attrs.getAs<BoolAttr>("deterministic");
  spec.deterministic = deterministic && deterministic.getValue();
  return spec;
}

mlir::gpu::GPUFuncOp
conversion::createKernelFunc(ImplicitLocOpBuilder &b,
                             mlir::gpu::GPUModuleOp gpuModule,
                             func::FuncOp tiled, TypeRange argTys,
                             int64_t threads, int64_t sharedBytes) {
  MLIRContext *ctx = b.getContext();
  b.setInsertionPointToEnd(gpuModule.getBody());
  auto kernel = mlir::gpu::GPUFuncOp::create(
      b, tiled.getName(), FunctionType::get(ctx, argTys, {}));
  kernel->setAttr(mlir::gpu::GPUDialect::getKernelFuncAttrName(),
                  UnitAttr::get(ctx));
  kernel.setKnownBlockSizeAttr(
      b.getDenseI32ArrayAttr({int32_t(threads), 1, 1}));
  kernel->setAttr("attn.shared_bytes", b.getI64IntegerAttr(sharedBytes));
  for (StringRef name : {"attn.kernel", "attn.kernel_backward"})
    if (Attribute a = tiled->getAttr(name))
      kernel->setAttr(name, a);
  return kernel;
}

Value conversion::sharedMemoryBase(ImplicitLocOpBuilder &b,
                                   gpu::GpuBuilder &g) {
  return LLVM::AddressOfOp::create(b, g.ptrShared, "flashjit_smem");
}

namespace {

struct LowerTiledToGPUPass
    : public conversion::impl::LowerTiledToGPUBase<LowerTiledToGPUPass> {
  using LowerTiledToGPUBase::LowerTiledToGPUBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> forward, backward;
    module.walk([&](func::FuncOp fn) {
      if (fn->hasAttr("attn.kernel"))
        forward.push_back(fn);
      else if (fn->hasAttr("attn.kernel_backward"))
        backward.push_back(fn);
    });
    if (forward.empty() && backward.empty())
      return;
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
    for (func::FuncOp fn : forward) {
      if (failed(
              conversion::lowerForwardKernel(fn, gpuModule, warps, copyBytes)))
        return signalPassFailure();
      fn.erase();
    }
    for (func::FuncOp fn : backward) {
      if (failed(conversion::lowerBackwardKernel(
              fn, gpuModule, warps, copyBytes, vectorAtomics, wgmma)))
        return signalPassFailure();
      fn.erase();
    }
  }
};

} // namespace
