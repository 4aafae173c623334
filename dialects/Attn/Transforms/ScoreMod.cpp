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
///
/// A captured tensor (an argument after kv_idx, memref<?xf32>) is the
/// tiled function's buffer for it, and its load a gather at the index
/// tile. Before:
///
///   ^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index,
///        %slopes: memref<?xf32>):
///     %x = memref.load %slopes[%h] : memref<?xf32>
///
/// After (%H: the splat of the program's head; %arg33 the kernel's
/// capture0):
///
///   %x = tile.gather %arg33[%H] : memref<?xf32>, tensor<64x64xi32>
///       -> tensor<64x64xf32>
///
/// For the backward, inlineScoreModWithDerivative also builds d S2 / d S
/// beside each op, by the chain rule (softcap's C tanh(s / C): (1 - t^2),
/// t = tanh(s / C), times the 1 / C of the division and the C of the
/// product), which carries dS back to the scaled score.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/ScoreMod.h"

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
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
               << (isMaskModRegion(region) ? "mask_mod" : "score_mod")
               << ": the index constant " << v.getInt()
               << " does not fit in i32 (index values are i32 on tiles)";
      continue;
    }
    if (isa<memref::LoadOp>(inner)) // a captured tensor's: a tile.gather
      continue;
    if (!OpTrait::hasElementwiseMappableTraits(&inner))
      return op->emitOpError()
             << (isMaskModRegion(region) ? "mask_mod" : "score_mod") << ": '"
             << inner.getName()
                               << "' is not elementwise; it cannot run on "
                                  "tiles";
  }
  return success();
}

bool scoreModUses(Region &region, unsigned i) {
  unsigned arg = isMaskModRegion(region) ? i - 1 : i;
  return !region.front().getArgument(arg).use_empty();
}

