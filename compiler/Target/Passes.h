//===- Passes.h - flashjit's target passes ----------------------*- C++ -*-===//
//
/// \file
/// The passes that end flashjit's pipelines in a target's code (Passes.td):
/// flashjit-gpu-module-to-ptx.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_TARGET_PASSES_H
#define FLASHJIT_COMPILER_TARGET_PASSES_H

#include "mlir/Pass/Pass.h"

namespace flashjit::target {

#define GEN_PASS_DECL
#include "compiler/Target/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "compiler/Target/Passes.h.inc"

} // namespace flashjit::target

#endif // FLASHJIT_COMPILER_TARGET_PASSES_H
