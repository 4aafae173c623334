//===- UniformAddend.cpp - A score tile's uniform addend, peeled ----------===//
//
/// \file
/// peelUniformAddend (UniformAddend.h). ALiBi's scores in the KV loop,
/// before (element (r, c) is query m0 + r and key n0 + c; %slope a uniform
/// tile computed before the loop):
///
///   %kv = arith.addi %iota1, splat(%n0)          // in the loop
///   %d  = arith.subi %kv, %q                     // %q = %iota0 + splat(%m0)
///   %b  = arith.mulf %slope, sitofp(%d)
///   %s  = math.fma %S, %scale, %b                // a bias rebuilt each step
///
/// After (the bias's tile moved before the loop; one value a step, on the
/// row shape, which the GPU keeps in one register as it keeps a splat):
///
///   %y  = arith.mulf sitofp(%iota1 - %iota0), %slope       // before it
///   %u  = arith.mulf sitofp(splat(%n0) - splat(%m0)), exp2(...) : <Br>
///   %s2 = math.fma %S, %scale, %y
///
/// and the caller (TiledForwardBuilder::softmax) adds %u to the row max and
/// to each row's exponent offset, so no score pays for it.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/UniformAddend.h"
#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/TypeUtilities.h"
#include "mlir/Interfaces/LoopLikeInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;

namespace {

/// Deeper expressions are left as they are (a score modifier is short).
constexpr int kMaxDepth = 16;

/// Records what a builder inserts, so that a failed split takes it back.
struct InsertedOps : OpBuilder::Listener {
  SmallVector<Operation *> ops;
  void notifyOperationInserted(Operation *op, OpBuilder::InsertPoint) override {
    ops.push_back(op);
  }
  void eraseAll() {
    for (Operation *op : llvm::reverse(ops))
      op->erase();
    ops.clear();
  }
};

/// Whether \p gather reads a buffer that nothing in its function may write
/// (by the ops' memory effects: a captured tensor, a slope per head), so
/// that its value depends on its index alone.
bool readsConstantBuffer(flashjit::tile::GatherOp gather) {
  Value base = gather.getBase();
  return llvm::none_of(base.getUsers(), [&](Operation *user) {
    return mightHaveEffect<MemoryEffects::Write>(user, base);
  });
}

/// Whether tile \p v has one value in every element: a splat, a splat
/// constant, a gather of a constant buffer at a uniform index, or an
/// arith / math op of such tiles.
bool isUniformAt(Value v, int depth) {
  if (depth > kMaxDepth || !isa<RankedTensorType>(v.getType()))
    return false;
  DenseElementsAttr dense;
  if (matchPattern(v, m_Constant(&dense)))
    return dense.isSplat();
  Operation *op = v.getDefiningOp();
  if (!op)
    return false;
  if (isa<flashjit::tile::SplatOp>(op))
    return true;
  if (auto gather = dyn_cast<flashjit::tile::GatherOp>(op))
    return readsConstantBuffer(gather) &&
           isUniformAt(gather.getIndex(), depth + 1);
  if (!isa<arith::ArithDialect, math::MathDialect>(op->getDialect()) ||
      op->getNumResults() != 1 || op->getNumRegions() != 0 ||
      !isMemoryEffectFree(op))
    return false;
  return llvm::all_of(op->getOperands(), [&](Value operand) {
    return isUniformAt(operand, depth + 1);
  });
}

/// A tile as base + u broadcast along its rows, u a rank-1 tile of one
/// value (a splat of the row shape, which the GPU keeps in one register);
/// a null base or u stands for 0.
struct Split {
  Value base, u;
};

/// Splits tiles by their additive structure (see peelUniformAddend).
class AddendSplitter {
public:
  AddendSplitter(OpBuilder &b, Location loc, int64_t rows)
      : b(b), loc(loc), rows(rows) {}

