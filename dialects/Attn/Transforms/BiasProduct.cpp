//===- BiasProduct.cpp - An affine score bias as one more product --------===//
//
/// \file
/// biasAsProduct (BiasProduct.h). ALiBi's scores in the overlapped KV loop
/// after peelUniformAddend (%y, the bias of the block's own rows and
/// columns, computed before the loop; the slope (n0 - m0) of the block's
/// position is the softmax's row shift):
///
///   %y = arith.mulf sitofp(%iota1 - %iota0), %slope     // before the loop
///   %S = tile.dot %q, %k {transpose_rhs}
///   %s = math.fma %S, splat(%scale), %y                 // an fma a score
///
/// After (A and B built before the loop; the scores are raw, the caller
/// multiplies them by scale_log2e in the exponent as without a modifier):
///
///   %A = arith.truncf (Br x 16: parts of slope / scale, -slope r / scale)
///   %B = arith.truncf (16 x Bc: rows c, c, c, 1, 1, 1, then 0)
///   %S = tile.dot %q, %k {transpose_rhs}
///   %s = tile.dot %A, %B acc %S                         // one k-step more
///
/// On warpgroup MMAs the second product is one more wgmma on the same
/// accumulator (B in shared memory, A in registers), issued with the first:
/// the bias costs the tensor cores 1/8 of Q K^T's steps at d = 128 and the
/// softmax nothing, where the fma cost an instruction a score.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/BiasProduct.h"
#include "dialects/Attn/Transforms/UniformAddend.h"
#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Matchers.h"

using namespace mlir;
using flashjit::attn::detail::isUniformTile;
using flashjit::attn::detail::splatIntValue;

namespace {

/// Deeper index expressions are left as they are.
constexpr int kMaxDepth = 8;
/// The k-step of the bias product, and the bf16 parts of each factor.
constexpr int64_t kSteps = 16, kParts = 3;

/// a c + b r + k over a block's column c and row r.
struct Affine {
  int64_t col = 0, row = 0, k = 0;
};

/// \p x as a c + b r + k (iotas, integer constants, sums, differences and
/// products with a constant), or nullopt.
std::optional<Affine> affineOf(Value x, int depth = 0) {
  if (depth > kMaxDepth)
    return std::nullopt;
  if (std::optional<int64_t> k = splatIntValue(x))
    return Affine{0, 0, *k};
  Operation *op = x.getDefiningOp();
  if (isa_and_nonnull<arith::IndexCastOp, arith::ExtSIOp>(op))
    return affineOf(op->getOperand(0), depth + 1);
  if (auto iota = dyn_cast_or_null<flashjit::tile::IotaOp>(op))
    return iota.getDim() == 1 ? Affine{1, 0, 0} : Affine{0, 1, 0};
  if (isa_and_nonnull<arith::AddIOp, arith::SubIOp>(op)) {
    auto x0 = affineOf(op->getOperand(0), depth + 1);
    auto x1 = affineOf(op->getOperand(1), depth + 1);
    if (!x0 || !x1)
      return std::nullopt;
    const int64_t sign = isa<arith::SubIOp>(op) ? -1 : 1;
    return Affine{x0->col + sign * x1->col, x0->row + sign * x1->row,
                  x0->k + sign * x1->k};
  }
  if (isa_and_nonnull<arith::MulIOp>(op))
    for (unsigned i = 0; i < 2; ++i)
      if (std::optional<int64_t> c = splatIntValue(op->getOperand(i))) {
        auto y = affineOf(op->getOperand(1 - i), depth + 1);
        if (!y)
          return std::nullopt;
        return Affine{y->col * *c, y->row * *c, y->k * *c};
      }
  return std::nullopt;
}

/// Y as (U or null for 1, a c + b r + k).
std::optional<std::pair<Value, Affine>> uniformTimesAffine(Value y) {
  auto affineOfFloat = [](Value v) -> std::optional<Affine> {
    auto cast = v.getDefiningOp<arith::SIToFPOp>();
    return cast ? affineOf(cast.getIn()) : std::nullopt;
  };
  if (auto a = affineOfFloat(y))
    return std::make_pair(Value(), *a);
  auto mul = y.getDefiningOp<arith::MulFOp>();
  if (!mul)
    return std::nullopt;
  for (unsigned i = 0; i < 2; ++i)
    if (isUniformTile(mul->getOperand(i)))
      if (auto a = affineOfFloat(mul->getOperand(1 - i)))
        return std::make_pair(mul->getOperand(i), *a);
  return std::nullopt;
}

/// Builds A and B of biasAsProduct at \p b's insertion point.
class BiasOperands {
public:
  BiasOperands(ImplicitLocOpBuilder &b, int64_t rows, int64_t cols)
      : b(b), rows(rows), cols(cols), f32(b.getF32Type()),
        i32(b.getI32Type()) {}

