//===- ScoreMod.cpp - A score_mod region, inlined on a score tile ---------===//
//
/// \file
/// The tiling passes run a description's score modifier on whole tiles:
/// each scalar arith / math op of the region becomes the same op on tiles
/// of the score tile's shape (the tile dialect's lowerings handle every
/// elementwise op), a scalar constant becomes a splat constant tile. So
/// the CPU mode and every GPU path run the region with no per-variant code.
/// Before (the region, on one score):
///
///   ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
///     %c = arith.constant 2.0e+01 : f32
///     %t = math.tanh (arith.divf %s, %c)
///     attn.yield (arith.mulf %t, %c)
///
/// After (on the Br x Bc tile %S of scaled scores):
///
///   %c = arith.constant dense<2.0e+01> : tensor<64x64xf32>
///   %t = math.tanh (arith.divf %S, %c) : tensor<64x64xf32>
///   %S2 = arith.mulf %t, %c : tensor<64x64xf32>
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/ScoreMod.h"

#include "dialects/Attn/IR/AttnDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/IRMapping.h"

using namespace mlir;

namespace flashjit::attn::detail {

LogicalResult checkScoreModTileable(Operation *op, Region &region) {
  Block &body = region.front();
  for (BlockArgument arg : body.getArguments().drop_front())
    if (!arg.use_empty())
      return op->emitOpError() << "score_mod uses q_idx/kv_idx/batch/head: "
                                  "not supported yet";
  for (Operation &inner : body.without_terminator())
    if (!isa<arith::ConstantOp>(inner) &&
        !OpTrait::hasElementwiseMappableTraits(&inner))
      return op->emitOpError() << "score_mod: '" << inner.getName()
                               << "' is not elementwise; it cannot run on "
                                  "tiles";
  return success();
}

Value inlineScoreMod(OpBuilder &b, Location loc, Region &region,
                     Value scores) {
  Block &body = region.front();
  auto shape = cast<RankedTensorType>(scores.getType()).getShape();
  IRMapping map;
  map.map(body.getArgument(0), scores);
  auto onTiles = [&](Type t) { return RankedTensorType::get(shape, t); };
  for (Operation &op : body.without_terminator()) {
    if (auto c = dyn_cast<arith::ConstantOp>(op)) {
      auto ty = onTiles(c.getType());
      auto attr = DenseElementsAttr::get(ty, c.getValue());
      map.map(c.getResult(), arith::ConstantOp::create(b, loc, ty, attr));
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