  /// \p v as base + u; {v, null} where no uniform addend is found.
  Split split(Value v, int depth = 0) {
    if (depth > kMaxDepth)
      return {v, Value()};
    if (isUniformAt(v, 0))
      return {Value(), rowOf(v)};
    Operation *op = v.getDefiningOp();
    if (!op)
      return {v, Value()};
    const bool subtract = isa<arith::SubIOp, arith::SubFOp>(op);
    if (subtract || isa<arith::AddIOp, arith::AddFOp>(op)) {
      Split x = split(op->getOperand(0), depth + 1);
      Split y = split(op->getOperand(1), depth + 1);
      if (!x.u && !y.u)
        return {v, Value()};
      return {combine(op, x.base, y.base), combine(op, x.u, y.u)};
    }
    if (isa<arith::SIToFPOp, arith::ExtSIOp, arith::IndexCastOp>(op)) {
      Split x = split(op->getOperand(0), depth + 1);
      if (!x.u)
        return {v, Value()};
      return {x.base ? clone(op, {x.base}, v.getType()) : Value(),
              clone(op, {x.u}, rowType(v.getType()))};
    }
    if (isa<arith::MulIOp, arith::MulFOp>(op))
      for (unsigned k = 0; k < 2; ++k) {
        Value factor = op->getOperand(k);
        if (!isUniformAt(factor, 0))
          continue;
        Split x = split(op->getOperand(1 - k), depth + 1);
        if (!x.u)
          return {v, Value()};
        return {x.base ? clone(op, {x.base, factor}, v.getType()) : Value(),
                clone(op, {x.u, rowOf(factor)}, rowType(v.getType()))};
      }
    return {v, Value()};
  }

  /// The rank-1 tile (rows) of \p type's element type.
  RankedTensorType rowType(Type type) {
    return RankedTensorType::get({rows}, getElementTypeOrSelf(type));
  }

  /// Uniform tile \p v (isUniformAt) rebuilt on the row shape, once: the
  /// same ops, so that every target lowers them as it lowers \p v's.
  Value rowOf(Value v) {
    if (Value known = rowForms.lookup(v))
      return known;
    Value row;
    DenseElementsAttr dense;
    if (matchPattern(v, m_Constant(&dense))) {
      row = arith::ConstantOp::create(
          b, loc,
          DenseElementsAttr::get(rowType(v.getType()),
                                 dense.getSplatValue<Attribute>()));
    } else if (auto splat = v.getDefiningOp<flashjit::tile::SplatOp>()) {
      row = flashjit::tile::SplatOp::create(b, loc, rowType(v.getType()),
                                            splat->getOperand(0));
    } else if (auto gather = v.getDefiningOp<flashjit::tile::GatherOp>()) {
      row = flashjit::tile::GatherOp::create(b, loc, rowType(v.getType()),
                                             gather.getBase(),
                                             rowOf(gather.getIndex()));
    } else {
      Operation *op = v.getDefiningOp();
      SmallVector<Value> operands;
      for (Value operand : op->getOperands())
        operands.push_back(rowOf(operand));
      row = clone(op, operands, rowType(v.getType()));
    }
    rowForms[v] = row;
    return row;
  }

private:
  /// \p op (its name and attributes) on \p operands, of type \p type.
  Value clone(Operation *op, ArrayRef<Value> operands, Type type) {
    OperationState state(loc, op->getName());
    state.addOperands(operands);
    state.addTypes(type);
    state.addAttributes(op->getAttrs());
    return b.create(state)->getResult(0);
  }

  /// x + y or x - y as \p op (an add or a subtraction) takes them, of
  /// either shape; null stands for 0.
  Value combine(Operation *op, Value x, Value y) {
    const bool subtract = isa<arith::SubIOp, arith::SubFOp>(op);
    if (!y)
      return x;
    if (!x && !subtract)
      return y;
    if (!x)
      x = arith::ConstantOp::create(b, loc, b.getZeroAttr(y.getType()));
    return clone(op, {x, y}, y.getType());
  }

