//===- Passes.h - flashjit's attn passes ------------------------*- C++ -*-===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_PASSES_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_PASSES_H

#include "dialects/Tile/IR/TileDialect.h"
#include "mlir/Pass/Pass.h"

namespace flashjit::attn {

#define GEN_PASS_DECL
#include "dialects/Attn/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "dialects/Attn/Transforms/Passes.h.inc"

} // namespace flashjit::attn

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_PASSES_H
