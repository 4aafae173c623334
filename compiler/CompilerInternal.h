//===- CompilerInternal.h - Shared by the compiler's sources ----*- C++ -*-===//
//
/// \file
/// Context set-up and pipeline running shared by Compiler.cpp and the
/// targets. Internal: includes MLIR headers.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_COMPILERINTERNAL_H
#define FLASHJIT_COMPILER_COMPILERINTERNAL_H

#include "compiler/Compiler.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <functional>
#include <memory>

namespace mlir {
class ExecutionEngine;
class OpPassManager;
class Operation;
class Region;
} // namespace mlir

namespace flashjit {

/// Collects the diagnostics of a context into a string while alive: one
/// line each, notes indented under theirs; with \p oneLine, all on one
/// line ("; " between them) without their notes (a message inside another,
/// e.g. "score_mod region: ...").
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(mlir::MLIRContext &ctx, bool oneLine = false);
  const std::string &str() const { return text; }

private:
  std::string text;
  mlir::ScopedDiagnosticHandler handler;
};

/// A context with every dialect, interface and translation flashjit uses.
std::unique_ptr<mlir::MLIRContext> createContext();

/// Parses the attn stage of \p spec; throws CompileError with diagnostics.
mlir::OwningOpRef<mlir::ModuleOp> parseAttnModule(mlir::MLIRContext &ctx,
                                                  const AttentionSpec &spec);

/// Parses \p source (the attn stage of \p spec when empty), runs the
/// tiling passes unless it holds the tile stage already (then its Br x Bc
/// are the IR's), then the passes \p afterTiling adds (if any).
mlir::OwningOpRef<mlir::ModuleOp>
loadSource(mlir::MLIRContext &ctx, const AttentionSpec &spec,
           const KernelSource &source, const TileConfig &config,
           const std::function<void(mlir::OpPassManager &)> &afterTiling);

/// JIT-compiles \p module (in the LLVM dialect, for the host) at O2, with
/// flashjit's half-float conversion builtins registered (static libgcc
/// lacks them); throws CompileError.
std::unique_ptr<mlir::ExecutionEngine> jitLoweredModule(mlir::ModuleOp module);

/// The float64 evaluation of score_mod region \p region (verified: its
/// signature and op set are the attn dialect's) for the reference, value
/// and derivative (ScoreModReference.cpp); throws CompileError for an op
/// it does not evaluate.
/// A mask_mod region's evaluation is 1 (keep) or 0. The region's captured
/// tensors are \p firstCapture.. of the \p totalCaptures the evaluation is
/// given.
std::shared_ptr<const ScoreFunction>
scoreFunctionOf(mlir::Region &region, int64_t firstCapture,
                int64_t totalCaptures);
/// Throws SpecError unless the modifier regions of \p module capture as
/// many tensors as \p spec says (ScoreModText.cpp).
void checkScoreModCaptures(mlir::ModuleOp module, const AttentionSpec &spec);

/// The modifiers of description \p op (attn.flash_fwd or attn.flash_bwd)
/// into \p spec: \p named (its namedScoreMod()) when its \p score region is
/// a named variant, else "custom" with its printed region and the region's
/// float64 evaluation; its \p mask region's text and evaluation likewise;
/// the captured tensors' counts. Throws CompileError for a region that
/// cannot run on tiles (ScoreModText.cpp).
void describeModifiers(mlir::Operation *op, std::optional<std::string> named,
                       mlir::Region &score, mlir::Region &mask,
                       AttentionSpec &spec);

/// Runs the pipeline that \p build assembles on \p module; throws
/// CompileError with the diagnostics of the failing pass.
void runPipeline(mlir::ModuleOp module,
                 const std::function<void(mlir::OpPassManager &)> &build);

} // namespace flashjit

#endif // FLASHJIT_COMPILER_COMPILERINTERNAL_H