bool scoreModIndexAddresses(Region &region, unsigned i) {
  unsigned arg = isMaskModRegion(region) ? i - 1 : i;
  SmallVector<Value> work{region.front().getArgument(arg)};
  llvm::SmallPtrSet<Operation *, 8> seen;
  while (!work.empty()) {
    Value v = work.pop_back_val();
    for (OpOperand &use : v.getUses()) {
      Operation *user = use.getOwner();
      if (auto load = dyn_cast<memref::LoadOp>(user);
          load && use.getOperandNumber() > 0)
        return true; // an index of the load
      if (seen.insert(user).second)
        llvm::append_range(work, user->getResults());
    }
  }
  return false;
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

/// inlineScoreMod's clone of \p region on tiles; \p each sees every op it
/// cloned (but constants and index casts) with its tiled clone, in order.
/// A mask_mod region (no score argument) clones the same way on tiles of
/// \p shape, \p scores null.
static FailureOr<Value>
cloneOnTiles(OpBuilder &b, Location loc, Region &region, ArrayRef<int64_t> shape,
             Value scores, const ScoreModIndices &indices,
             function_ref<LogicalResult(Operation &, Operation *)> each) {
  Block &body = region.front();
  Type i32 = b.getI32Type();
  auto onTiles = [&](Type t) {
    return RankedTensorType::get(shape, t.isIndex() ? i32 : t);
  };
  IRMapping map;
  const unsigned lead = modifierIndexArgs(region);
  if (scores)
    map.map(body.getArgument(0), scores);
  const Value args[] = {indices.batch, indices.head, indices.qIdx,
                        indices.kvIdx};
  for (auto [arg, tile] :
       llvm::zip(body.getArguments().slice(lead - 4, 4), args))
    if (!arg.use_empty()) {
      assert(tile && "the tiling builds every index tile the region uses");
      map.map(arg, tile);
    }
  auto captured = body.getArguments().drop_front(lead);
  assert(captured.size() == indices.captures.size() &&
         "the tiling gives the kernel a buffer per captured tensor");
  for (auto [arg, buffer] : llvm::zip_equal(captured, indices.captures))
    map.map(arg, buffer);
  for (Operation &op : body.without_terminator()) {
    if (auto load = dyn_cast<memref::LoadOp>(op)) {
      // A captured tensor's element at an index tile: a gather.
      auto ty = onTiles(load.getType());
      map.map(load.getResult(),
              tile::GatherOp::create(b, loc, ty, map.lookup(load.getMemRef()),
                                     map.lookup(load.getIndices()[0])));
      if (each &&
          failed(each(op, map.lookup(load.getResult()).getDefiningOp())))
        return failure();
      continue;
    }
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
    if (each && failed(each(op, tiled)))
      return failure();
  }
  return map.lookup(cast<YieldOp>(body.getTerminator()).getValue());
}

Value inlineScoreMod(OpBuilder &b, Location loc, Region &region, Value scores,
                     const ScoreModIndices &indices) {
  auto shape = cast<RankedTensorType>(scores.getType()).getShape();
  return *cloneOnTiles(b, loc, region, shape, scores, indices, nullptr);
}

Value inlineMaskMod(OpBuilder &b, Location loc, Region &region,
                    ArrayRef<int64_t> shape, const ScoreModIndices &indices) {
  return *cloneOnTiles(b, loc, region, shape, Value(), indices, nullptr);
}

/// The ops whose derivative Tangents::derive builds (and comparisons,
/// whose i1 result carries none).
static bool isDifferentiable(Operation *op) {
  return isa<arith::AddFOp, arith::SubFOp, arith::NegFOp, arith::MulFOp,
             arith::DivFOp, math::FmaOp, math::TanhOp, math::ExpOp,
             math::Exp2Op, math::LogOp, math::Log2Op, math::SqrtOp,
             math::AbsFOp, arith::MaximumFOp, arith::MaxNumFOp,
             arith::MinimumFOp, arith::MinNumFOp, arith::SelectOp,
             arith::CmpFOp>(op);
}

LogicalResult checkScoreModDifferentiable(Operation *op, Region &region,
                                          int64_t gradCaptures) {
  Block &body = region.front();
  DenseSet<Value> onScore = {body.getArgument(0)};
  for (Operation &inner : body.without_terminator()) {
    if (auto load = dyn_cast<memref::LoadOp>(inner)) {
      unsigned c = capturedTensorOf(load.getMemRef());
      if ((gradCaptures >> c) & 1)
        onScore.insert(load.getResult());
      continue;
    }
    if (llvm::none_of(inner.getOperands(),
                      [&](Value v) { return onScore.contains(v); }))
      continue;
    if (!isDifferentiable(&inner))
      return op->emitOpError()
             << "score_mod: the backward cannot differentiate '"
             << inner.getName() << "' with respect to the score"
             << (gradCaptures ? " or the captured tensors of capture_grads"
                              : "")
             << " (it "
             << "differentiates arith's add, sub, neg, mul, div, min, max, "
                "select and math's fma, tanh, exp, exp2, log, log2, sqrt, "
                "absf)";
    // A comparison's i1 carries no tangent: what is made of it (andi, ori
    // of predicates, a select's condition) needs none.
    for (Value r : inner.getResults())
      if (isa<FloatType>(r.getType()))
        onScore.insert(r);
  }
  return success();
}

namespace {
/// Forward-mode differentiation of a score_mod on tiles: the tangent
/// d v / d score of each f32 value v of the region (null: 0, a value that
/// does not depend on the score).
struct Tangents {
  OpBuilder &b;
  Location loc;
  DenseMap<Value, Value> of;

  /// The tangents of a seed \p x (d x / d x = 1; every other value 0 until
  /// derive() gives it one).
  static Tangents seededAt(OpBuilder &b, Location loc, Value x) {
    Tangents t{b, loc, DenseMap<Value, Value>()};
    t.of[x] = t.constLike(x, 1.0);
    return t;
  }

  Value get(Value v) const { return of.lookup(v); }
  Value zeroLike(Value v) { return constLike(v, 0.0); }
  Value constLike(Value v, double c) {
    auto ty = cast<RankedTensorType>(v.getType());
    return arith::ConstantOp::create(
        b, loc, ty, DenseElementsAttr::get(ty, b.getF32FloatAttr(c)));
  }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivFOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value neg(Value x) { return arith::NegFOp::create(b, loc, x); }
  /// x + y with null as 0.
  Value add(Value x, Value y) {
    if (!x || !y)
      return x ? x : y;
    return arith::AddFOp::create(b, loc, x, y);
  }
  /// select(c, x, y) with null as 0 (null when both are).
  Value select(Value c, Value x, Value y, Value like) {
    if (!x && !y)
      return Value();
    return arith::SelectOp::create(b, loc, c, x ? x : zeroLike(like),
                                   y ? y : zeroLike(like));
  }
  Value cmp(arith::CmpFPredicate p, Value x, Value y) {
    return arith::CmpFOp::create(b, loc, p, x, y);
  }

  /// The tangent of \p tiled's result from its operands' (\p op: the
  /// region's op it clones, for the error).
  LogicalResult derive(Operation &op, Operation *tiled) {
    SmallVector<Value> x(tiled->getOperands()), dx;
    for (Value v : x)
      dx.push_back(get(v));
    if (llvm::none_of(dx, [](Value v) { return bool(v); }))
      return success(); // constant in the score
    Value y = tiled->getResult(0), dy;
    using P = arith::CmpFPredicate;
    if (isa<arith::AddFOp>(tiled))
      dy = add(dx[0], dx[1]);
    else if (isa<arith::SubFOp>(tiled))
      dy = add(dx[0], dx[1] ? neg(dx[1]) : Value());
    else if (isa<arith::NegFOp>(tiled))
      dy = neg(dx[0]);
    else if (isa<arith::MulFOp>(tiled))
      dy = add(dx[0] ? mul(dx[0], x[1]) : Value(),
               dx[1] ? mul(x[0], dx[1]) : Value());
    else if (isa<arith::DivFOp>(tiled)) // (dx0 - y dx1) / x1
      dy = div(add(dx[0], dx[1] ? neg(mul(y, dx[1])) : Value()), x[1]);
    else if (isa<math::FmaOp>(tiled))
      dy = add(add(dx[0] ? mul(dx[0], x[1]) : Value(),
                   dx[1] ? mul(x[0], dx[1]) : Value()),
               dx[2]);
    else if (isa<math::TanhOp>(tiled))
      dy = mul(sub(constLike(y, 1.0), mul(y, y)), dx[0]);
    else if (isa<math::ExpOp>(tiled))
      dy = mul(y, dx[0]);
    else if (isa<math::Exp2Op>(tiled))
      dy = mul(mul(y, constLike(y, std::log(2.0))), dx[0]);
    else if (isa<math::LogOp>(tiled))
      dy = div(dx[0], x[0]);
    else if (isa<math::Log2Op>(tiled))
      dy = div(dx[0], mul(x[0], constLike(y, std::log(2.0))));
    else if (isa<math::SqrtOp>(tiled))
      dy = div(dx[0], mul(y, constLike(y, 2.0)));
    else if (isa<math::AbsFOp>(tiled))
      dy = select(cmp(P::OLT, x[0], zeroLike(y)), neg(dx[0]), dx[0], y);
    else if (isa<arith::MaximumFOp, arith::MaxNumFOp>(tiled))
      dy = select(cmp(P::OGE, x[0], x[1]), dx[0], dx[1], y);
    else if (isa<arith::MinimumFOp, arith::MinNumFOp>(tiled))
      dy = select(cmp(P::OLE, x[0], x[1]), dx[0], dx[1], y);
    else if (isa<arith::SelectOp>(tiled))
      dy = select(x[0], dx[1], dx[2], y);
    else if (isa<arith::CmpFOp>(tiled))
      return success(); // i1: no tangent
    else // checkScoreModDifferentiable refuses it first for the score
      return tiled->emitOpError()
             << "in a score_mod: the backward cannot differentiate '"
             << op.getName()
             << "' with respect to the score or a captured tensor whose "
                "gradient is asked for";
    of[y] = dy;
    return success();
  }
};
} // namespace

FailureOr<std::pair<Value, Value>>
inlineScoreModWithDerivative(OpBuilder &b, Location loc, Region &region,
                             Value scores, const ScoreModIndices &indices) {
  FailureOr<ScoreModDerivatives> d =
      inlineScoreModWithDerivatives(b, loc, region, scores, indices, 0);
  if (failed(d))
    return failure();
  return std::make_pair(d->value, d->dScore);
}

/// One Tangents per seed: the score's, then one per load of a captured
/// tensor in \p gradCaptures, seeded where the load's gather is made (a
/// later op's tangent in each is that op's derivative by its seed).
FailureOr<ScoreModDerivatives>
inlineScoreModWithDerivatives(OpBuilder &b, Location loc, Region &region,
                              Value scores, const ScoreModIndices &indices,
                              int64_t gradCaptures) {
  std::vector<Tangents> seeds = {Tangents::seededAt(b, loc, scores)};
  ScoreModDerivatives out;
  auto each = [&](Operation &op, Operation *tiled) -> LogicalResult {
    if (auto load = dyn_cast<memref::LoadOp>(op)) {
      unsigned c = capturedTensorOf(load.getMemRef());
      if (!((gradCaptures >> c) & 1))
        return success(); // a constant in every seed
      seeds.push_back(Tangents::seededAt(b, loc, tiled->getResult(0)));
      out.reads.push_back({c, cast<tile::GatherOp>(tiled).getIndex(), {}});
      return success();
    }
    for (Tangents &t : seeds)
      if (failed(t.derive(op, tiled)))
        return failure();
    return success();
  };
  auto shape = cast<RankedTensorType>(scores.getType()).getShape();
  FailureOr<Value> y =
      cloneOnTiles(b, loc, region, shape, scores, indices, each);
  if (failed(y))
    return failure();
  out.value = *y;
  auto derivative = [&](Tangents &t) {
    Value d = t.get(*y);
    return d ? d : t.zeroLike(*y);
  };
  out.dScore = derivative(seeds[0]);
  for (size_t r = 0; r < out.reads.size(); ++r)
    out.reads[r].derivative = derivative(seeds[r + 1]);
  return out;
}

} // namespace flashjit::attn::detail
