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
/// A mask_mod region's leading arguments: (batch, head, q_idx, kv_idx).
inline constexpr unsigned kMaskModIndexArgs = 4;
/// Whether \p region is a description's mask_mod (its second region; the
/// first is score_mod, in attn.flash_fwd and attn.flash_bwd alike).
inline bool isMaskModRegion(mlir::Region &region) {
  return region.getRegionNumber() == 1;
}
/// The leading (non-captured) arguments of modifier \p region.
inline unsigned modifierIndexArgs(mlir::Region &region) {
  return isMaskModRegion(region) ? kMaskModIndexArgs : kScoreModIndexArgs;
}
/// How many tensors modifier \p region captures (its arguments after
/// kv_idx; the verifier checked there are at least its leading ones); 0
/// for an empty region.
inline int64_t capturedTensors(mlir::Region &region) {
  if (region.empty())
    return 0;
  return int64_t(region.front().getNumArguments()) -
         modifierIndexArgs(region);
}
/// Which captured tensor of its region \p memref is: a modifier region's
/// argument after kv_idx (what its memref.load reads; the verifier allows
/// no other).
inline unsigned capturedTensorOf(mlir::Value memref) {
  auto arg = mlir::cast<mlir::BlockArgument>(memref);
  return arg.getArgNumber() - modifierIndexArgs(*arg.getParentRegion());
}
/// The captured tensors of description \p op (attn.flash_fwd or
/// attn.flash_bwd): its score_mod's, then its mask_mod's. The kernel takes
/// a buffer for each, in that order, after its ABI's.
template <typename OpT> int64_t totalCapturedTensors(OpT op) {
  return capturedTensors(op.getScoreMod()) + capturedTensors(op.getMaskMod());
}
} // namespace flashjit::attn

#endif // FLASHJIT_DIALECTS_ATTN_IR_ATTNDIALECT_H
