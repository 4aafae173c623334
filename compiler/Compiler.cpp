//===- Compiler.cpp - Stages of the pipeline, for the tools ---------------===//

#include "compiler/CompilerInternal.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Target/PTXEmitter.h"
#include "kernels/GpuGeometry.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

using namespace mlir;

namespace flashjit {

Stage parseStage(const std::string &name) {
  static const std::pair<const char *, Stage> stages[] = {
      {"attn", Stage::Attn},       {"tiled", Stage::Tiled},
      {"gpu", Stage::Gpu},         {"llvm", Stage::Llvm},
      {"ptx", Stage::Ptx},         {"cubin", Stage::Cubin},
      {"cpu-llvm", Stage::CpuLlvm}};
  for (auto &[n, stage] : stages)
    if (name == n)
      return stage;
  throw SpecError(fmt::format("--emit: unknown stage '{}' (expected attn, "
                              "tiled, gpu, llvm, ptx, cubin or cpu-llvm)",
                              name));
}

std::unique_ptr<MLIRContext> createContext() {
  DialectRegistry registry;
  registerFlashjitDialects(registry);
  auto ctx =
      std::make_unique<MLIRContext>(registry, MLIRContext::Threading::DISABLED);
  ctx->loadAllAvailableDialects();
  return ctx;
}

/// Collects diagnostics into a string while alive.
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(MLIRContext &ctx)
      : handler(&ctx, [this](Diagnostic &diag) {
          if (!text.empty())
            text += "\n";
          text += diag.str();
          for (Diagnostic &note : diag.getNotes())
            text += "\n  note: " + note.str();
          return success();
        }) {}
  const std::string &str() const { return text; }

private:
  std::string text;
  ScopedDiagnosticHandler handler;
};

OwningOpRef<ModuleOp> parseAttnModule(MLIRContext &ctx,
                                      const AttentionSpec &spec) {
  DiagnosticCollector diags(ctx);
  auto module = parseSourceString<ModuleOp>(attnModuleText(spec, kKernelName),
                                            &ctx, "attn-description");
  if (!module)
    throw CompileError("invalid attention description: " + diags.str());
  return module;
}

void runPipeline(ModuleOp module,
                 const std::function<void(OpPassManager &)> &build) {
  DiagnosticCollector diags(*module.getContext());
  PassManager pm(module.getContext());
  build(pm);
  if (failed(pm.run(module)))
    throw CompileError("pipeline failed: " + diags.str());
}

std::string cpuPipelineText(const TileConfig &config) {
  return fmt::format("builtin.module(flashjit-cpu-pipeline{{block-m={} "
                     "block-n={}}})",
                     config.blockM, config.blockN);
}

/// Checks that \p config and \p target can make a GPU kernel for \p spec.
static PtxOptions checkGpuRequest(const AttentionSpec &spec,
                                  const TileConfig &config,
                                  const GpuTarget &target) {
  std::string problem = spec.direction == Direction::Backward
                            ? gpuBackwardConfigProblem(spec, config, 227 * 1024)
                            : gpuConfigProblem(spec, config, 227 * 1024);
  if (!problem.empty())
    throw SpecError(problem);
  if (target.copyBytes != 2 && target.copyBytes != 4 && target.copyBytes != 8 &&
      target.copyBytes != 16)
    throw SpecError(fmt::format(
        "copy width must be 2, 4, 8 or 16 bytes, got {}", target.copyBytes));
  PtxOptions ptx;
  ptx.arch = target.arch;
  ptx.ptxVersion = choosePtxVersion(target.arch, target.driverVersion);
  checkTarget(ptx); // a named error, never an LLVM "Cannot select"
  return ptx;
}

/// Runs the GPU pipeline on the attn stage of \p spec.
static OwningOpRef<ModuleOp>
lowerToGpu(MLIRContext &ctx, const AttentionSpec &spec,
           const TileConfig &config, const GpuTarget &target, bool stopAtGpu) {
  OwningOpRef<ModuleOp> module = parseAttnModule(ctx, spec);
  GpuPipelineConfig gpu;
  gpu.copyBytes = target.copyBytes;
  gpu.vectorAtomics = usesVectorAtomics(target);
  gpu.wgmma = usesWgmma(target);
  runPipeline(*module, [&](OpPassManager &pm) {
    buildGpuPipeline(pm, config, gpu, stopAtGpu);
  });
  return module;
}

std::string compileToPtx(const AttentionSpec &spec, const TileConfig &config,
                         const GpuTarget &target) {
  spec.validate();
  config.validate(spec);
  PtxOptions ptx = checkGpuRequest(spec, config, target);
  auto ctx = createContext();
  auto module = lowerToGpu(*ctx, spec, config, target, false);
  return gpuModuleToPtx(*module, ptx);
}

std::string gpuPipelineText(const TileConfig &config, const GpuTarget &target) {
  return fmt::format(
      "builtin.module(flashjit-gpu-pipeline{{block-m={} "
      "block-n={} warps={} copy-bytes={} vector-atomics={} wgmma={}}})",
      config.blockM, config.blockN, config.warps, target.copyBytes,
      usesVectorAtomics(target), usesWgmma(target));
}

bool usesWgmma(const GpuTarget &target) {
  // FLASHJIT_WGMMA=0 keeps mma.sync (for comparisons); the pipeline text,
  // part of the cache key, records the choice.
  const char *env = std::getenv("FLASHJIT_WGMMA");
  return target.arch == "sm_90a" && !(env && std::string(env) == "0");
}

bool usesVectorAtomics(const GpuTarget &target) {
  const std::string &arch = target.arch;
  int sm = 0;
  if (arch.rfind("sm_", 0) == 0)
    sm = std::atoi(arch.c_str() + 3);
  return sm >= 90 && choosePtxVersion(arch, target.driverVersion) >= 81;
}

std::string emitStage(const AttentionSpec &spec, const TileConfig &config,
                      Stage stage, const GpuTarget &target) {
  spec.validate();
  config.validate(spec);
  auto ctx = createContext();
  OwningOpRef<ModuleOp> module = parseAttnModule(*ctx, spec);
  std::string out;
  llvm::raw_string_ostream os(out);
  switch (stage) {
  case Stage::Attn:
    module->print(os);
    break;
  case Stage::Tiled:
    runPipeline(*module,
                [&](OpPassManager &pm) { buildTilingPipeline(pm, config); });
    module->print(os);
    break;
  case Stage::Gpu:
    checkGpuRequest(spec, config, target);
    lowerToGpu(*ctx, spec, config, target, true)->print(os);
    break;
  case Stage::Llvm:
  case Stage::Ptx: {
    PtxOptions ptx = checkGpuRequest(spec, config, target);
    auto gpuModule = lowerToGpu(*ctx, spec, config, target, false);
    os << (stage == Stage::Llvm ? gpuModuleToLLVMIR(*gpuModule, ptx)
                                : gpuModuleToPtx(*gpuModule, ptx));
    break;
  }
  case Stage::Cubin:
    throw SpecError("emitStage: the cubin is made from the PTX by nvJitLink");
  case Stage::CpuLlvm: {
    runPipeline(*module,
                [&](OpPassManager &pm) { buildCpuPipeline(pm, config); });
    llvm::LLVMContext llvmCtx;
    auto llvmModule = translateModuleToLLVMIR(*module, llvmCtx);
    if (!llvmModule)
      throw CompileError("translation to LLVM IR failed");
    llvmModule->print(os, nullptr);
    break;
  }
  }
  return out;
}

} // namespace flashjit
