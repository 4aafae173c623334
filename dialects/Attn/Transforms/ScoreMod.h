//===- ScoreMod.h - A score_mod region, inlined on a score tile -*- C++ -*-===//
//
/// \file
/// Inlining of an attn.flash_fwd score_mod region on a tile of scores,
/// shared by the tiling passes. Internal to dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_SCOREMOD_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_SCOREMOD_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/Region.h"

namespace flashjit::attn::detail {

/// Succeeds when the verified score_mod \p region of \p op can run on
/// tiles; otherwise a named error on \p op: the region uses an argument
/// other than the score (not supported yet) or an op that is not
/// elementwise.
mlir::LogicalResult checkScoreModTileable(mlir::Operation *op,
                                          mlir::Region &region);

/// The score_mod \p region (checked by checkScoreModTileable) applied
/// elementwise to the f32 tile \p scores (the scaled scores), built at
/// \p b's insertion point: its result tile.
mlir::Value inlineScoreMod(mlir::OpBuilder &b, mlir::Location loc,
                           mlir::Region &region, mlir::Value scores);

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_SCOREMOD_H
