//===- Passes.h - flashjit's conversions ------------------------*- C++ -*-===//
#ifndef FLASHJIT_COMPILER_CONVERSION_PASSES_H
#define FLASHJIT_COMPILER_CONVERSION_PASSES_H

#include "compiler/Conversion/GpuLoweringConfig.h"

#include "mlir/Pass/Pass.h"

namespace flashjit::conversion {

#define GEN_PASS_DECL
#include "compiler/Conversion/Passes.h.inc"

/// flashjit-lower-tiled-to-gpu with \p warps warps per thread block and the
/// knobs of \p config (the generated createLowerTiledToGPU() takes the
/// options' defaults).
std::unique_ptr<mlir::Pass>
createLowerTiledToGPU(int64_t warps, const GpuLoweringConfig &config);

#define GEN_PASS_REGISTRATION
#include "compiler/Conversion/Passes.h.inc"

} // namespace flashjit::conversion

#endif // FLASHJIT_COMPILER_CONVERSION_PASSES_H
