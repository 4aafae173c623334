//===- ScoreMod.cpp - A score_mod region, inlined on a score tile ---------===//
//
/// \file
/// The tiling passes run a description's score modifier on whole tiles:
/// each scalar arith / math op of the region becomes the same op on tiles
/// of the score tile's shape (the tile dialect's lowerings handle every
/// elementwise op), a scalar constant becomes a splat constant tile. Index
/// values become i32 tiles, as the masks' positions are: the arguments are
/// the tiles of ScoreModIndices, an index constant an i32 splat, and an
/// index_cast the extension, truncation or nothing that it is on i32. So
/// the CPU mode and every GPU path run the region with no per-variant code.
/// Before (the region, on one score):
///
///   ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
///     %d = arith.subi %j, %i : index
///     %di = arith.index_cast %d : index to i32
///     %df = arith.sitofp %di : i32 to f32
///     attn.yield (arith.addf %s, %df)
///
/// After (on the Br x Bc tile %S of scaled scores; %I and %J hold each
/// element's query and key position, m0 + iota dim 0 and n0 + iota dim 1):
///
///   %d = arith.subi %J, %I : tensor<64x64xi32>
///   %df = arith.sitofp %d : tensor<64x64xi32> to tensor<64x64xf32>
///   %S2 = arith.addf %S, %df : tensor<64x64xf32>
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/ScoreMod.h"

#include "dialects/Attn/IR/AttnDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/TypeUtilities.h"

#include <limits>

using namespace mlir;

namespace flashjit::attn::detail {

LogicalResult checkScoreModTileable(Operation *op, Region &region) {
  Block &body = region.front();
  for (Operation &inner : body.without_terminator()) {
    if (auto c = dyn_cast<arith::ConstantOp>(inner)) {
      auto v = dyn_cast<IntegerAttr>(c.getValue());
      if (c.getType().isIndex() &&
          (v.getInt() < std::numeric_limits<int32_t>::min() ||
           v.getInt() > std::numeric_limits<int32_t>::max()))
        return op->emitOpError()
               << "score_mod: the index constant " << v.getInt()
               << " does not fit in i32 (index values are i32 on tiles)";
      continue;
    }
    if (!OpTrait::hasElementwiseMappableTraits(&inner))
      return op->emitOpError() << "score_mod: '" << inner.getName()
                               << "' is not elementwise; it cannot run on "
                                  "tiles";
  }
  return success();
}

bool scoreModUses(Region &region, unsigned i) {
  return !region.front().getArgument(i).use_empty();
}

/// The integer tile \p v as the integer tile type \p to: sign- (or, for
/// \p isUnsigned, zero-) extended, truncated, or itself.
static Value castInteger(OpBuilder &b, Location loc, Value v,
                         RankedTensorType to, bool isUnsigned) {
  unsigned from = getElementTypeOrSelf(v.getType()).getIntOrFloatBitWidth();
  unsigned width = to.getElementType().getIntOrFloatBitWidth();
  if (from == width)
    return v;
  if (from > width)
    return arith::TruncIOp::create(b, loc, to, v);
  if (isUnsigned)
    return arith::ExtUIOp::create(b, loc, to, v);
  return arith::ExtSIOp::create(b, loc, to, v);
}

Value inlineScoreMod(OpBuilder &b, Location loc, Region &region, Value scores,
                     const ScoreModIndices &indices) {
  Block &body = region.front();
  auto shape = cast<RankedTensorType>(scores.getType()).getShape();
  Type i32 = b.getI32Type();
  auto onTiles = [&](Type t) {
    return RankedTensorType::get(shape, t.isIndex() ? i32 : t);
  };
  IRMapping map;
  map.map(body.getArgument(0), scores);
  const Value args[] = {indices.batch, indices.head, indices.qIdx,
                        indices.kvIdx};
  for (auto [arg, tile] :
       llvm::zip_equal(body.getArguments().drop_front(), args))
    if (!arg.use_empty()) {
      assert(tile && "the tiling builds every index tile the region uses");
      map.map(arg, tile);
    }
  for (Operation &op : body.without_terminator()) {
    if (auto c = dyn_cast<arith::ConstantOp>(op)) {
      auto ty = onTiles(c.getType());
      Attribute v = c.getValue();
      if (c.getType().isIndex())
        v = b.getI32IntegerAttr(cast<IntegerAttr>(v).getInt());
      map.map(c.getResult(), arith::ConstantOp::create(
                                 b, loc, ty, DenseElementsAttr::get(ty, v)));
      continue;
    }
    if (isa<arith::IndexCastOp, arith::IndexCastUIOp>(op)) {
      map.map(op.getResult(0), castInteger(b, loc, map.lookup(op.getOperand(0)),
                                           onTiles(op.getResult(0).getType()),
                                           isa<arith::IndexCastUIOp>(op)));
      continue;
    }
    OperationState state(loc, op.getName());
    for (Value v : op.getOperands())
      state.addOperands(map.lookup(v));
    for (Type t : op.getResultTypes())
      state.addTypes(onTiles(t));
    state.addAttributes(op.getAttrs());
    Operation *tiled = b.create(state);
    map.map(op.getResults(), tiled->getResults());
  }
  return map.lookup(cast<YieldOp>(body.getTerminator()).getValue());
}

} // namespace flashjit::attn::detail
