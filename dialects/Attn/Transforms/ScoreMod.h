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
/// tiles; otherwise a named error on \p op: an op that is not elementwise,
/// or an index constant that the tiles' i32 cannot hold.
mlir::LogicalResult checkScoreModTileable(mlir::Operation *op,
                                          mlir::Region &region);

/// The index arguments of a score_mod region as i32 tiles of the score
/// tile's shape: each element's batch, query head, and absolute query and
/// key positions. Null for an argument the region does not use.
struct ScoreModIndices {
  mlir::Value batch, head, qIdx, kvIdx;
  /// The captured tensors (the region's arguments after kv_idx): the tiled
  /// function's buffers for them, in order.
  llvm::SmallVector<mlir::Value> captures;
};

/// Whether \p region uses its index argument \p i (1 = batch, 2 = head,
/// 3 = q_idx, 4 = kv_idx, in a mask_mod region too, whose arguments start
/// at batch): the tiling builds only the tiles it uses.
bool scoreModUses(mlir::Region &region, unsigned i);

/// Whether \p region's index argument \p i (as scoreModUses) addresses a
/// captured tensor: some memref.load's index depends on it. Only such
/// positions are clamped into the problem (the tiles' padding elements
/// would read past the tensor); a position used only as a number (ALiBi's
/// j - i) keeps its affine form.
bool scoreModIndexAddresses(mlir::Region &region, unsigned i);

/// The score_mod \p region (checked by checkScoreModTileable) applied
/// elementwise to the f32 tile \p scores (the scaled scores), built at
/// \p b's insertion point: its result tile. Index values become i32 tiles
/// (\p indices for the arguments).
mlir::Value inlineScoreMod(mlir::OpBuilder &b, mlir::Location loc,
                           mlir::Region &region, mlir::Value scores,
                           const ScoreModIndices &indices);

/// The mask_mod \p region (checked by checkScoreModTileable) evaluated
/// elementwise on tiles of \p shape, built at \p b's insertion point: its
/// i1 result tile (true: keep the score). Index values as inlineScoreMod's.
mlir::Value inlineMaskMod(mlir::OpBuilder &b, mlir::Location loc,
                          mlir::Region &region, llvm::ArrayRef<int64_t> shape,
                          const ScoreModIndices &indices);

/// The positions of a block pair, as index scalars (inclusive bounds):
/// batch and head (lo = hi but where GQA packing spans a group's heads),
/// query and key positions.
struct BlockPositions {
  mlir::Value batchLo, batchHi, headLo, headHi, qLo, qHi, kvLo, kvHi;
};

/// Whether mask_mod \p region is one maskModKeepsBlock bounds: positions
/// only (no captured tensors), index arithmetic and signed comparisons,
/// predicates combined by and, or, xor (MaskModBounds.cpp).
bool maskModIsBounded(mlir::Region &region);

/// An i1 scalar, built at \p b's insertion point, that holds where the
/// mask_mod \p region surely keeps every element of the block pair \p at
/// (interval bounds over its ops); null where the region is not bounded
/// (then nothing is proven and the mask runs on every block).
mlir::Value maskModKeepsBlock(mlir::OpBuilder &b, mlir::Location loc,
                              mlir::Region &region, const BlockPositions &at);

/// Whether a block pair \p at needs the mask_mod \p region: not where
/// \p layoutFull (the layout's full mark, an i1; null without a layout)
/// holds or maskModKeepsBlock proves it; an i1 built at \p b's insertion
/// point, or null when neither can say (the mask runs on every block).
mlir::Value maskModNeeded(mlir::OpBuilder &b, mlir::Location loc,
                          mlir::Region &region, mlir::Value layoutFull,
                          const BlockPositions &at);

/// Succeeds when the backward can differentiate \p region (of \p op) with
/// respect to the score: every op that depends on it is one that
/// inlineScoreModWithDerivative derives; else a named error on \p op.
mlir::LogicalResult checkScoreModDifferentiable(mlir::Operation *op,
                                                mlir::Region &region,
                                                int64_t gradCaptures = 0);

/// inlineScoreMod, and the derivative of its result with respect to the
/// score, elementwise (forward mode over the region's ops: arith's add,
/// sub, neg, mul, div, min, max, select, math's fma, tanh, exp, exp2, log,
/// log2, sqrt, absf; index values carry none). A named error on the op the
/// backward cannot differentiate.
mlir::FailureOr<std::pair<mlir::Value, mlir::Value>>
inlineScoreModWithDerivative(mlir::OpBuilder &b, mlir::Location loc,
                             mlir::Region &region, mlir::Value scores,
                             const ScoreModIndices &indices);

/// A load of a captured tensor whose gradient the backward accumulates: the
/// tensor, the index tile its gather read, and the derivative of the
/// modified score with respect to the loaded value (elementwise).
struct CaptureRead {
  unsigned capture;
  mlir::Value index, derivative;
};

/// The modified scores, their derivative with respect to the score, and the
/// captured tensors' loads with theirs.
struct ScoreModDerivatives {
  mlir::Value value, dScore;
  llvm::SmallVector<CaptureRead> reads;
};

/// inlineScoreModWithDerivative, and for each load of a captured tensor c
/// with bit c of \p gradCaptures set (in program order) a CaptureRead: the
/// same forward mode, seeded at the loaded value. A named error on an op
/// that depends on such a load and has no derivative.
mlir::FailureOr<ScoreModDerivatives>
inlineScoreModWithDerivatives(mlir::OpBuilder &b, mlir::Location loc,
                              mlir::Region &region, mlir::Value scores,
                              const ScoreModIndices &indices,
                              int64_t gradCaptures);

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_SCOREMOD_H
