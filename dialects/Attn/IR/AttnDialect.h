//===- AttnDialect.h - The attn dialect -------------------------*- C++ -*-===//
//
/// \file
/// Declares the attn dialect and its ops (generated from AttnOps.td).
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_IR_ATTNDIALECT_H
#define FLASHJIT_DIALECTS_ATTN_IR_ATTNDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <optional>
#include <string>

#include "dialects/Attn/IR/AttnDialect.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/Attn/IR/AttnAttrs.h.inc"

#define GET_OP_CLASSES
#include "dialects/Attn/IR/AttnOps.h.inc"

namespace flashjit::attn {
/// A score_mod region's leading arguments: (score, batch, head, q_idx,
/// kv_idx); its captured tensors follow them.
inline constexpr unsigned kScoreModIndexArgs = 5;
/// How many tensors score_mod \p region captures (its arguments after
/// kv_idx; the verifier checked there are at least kScoreModIndexArgs).
inline int64_t capturedTensors(mlir::Region &region) {
  return int64_t(region.front().getNumArguments()) - kScoreModIndexArgs;
}
/// Which captured tensor \p memref is: a score_mod region's argument after
/// kv_idx (what its memref.load reads; the verifier allows no other).
inline unsigned capturedTensorOf(mlir::Value memref) {
  return mlir::cast<mlir::BlockArgument>(memref).getArgNumber() -
         kScoreModIndexArgs;
}
} // namespace flashjit::attn

#endif // FLASHJIT_DIALECTS_ATTN_IR_ATTNDIALECT_H
