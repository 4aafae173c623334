//===- flashjit-opt.cpp - Replay any stage of flashjit's pipeline ---------===//
//
/// \file
/// mlir-opt with flashjit's dialects, passes and named pipelines:
///   flashjit-opt in.mlir --flashjit-tile-attention="block-m=64 block-n=32"
///   flashjit-opt in.mlir --pass-pipeline='builtin.module(
///       flashjit-cpu-pipeline{block-m=64 block-n=64})'
///   flashjit-opt tile.mlir --pass-pipeline='builtin.module(
///       flashjit-tile-to-ptx-pipeline{warps=4 chip=sm_90a})'  // gpu.binary
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  flashjit::registerFlashjitDialects(registry);
  flashjit::registerFlashjitPasses();
  // The upstream passes flashjit's pipelines use, so each step replays alone.
  mlir::registerTransformsPasses();
  mlir::registerSCFToControlFlowPass();
  mlir::registerConvertMathToLLVMPass();
  mlir::registerArithToLLVMConversionPass();
  mlir::registerConvertIndexToLLVMPass();
  mlir::registerFinalizeMemRefToLLVMConversionPass();
  mlir::registerConvertFuncToLLVMPass();
  mlir::registerConvertControlFlowToLLVMPass();
  mlir::registerReconcileUnrealizedCastsPass();
  mlir::memref::registerExpandStridedMetadataPass();
  // Invalid IR, a failing pass or a bad pass option is a usage error of
  // flashjit's tools: exit 2, as the flashjit CLI.
  return mlir::failed(mlir::MlirOptMain(
             argc, argv, "flashjit optimizer driver\n", registry))
             ? 2
             : 0;
}