  /// Br x 16: columns 0..2 the parts of u a / scale, 3..5 those of
  /// u (b r + k) / scale, the rest 0.
  Value lhs(Value u, const Affine &a, Value scale) {
    auto fTy = RankedTensorType::get({rows, kSteps}, f32);
    auto iTy = RankedTensorType::get({rows, kSteps}, i32);
    Value col = flashjit::tile::IotaOp::create(b, iTy, 1);
    Value row = flashjit::tile::IotaOp::create(b, iTy, 0);
    Value inv = arith::DivFOp::create(
        b, arith::ConstantOp::create(b, b.getF32FloatAttr(1.0f)), scale);
    Value sigma = flashjit::tile::SplatOp::create(b, fTy, inv);
    if (u)
      sigma = arith::MulFOp::create(
          b, sigma,
          flashjit::tile::BroadcastOp::create(
              b, fTy, flashjit::attn::detail::uniformRow(b, b.getLoc(), u, rows),
              1));
    Value colPart = arith::MulFOp::create(b, sigma, fConst(a.col, fTy));
    Value rowIndex = arith::SIToFPOp::create(b, fTy, row);
    Value rowPart = arith::MulFOp::create(
        b, sigma,
        math::FmaOp::create(b, rowIndex, fConst(a.row, fTy), fConst(a.k, fTy)));
    Value part =
        select(lessThan(col, kParts, iTy), colPart,
               select(lessThan(col, 2 * kParts, iTy), rowPart, fConst(0, fTy)));
    // Each part is what the parts before it left, cut to bf16's 16 bits.
    SmallVector<Value, kParts> parts;
    Value rest = part;
    for (int64_t p = 0; p < kParts; ++p) {
      parts.push_back(highHalf(rest, iTy));
      rest = arith::SubFOp::create(b, rest, parts.back());
    }
    Value inPart = arith::SelectOp::create(
        b, lessThan(col, kParts, iTy), col,
        arith::SubIOp::create(b, col, iConst(kParts, iTy)));
    Value value = parts.back();
    for (int64_t p = kParts - 2; p >= 0; --p)
      value = select(arith::CmpIOp::create(b, arith::CmpIPredicate::eq, inPart,
                                           iConst(p, iTy)),
                     parts[p], value);
    return arith::TruncFOp::create(b, fTy.clone(b.getBF16Type()), value);
  }

  /// 16 x Bc: rows 0..2 the column index c, 3..5 ones, the rest 0.
  Value rhs() {
    auto fTy = RankedTensorType::get({kSteps, cols}, f32);
    auto iTy = RankedTensorType::get({kSteps, cols}, i32);
    Value k = flashjit::tile::IotaOp::create(b, iTy, 0);
    Value c = arith::SIToFPOp::create(
        b, fTy, flashjit::tile::IotaOp::create(b, iTy, 1));
    Value value =
        select(lessThan(k, kParts, iTy), c,
               select(lessThan(k, 2 * kParts, iTy), fConst(1, fTy),
                      fConst(0, fTy)));
    return arith::TruncFOp::create(b, fTy.clone(b.getBF16Type()), value);
  }

private:
  Value fConst(double v, RankedTensorType ty) {
    return arith::ConstantOp::create(
        b, DenseElementsAttr::get(ty, APFloat(static_cast<float>(v))));
  }
  Value iConst(int64_t v, RankedTensorType ty) {
    return arith::ConstantOp::create(
        b, DenseElementsAttr::get(ty, APInt(32, uint64_t(v), true)));
  }
  Value lessThan(Value x, int64_t v, RankedTensorType ty) {
    return arith::CmpIOp::create(b, arith::CmpIPredicate::slt, x,
                                 iConst(v, ty));
  }
  Value select(Value c, Value x, Value y) {
    return arith::SelectOp::create(b, c, x, y);
  }
  /// \p x with its low 16 bits cleared: a bf16 value, exactly.
  Value highHalf(Value x, RankedTensorType iTy) {
    Value bits = arith::BitcastOp::create(b, iTy, x);
    Value high = arith::AndIOp::create(b, bits, iConst(-65536, iTy));
    return arith::BitcastOp::create(b, x.getType(), high);
  }

  ImplicitLocOpBuilder &b;
  const int64_t rows, cols;
  Type f32, i32;
};

} // namespace

std::optional<Value>
flashjit::attn::detail::biasAsProduct(ImplicitLocOpBuilder &b, Value s,
                                      Value scale) {
  auto fma = s.getDefiningOp<math::FmaOp>();
  if (!fma)
    return std::nullopt;
  auto product = fma.getA().getDefiningOp<tile::DotOp>();
  auto factor = fma.getB().getDefiningOp<tile::SplatOp>();
  if (!product || product.getAcc() || product.getTransposeLhs() || !factor ||
      factor.getValue() != scale || !fma.getA().hasOneUse())
    return std::nullopt;
  auto type = cast<RankedTensorType>(s.getType());
  auto lhsType = cast<RankedTensorType>(product.getLhs().getType());
  if (!lhsType.getElementType().isBF16() || type.getDimSize(1) > 256)
    return std::nullopt;
  Value y = fma.getC();
  Operation *yDef = y.getDefiningOp();
  auto parts = uniformTimesAffine(y);
  if (!yDef || !parts)
    return std::nullopt;

  Value lhs, rhs;
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointAfter(yDef);
    BiasOperands operands(b, type.getDimSize(0), type.getDimSize(1));
    lhs = operands.lhs(parts->first, parts->second, scale);
    rhs = operands.rhs();
  }
  // Outside the loop (the overlapped loop's first block) the bias is built
  // after the product: the product moves down to its second step.
  if (product->getBlock() == yDef->getBlock() &&
      product->isBeforeInBlock(yDef))
    product->moveAfter(rhs.getDefiningOp());
  Value raw;
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointAfter(product);
    raw = tile::DotOp::create(b, type, lhs, rhs, product.getResult(),
                              /*transpose_lhs=*/false,
                              /*transpose_rhs=*/false);
  }
  if (s.use_empty())
    fma.erase();
  if (yDef->use_empty())
    yDef->erase();
  return raw;
}
