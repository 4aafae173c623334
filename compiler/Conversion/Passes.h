//===- Passes.h - flashjit's conversions ------------------------*- C++ -*-===//
#ifndef FLASHJIT_COMPILER_CONVERSION_PASSES_H
#define FLASHJIT_COMPILER_CONVERSION_PASSES_H

#include "mlir/Pass/Pass.h"

namespace flashjit::conversion {

#define GEN_PASS_DECL
#include "compiler/Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "compiler/Conversion/Passes.h.inc"

} // namespace flashjit::conversion

#endif // FLASHJIT_COMPILER_CONVERSION_PASSES_H
