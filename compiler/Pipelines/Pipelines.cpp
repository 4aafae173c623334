//===- Pipelines.cpp - flashjit's pass pipelines --------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

namespace flashjit {

void buildTilingPipeline(OpPassManager &pm, const TileConfig &config) {
  attn::TileAttentionOptions tile;
  tile.blockM = config.blockM;
  tile.blockN = config.blockN;
  pm.addPass(attn::createTileAttention(tile));
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void buildCpuPipeline(OpPassManager &pm, const TileConfig &config) {
  buildTilingPipeline(pm, config);
  pm.addPass(createLoopInvariantCodeMotionPass());
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  pm.addPass(createCanonicalizerPass());
}

/// The registered pipelines' options, as the C++ builders take them.
static TileConfig toConfig(const FlashjitPipelineOptions &options) {
  TileConfig config;
  config.blockM = options.blockM;
  config.blockN = options.blockN;
  return config;
}

void registerFlashjitPasses() {
  attn::registerAttnPasses();
  PassPipelineRegistration<FlashjitPipelineOptions>(
      "flashjit-tiling-pipeline",
      "attn -> tiled FlashAttention-2 IR (scf/arith/math/memref)",
      [](OpPassManager &pm, const FlashjitPipelineOptions &options) {
        buildTilingPipeline(pm, toConfig(options));
      });
  PassPipelineRegistration<FlashjitPipelineOptions>(
      "flashjit-cpu-pipeline",
      "attn -> LLVM dialect for the host (CPU execution mode)",
      [](OpPassManager &pm, const FlashjitPipelineOptions &options) {
        buildCpuPipeline(pm, toConfig(options));
      });
}

void registerFlashjitDialects(DialectRegistry &registry) {
  registry.insert<attn::AttnDialect, func::FuncDialect, scf::SCFDialect,
                  arith::ArithDialect, math::MathDialect,
                  memref::MemRefDialect, cf::ControlFlowDialect,
                  LLVM::LLVMDialect>();
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
}

} // namespace flashjit
