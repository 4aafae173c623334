//===- MaskModBounds.cpp - Blocks a mask_mod keeps whole, proven ----------===//
//
/// \file
/// A mask_mod region that computes only on positions (index arithmetic and
/// comparisons: causal, windows, prefix-LM, their combinations) can be
/// shown to keep a whole block pair without evaluating it: each index
/// value gets an interval [lo, hi] over the block (q_idx in [q0, q0 + rows
/// - 1], kv_idx in [kv0, kv0 + cols - 1], batch and head as given), each
/// predicate the pair (must be true, must be false), built as scalar IR
/// beside the loop. Where the yield must be true the tiling skips the
/// mask's select on that block, as it does for a layout's full block, so
/// such masks need no block layout to save the mask's work. Before (the
/// region):
///
///   ^bb0(%b: index, %h: index, %i: index, %j: index):
///     %le = arith.cmpi sle, %j, %i : index
///     attn.yield %le : i1
///
/// After (scalars; i in [q0, q0 + Br - 1], j in [n0, n0 + Bc - 1]):
///
///   %jHi = arith.addi %n0, %c(Bc - 1)
///   %full = arith.cmpi sle, %jHi, %q0      // every j <= every i
///
/// A region that reads captured tensors, or holds an op outside the ones
/// bounded here (add, sub, mul by a constant, min, max of index values;
/// the six signed comparisons; and, or, xor of predicates; index and i1
/// constants), proves nothing: the mask runs on every block.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/ScoreMod.h"

#include "dialects/Attn/IR/AttnDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;