  OpBuilder &b;
  Location loc;
  const int64_t rows;
  llvm::DenseMap<Value, Value> rowForms;
};

/// Whether \p v is defined outside \p loop or by pure ops from such values.
bool isInvariant(Value v, LoopLikeOpInterface loop, int depth = 0) {
  if (loop.isDefinedOutsideOfLoop(v))
    return true;
  Operation *op = v.getDefiningOp();
  auto gather = dyn_cast_or_null<flashjit::tile::GatherOp>(op);
  if (!op || depth > kMaxDepth || op->getNumRegions() != 0 ||
      (!isMemoryEffectFree(op) && !(gather && readsConstantBuffer(gather))))
    return false;
  return llvm::all_of(op->getOperands(), [&](Value operand) {
    return isInvariant(operand, loop, depth + 1);
  });
}

/// Moves the ops that compute \p v (isInvariant) out of \p loop.
void hoist(Value v, LoopLikeOpInterface loop) {
  if (loop.isDefinedOutsideOfLoop(v))
    return;
  Operation *op = v.getDefiningOp();
  for (Value operand : op->getOperands())
    hoist(operand, loop);
  loop.moveOutOfLoop(op);
}

} // namespace

std::optional<std::pair<Value, Value>>
flashjit::attn::detail::peelUniformAddend(OpBuilder &b, Location loc, Value s) {
  Operation *def = s.getDefiningOp();
  auto type = dyn_cast<RankedTensorType>(s.getType());
  if (!def || !isa<math::FmaOp, arith::AddFOp>(def) || !type ||
      type.getRank() != 2 || !type.getElementType().isF32())
    return std::nullopt;
  const int64_t rows = type.getDimSize(0);
  Operation *parent = b.getInsertionBlock()->getParentOp();
  auto loop = dyn_cast<LoopLikeOpInterface>(parent);
  if (!loop)
    loop = parent->getParentOfType<LoopLikeOpInterface>();
  const bool fma = isa<math::FmaOp>(def);
  static const unsigned fmaAddend[] = {2}, sumAddends[] = {1, 0};
  for (unsigned k : fma ? ArrayRef(fmaAddend) : ArrayRef(sumAddends)) {
    InsertedOps inserted;
    OpBuilder local(b.getContext(), &inserted);
    local.setInsertionPoint(b.getInsertionBlock(), b.getInsertionPoint());
    Split x = AddendSplitter(local, loc, rows).split(def->getOperand(k));
    if (!x.base || !x.u || !getElementTypeOrSelf(x.u.getType()).isF32() ||
        (loop && !isInvariant(x.base, loop))) {
      inserted.eraseAll();
      continue;
    }
    // The base, and what of u does not change in the loop (ALiBi's slope).
    if (loop) {
      hoist(x.base, loop);
      for (Operation *op : inserted.ops)
        if (op->getNumResults() == 1 && isInvariant(op->getResult(0), loop))
          hoist(op->getResult(0), loop);
    }
    // (b inserts after what local inserted: the same insertion point.)
    Value peeled =
        fma ? math::FmaOp::create(b, loc, def->getOperand(0),
                                  def->getOperand(1), x.base)
                  .getResult()
            : arith::AddFOp::create(b, loc, def->getOperand(1 - k), x.base)
                  .getResult();
    if (s.use_empty())
      def->erase();
    return std::make_pair(peeled, x.u);
  }
  return std::nullopt;
}

bool flashjit::attn::detail::isUniformTile(Value v) {
  return isUniformAt(v, 0);
}

Value flashjit::attn::detail::uniformRow(OpBuilder &b, Location loc, Value v,
                                         int64_t rows) {
  return AddendSplitter(b, loc, rows).rowOf(v);
}

namespace {
/// A splat constant tile's element, or a tile.splat's scalar constant, as
/// \p AttrT (IntegerAttr or FloatAttr).
template <typename AttrT> AttrT splatElement(Value v) {
  DenseElementsAttr dense;
  if (matchPattern(v, m_Constant(&dense)) && dense.isSplat())
    return dyn_cast<AttrT>(dense.getSplatValue<Attribute>());
  AttrT scalar;
  if (auto splat = v.getDefiningOp<flashjit::tile::SplatOp>();
      splat && matchPattern(splat.getValue(), m_Constant(&scalar)))
    return scalar;
  return AttrT();
}
} // namespace

std::optional<int64_t> flashjit::attn::detail::splatIntValue(Value v) {
  if (auto a = splatElement<IntegerAttr>(v))
    return a.getValue().getSExtValue();
  return std::nullopt;
}

std::optional<double> flashjit::attn::detail::splatFloatValue(Value v) {
  if (auto a = splatElement<FloatAttr>(v))
    return a.getValueAsDouble();
  return std::nullopt;
}
