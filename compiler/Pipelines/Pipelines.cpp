//===- Pipelines.cpp - flashjit's pass pipelines --------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "compiler/Conversion/Passes.h"
#include "compiler/Target/Passes.h"
#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/Passes.h"
#include "dialects/Tile/IR/TileDialect.h"
#include "kernels/GpuGeometry.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Transforms/Passes.h"

#include <cstdlib>
#include <string>

using namespace mlir;

namespace flashjit {

bool usesDqQuadOrder() {
  // The default since T41 (H100, N 8192, two rounds: d 128 -9.0%, causal
  // -8.2%, window 1024 -6.3%, d 96 -19.7% backward time);
  // FLASHJIT_DQ_QUAD_ORDER=0 keeps column order (for comparisons).
  const char *env = std::getenv("FLASHJIT_DQ_QUAD_ORDER");
  return !(env && std::string(env) == "0");
}

int64_t softmaxLead(const TileConfig &config) {
  const char *env = std::getenv("FLASHJIT_SOFTMAX_LEAD");
  return config.overlapSoftmax && env && std::string(env) == "2" ? 2 : 1;
}

void buildTilingPipeline(OpPassManager &pm, const TileConfig &config,
                         bool dqQuadOrder, int64_t lead) {
  attn::TileAttentionOptions tile;
  tile.blockM = config.blockM;
  tile.blockN = config.blockN;
  tile.kvSplit = config.splits != 0;
  tile.overlapSoftmax = config.overlapSoftmax;
  tile.biasProduct = usesBiasProduct(config);
  tile.softmaxLead = lead ? lead : softmaxLead(config);
  pm.addPass(attn::createTileAttention(tile));
  attn::TileAttentionBackwardOptions tileBackward;
  tileBackward.blockM = config.blockM;
  tileBackward.blockN = config.blockN;
  tileBackward.dqQuadOrder = dqQuadOrder;
  // The dQ pass's tiles follow the GPU's rule for these warps, on both
  // targets: the CPU runs the programs the GPU runs.
  // (Out-of-range warps are the GPU lowering's error to name.)
  if (config.warps >= 1 && config.warps <= 16)
    tileBackward.warps = config.warps;
  pm.addPass(attn::createTileAttentionBackward(tileBackward));
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void buildCpuLoweringPipeline(OpPassManager &pm) {
  pm.addPass(conversion::createLowerTileToLoops());
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

void buildCpuPipeline(OpPassManager &pm, const TileConfig &config,
                      bool dqQuadOrder, int64_t lead) {
  buildTilingPipeline(pm, config, dqQuadOrder, lead);
  buildCpuLoweringPipeline(pm);
}

void buildGpuPipeline(OpPassManager &pm, const TileConfig &config,
                      const GpuLoweringConfig &gpu, bool stopAtGpu,
                      bool dqQuadOrder, int64_t lead) {
  buildTilingPipeline(pm, config, dqQuadOrder, lead);
  buildGpuLoweringPipeline(pm, config.warps, gpu, stopAtGpu);
}

void buildGpuLoweringPipeline(OpPassManager &pm, int64_t warps,
                              const GpuLoweringConfig &gpu, bool stopAtGpu) {
  pm.addPass(conversion::createLowerTiledToGPU(warps, gpu));
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  if (stopAtGpu)
    return;
  pm.addPass(createSCFToControlFlowPass());
  OpPassManager &gpuPm = pm.nest<gpu::GPUModuleOp>();
  gpuPm.addPass(createConvertGpuOpsToNVVMOps());
  gpuPm.addNestedPass<LLVM::LLVMFuncOp>(conversion::createMarkGridConstants());
  gpuPm.addPass(createCanonicalizerPass());
  gpuPm.addPass(createCSEPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void buildPtxLoweringPipeline(OpPassManager &pm,
                              const FlashjitPtxPipelineOptions &options) {
  buildGpuLoweringPipeline(pm, options.warps, options.gpuConfig());
  target::GpuModuleToPtxOptions ptx;
  ptx.chip = options.chip;
  ptx.ptxVersion = options.ptxVersion;
  pm.addPass(target::createGpuModuleToPtx(ptx));
}

/// The registered pipelines' options, as the C++ builders take them.
static TileConfig toConfig(const FlashjitPipelineOptions &options) {
  TileConfig config;
  config.blockM = options.blockM;
  config.blockN = options.blockN;
  config.warps = options.warps;
  if (options.kvSplit)
    config.splits = TileConfig::kAutoSplits;
  config.overlapSoftmax = options.overlapSoftmax;
  // The text names the bias product's choice (tilingOptions), not the
  // ring's depth that made it: a deeper ring stands for "none".
  if (options.overlapSoftmax && !options.biasProduct)
    config.stages = kBiasProductMaxStages + 1;
  return config;
}

void registerFlashjitPasses() {
  attn::registerAttnPasses();
  conversion::registerConversionPasses();
  target::registerTargetPasses();
  PassPipelineRegistration<FlashjitPipelineOptions>(
      "flashjit-gpu-pipeline",
      "attn -> gpu.module in LLVM + NVVM (tensor-core kernel)",
      [](OpPassManager &pm, const FlashjitPipelineOptions &options) {
        buildGpuPipeline(pm, toConfig(options), options.gpuConfig(),
                         /*stopAtGpu=*/false, options.dqQuadOrder,
                         options.softmaxLead);
      });
  PassPipelineRegistration<FlashjitPipelineOptions>(
      "flashjit-tile-to-gpu-pipeline",
      "tile IR -> gpu.module in LLVM + NVVM (block-m, block-n: the IR's)",
      [](OpPassManager &pm, const FlashjitPipelineOptions &options) {
        buildGpuLoweringPipeline(pm, options.warps, options.gpuConfig());
      });
  PassPipelineRegistration<FlashjitPtxPipelineOptions>(
      "flashjit-tile-to-ptx-pipeline",
      "tile IR -> gpu.binary holding the kernels' PTX (as flashjit compile "
      "--emit ptx)",
      buildPtxLoweringPipeline);
  PassPipelineRegistration<FlashjitPipelineOptions>(
      "flashjit-tiling-pipeline",
      "attn -> tiled FlashAttention-2 IR (the tile dialect + scf/arith/math)",
      [](OpPassManager &pm, const FlashjitPipelineOptions &options) {
        buildTilingPipeline(pm, toConfig(options), options.dqQuadOrder,
                            options.softmaxLead);
      });
  PassPipelineRegistration<FlashjitPipelineOptions>(
      "flashjit-cpu-pipeline",
      "attn -> LLVM dialect for the host (CPU execution mode)",
      [](OpPassManager &pm, const FlashjitPipelineOptions &options) {
        buildCpuPipeline(pm, toConfig(options), options.dqQuadOrder,
                         options.softmaxLead);
      });
  PassPipelineRegistration<>(
      "flashjit-tile-to-cpu-pipeline", "tile IR -> LLVM dialect for the host",
      [](OpPassManager &pm) { buildCpuLoweringPipeline(pm); });
}

void registerFlashjitDialects(DialectRegistry &registry) {
  registry
      .insert<attn::AttnDialect, tile::TileDialect, func::FuncDialect,
              scf::SCFDialect, arith::ArithDialect, math::MathDialect,
              memref::MemRefDialect, cf::ControlFlowDialect, LLVM::LLVMDialect,
              gpu::GPUDialect, NVVM::NVVMDialect, ub::UBDialect>();
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  // convert-gpu-to-nvvm collects its patterns from these interfaces.
  arith::registerConvertArithToLLVMInterface(registry);
  cf::registerConvertControlFlowToLLVMInterface(registry);
  registerConvertFuncToLLVMInterface(registry);
  index::registerConvertIndexToLLVMInterface(registry);
  registerConvertMathToLLVMInterface(registry);
  registerConvertMemRefToLLVMInterface(registry);
  ub::registerConvertUBToLLVMInterface(registry);
  NVVM::registerConvertGpuToNVVMInterface(registry);
  registerConvertNVVMToLLVMInterface(registry);
}

} // namespace flashjit