namespace flashjit::attn::detail {
namespace {

/// An index value's bounds, or a predicate's: (must be true, must be
/// false), i1 scalars.
struct Bounds {
  Value lo, hi;
};

/// Builds the bounds of each region value from its operands'.
class BlockBounds {
public:
  BlockBounds(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  /// The bounds of \p op's result, or failure for an op not bounded here.
  LogicalResult derive(Operation &op) {
    using P = arith::CmpIPredicate;
    Value r = op.getNumResults() == 1 ? op.getResult(0) : Value();
    if (!r || !(r.getType().isIndex() || r.getType().isInteger(1)))
      return failure();
    auto in = [&](unsigned i) { return of.lookup(op.getOperand(i)); };
    Bounds out;
    if (auto c = dyn_cast<arith::ConstantOp>(op)) {
      auto v = dyn_cast<IntegerAttr>(c.getValue());
      if (!v)
        return failure();
      if (r.getType().isIndex()) {
        Value x = arith::ConstantIndexOp::create(b, loc, v.getInt());
        out = {x, x};
      } else {
        bool t = v.getValue().getBoolValue();
        out = {boolean(t), boolean(!t)};
      }
    } else if (isa<arith::AddIOp>(op)) {
      out = {add(in(0).lo, in(1).lo), add(in(0).hi, in(1).hi)};
    } else if (isa<arith::SubIOp>(op)) {
      out = {sub(in(0).lo, in(1).hi), sub(in(0).hi, in(1).lo)};
    } else if (isa<arith::MulIOp>(op)) {
      // By a constant only: c >= 0 keeps the order, c < 0 swaps it.
      std::optional<int64_t> c;
      unsigned other = 0;
      for (unsigned i : {0u, 1u})
        if (auto k = getConstantIntValue(op.getOperand(i))) {
          c = *k;
          other = 1 - i;
        }
      if (!c)
        return failure();
      Value k = arith::ConstantIndexOp::create(b, loc, *c);
      Value lo = mul(in(other).lo, k), hi = mul(in(other).hi, k);
      out = *c >= 0 ? Bounds{lo, hi} : Bounds{hi, lo};
    } else if (isa<arith::MaxSIOp, arith::MinSIOp>(op)) {
      bool max = isa<arith::MaxSIOp>(op);
      auto pick = [&](Value x, Value y) {
        return max ? Value(arith::MaxSIOp::create(b, loc, x, y))
                   : Value(arith::MinSIOp::create(b, loc, x, y));
      };
      out = {pick(in(0).lo, in(1).lo), pick(in(0).hi, in(1).hi)};
    } else if (auto cmp = dyn_cast<arith::CmpIOp>(op)) {
      if (!op.getOperand(0).getType().isIndex())
        return failure();
      Bounds x = in(0), y = in(1);
      switch (cmp.getPredicate()) {
      case P::slt: // x < y for all: x.hi < y.lo; never: x.lo >= y.hi
        out = {lt(x.hi, y.lo), ge(x.lo, y.hi)};
        break;
      case P::sle:
        out = {le(x.hi, y.lo), gt(x.lo, y.hi)};
        break;
      case P::sgt:
        out = {gt(x.lo, y.hi), le(x.hi, y.lo)};
        break;
      case P::sge:
        out = {ge(x.lo, y.hi), lt(x.hi, y.lo)};
        break;
      case P::eq: // both single values and equal; disjoint ranges
        out = {andI(andI(eq(x.lo, x.hi), eq(y.lo, y.hi)), eq(x.lo, y.lo)),
               orI(lt(x.hi, y.lo), gt(x.lo, y.hi))};
        break;
      case P::ne:
        out = {orI(lt(x.hi, y.lo), gt(x.lo, y.hi)),
               andI(andI(eq(x.lo, x.hi), eq(y.lo, y.hi)), eq(x.lo, y.lo))};
        break;
      default: // unsigned: positions are not negative, but keep it simple
        return failure();
      }
    } else if (isa<arith::AndIOp>(op) && r.getType().isInteger(1)) {
      out = {andI(in(0).lo, in(1).lo), orI(in(0).hi, in(1).hi)};
    } else if (isa<arith::OrIOp>(op) && r.getType().isInteger(1)) {
      out = {orI(in(0).lo, in(1).lo), andI(in(0).hi, in(1).hi)};
    } else if (isa<arith::XOrIOp>(op) && r.getType().isInteger(1)) {
      // x ^ y is surely true where one is sure and the other surely not.
      Bounds x = in(0), y = in(1);
      out = {orI(andI(x.lo, y.hi), andI(x.hi, y.lo)),
             orI(andI(x.lo, y.lo), andI(x.hi, y.hi))};
    } else {
      return failure();
    }
    of[r] = out;
    return success();
  }

  llvm::DenseMap<Value, Bounds> of;

private:
  Value boolean(bool v) {
    return arith::ConstantOp::create(b, loc, b.getBoolAttr(v));
  }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value andI(Value x, Value y) { return arith::AndIOp::create(b, loc, x, y); }
  Value orI(Value x, Value y) { return arith::OrIOp::create(b, loc, x, y); }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  Value lt(Value x, Value y) { return cmp(arith::CmpIPredicate::slt, x, y); }
  Value le(Value x, Value y) { return cmp(arith::CmpIPredicate::sle, x, y); }
  Value gt(Value x, Value y) { return cmp(arith::CmpIPredicate::sgt, x, y); }
  Value ge(Value x, Value y) { return cmp(arith::CmpIPredicate::sge, x, y); }
  Value eq(Value x, Value y) { return cmp(arith::CmpIPredicate::eq, x, y); }

  OpBuilder &b;
  Location loc;
};

} // namespace

bool maskModIsBounded(Region &region) {
  if (capturedTensors(region) != 0)
    return false;
  for (Operation &op : region.front().without_terminator()) {
    Type t = op.getNumResults() == 1 ? op.getResult(0).getType() : Type();
    if (!t || !(t.isIndex() || t.isInteger(1)))
      return false;
    if (!isa<arith::ConstantOp, arith::AddIOp, arith::SubIOp, arith::MulIOp,
             arith::MaxSIOp, arith::MinSIOp, arith::CmpIOp, arith::AndIOp,
             arith::OrIOp, arith::XOrIOp>(op))
      return false;
  }
  return true;
}

Value maskModKeepsBlock(OpBuilder &b, Location loc, Region &region,
                        const BlockPositions &at) {
  if (!maskModIsBounded(region))
    return Value();
  BlockBounds bounds(b, loc);
  Block &body = region.front();
  const std::pair<Value, Value> args[] = {{at.batchLo, at.batchHi},
                                          {at.headLo, at.headHi},
                                          {at.qLo, at.qHi},
                                          {at.kvLo, at.kvHi}};
  for (auto [arg, range] : llvm::zip_equal(body.getArguments(), args))
    bounds.of[arg] = {range.first, range.second};
  for (Operation &op : body.without_terminator())
    if (failed(bounds.derive(op)))
      return Value(); // maskModIsBounded let it through: keep the mask
  return bounds.of.lookup(cast<YieldOp>(body.getTerminator()).getValue()).lo;
}

Value maskModNeeded(OpBuilder &b, Location loc, Region &region,
                    Value layoutFull, const BlockPositions &at) {
  Value full = layoutFull;
  if (Value proven = maskModKeepsBlock(b, loc, region, at))
    full = full ? Value(arith::OrIOp::create(b, loc, full, proven)) : proven;
  if (!full)
    return Value();
  return arith::XOrIOp::create(
      b, loc, full, arith::ConstantOp::create(b, loc, b.getBoolAttr(true)));
}

} // namespace flashjit::attn::detail
