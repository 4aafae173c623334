//===- Compiler.cpp - Stages of the pipeline, for the tools ---------------===//

#include "compiler/CompilerInternal.h"
#include "compiler/Pipelines/Pipelines.h"

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
  if (name == "attn")
    return Stage::Attn;
  if (name == "tiled")
    return Stage::Tiled;
  if (name == "llvm")
    return Stage::Llvm;
  throw SpecError(fmt::format(
      "--emit: unknown stage '{}' (expected attn, tiled or llvm)", name));
}

std::unique_ptr<MLIRContext> createContext() {
  DialectRegistry registry;
  registerFlashjitDialects(registry);
  auto ctx = std::make_unique<MLIRContext>(registry,
                                           MLIRContext::Threading::DISABLED);
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
  auto module = parseSourceString<ModuleOp>(
      attnModuleText(spec, kKernelName), &ctx, "attn-description");
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

std::string emitStage(const AttentionSpec &spec, const TileConfig &config,
                      Stage stage) {
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
  case Stage::Llvm: {
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
