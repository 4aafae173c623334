//===- FoldConstantFactors.cpp - Constant factors of the backward, folded -===//
//
/// \file
/// foldConstantFactors (FoldConstantFactors.h): the backward recomputes P
/// from a score modifier and takes its derivative by the chain rule, op by
/// op, so a region's constant factors reach the tile IR as products a
/// score that cancel or combine. Softcap's (20 tanh(s / 20)) dK/dV step,
/// before (every value a Bc x Br tile, %scale a splat of the f32 argument):
///
///   %x  = arith.divf (arith.mulf %S, %scale), 20
///   %t  = math.tanh %x
///   %dt = arith.mulf (arith.subf 1, (arith.mulf %t, %t)), 0.05  // d/ds
///   %y  = arith.mulf %t, 20
///   %dy = arith.mulf %dt, 20
///   %e  = math.fma %y, 1.4427, %negLse
///
/// After (one product and one fma a score fewer each, the 0.05 * 20 = 1
/// gone):
///
///   %x  = arith.mulf %S, splat(%scale_arg * 0.05)
///   %t  = math.tanh %x
///   %dy = math.fma (arith.negf %t), %t, 1
///   %e  = math.fma %t, 28.854, %negLse
///
/// Each fold rounds once where the IR rounded twice (the factors' product
/// is taken in double, then rounded to f32), as the forward's folds do
/// (TileAttentionSoftmax.cpp); the CPU mode runs the folded program too.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/FoldConstantFactors.h"
#include "dialects/Attn/Transforms/UniformAddend.h"
#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <cmath>
#include <optional>

using namespace mlir;
using flashjit::attn::detail::splatFloatValue;

namespace {

/// A factor that folds: finite, and within [2^-60, 2^60] in magnitude, so
/// that a product of two stays a normal f32 for the factors the
/// modifiers use (as the forward's foldScaleIntoProduct).
bool foldable(std::optional<double> c) {
  return c && std::isfinite(*c) && std::abs(*c) >= 0x1p-60 &&
         std::abs(*c) <= 0x1p60;
}

/// The splat constant tile of \p like's type holding \p value.
Value constantLike(PatternRewriter &rewriter, Location loc, Value like,
                   double value) {
  auto type = cast<RankedTensorType>(like.getType());
  return arith::ConstantOp::create(
      rewriter, loc,
      DenseElementsAttr::get(type, APFloat(static_cast<float>(value))));
}

/// \p mul as (the other operand, its constant factor), or nullopt.
std::optional<std::pair<Value, double>> byConstant(arith::MulFOp mul) {
  for (unsigned k = 0; k < 2; ++k)
    if (std::optional<double> c = splatFloatValue(mul->getOperand(k));
        foldable(c))
      return std::make_pair(mul->getOperand(1 - k), *c);
  return std::nullopt;
}

/// x / c -> x * (1 / c), and x * 1 -> x.
struct QuotientAndUnitFactor : OpRewritePattern<arith::DivFOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(arith::DivFOp op,
                                PatternRewriter &rewriter) const override {
    std::optional<double> c = splatFloatValue(op.getRhs());
    if (!foldable(c) || !isa<RankedTensorType>(op.getType()))
      return failure();
    rewriter.replaceOpWithNewOp<arith::MulFOp>(
        op, op.getLhs(),
        constantLike(rewriter, op.getLoc(), op.getResult(), 1.0 / *c));
    return success();
  }
};

/// (x * a) * b -> x * (a b) for constants a and b (the inner product read
/// once); (x * splat(%s)) * b -> x * splat(%s * b), the scalar product
/// taken once; x * 1 -> x.
struct ProductOfProducts : OpRewritePattern<arith::MulFOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(arith::MulFOp op,
                                PatternRewriter &rewriter) const override {
    auto outer = byConstant(op);
    if (!outer || !isa<RankedTensorType>(op.getType()))
      return failure();
    auto [x, b] = *outer;
    if (b == 1.0) {
      rewriter.replaceOp(op, x);
      return success();
    }
    auto inner = x.getDefiningOp<arith::MulFOp>();
    if (!inner || !inner->hasOneUse())
      return failure();
    if (auto folded = byConstant(inner)) {
      auto [y, a] = *folded;
      rewriter.replaceOpWithNewOp<arith::MulFOp>(
          op, y, constantLike(rewriter, op.getLoc(), op.getResult(), a * b));
      return success();
    }
    for (unsigned k = 0; k < 2; ++k) {
      auto splat = inner->getOperand(k).getDefiningOp<flashjit::tile::SplatOp>();
      if (!splat || !splat.getValue().getType().isF32())
        continue;
      Value s = splat.getValue();
      OpBuilder::InsertionGuard guard(rewriter);
      rewriter.setInsertionPointAfterValue(s);
      Value scaled = arith::MulFOp::create(
          rewriter, op.getLoc(), s,
          arith::ConstantOp::create(rewriter, op.getLoc(),
                                    rewriter.getF32FloatAttr(float(b))));
      rewriter.setInsertionPoint(op);
      rewriter.replaceOpWithNewOp<arith::MulFOp>(
          op, inner->getOperand(1 - k),
          flashjit::tile::SplatOp::create(rewriter, op.getLoc(), op.getType(),
                                          scaled));
      return success();
    }
    return failure();
  }
};

/// fma(x * a, b, z) -> fma(x, a b, z) for constants a and b (the product
/// read once).
struct ProductIntoFma : OpRewritePattern<math::FmaOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(math::FmaOp op,
                                PatternRewriter &rewriter) const override {
    std::optional<double> b = splatFloatValue(op.getB());
    auto inner = op.getA().getDefiningOp<arith::MulFOp>();
    if (!foldable(b) || !inner || !inner->hasOneUse() ||
        !isa<RankedTensorType>(op.getType()))
      return failure();
    auto folded = byConstant(inner);
    if (!folded)
      return failure();
    rewriter.replaceOpWithNewOp<math::FmaOp>(
        op, folded->first,
        constantLike(rewriter, op.getLoc(), op.getResult(),
                     folded->second * *b),
        op.getC());
    return success();
  }
};

/// c - x * y -> fma(-x, y, c) for a constant c (the product read once):
/// tanh's derivative 1 - t^2 in one instruction (the negation is an
/// operand modifier on the GPU).
struct DifferenceOfProduct : OpRewritePattern<arith::SubFOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(arith::SubFOp op,
                                PatternRewriter &rewriter) const override {
    auto product = op.getRhs().getDefiningOp<arith::MulFOp>();
    if (!splatFloatValue(op.getLhs()) || !product || !product->hasOneUse() ||
        !isa<RankedTensorType>(op.getType()))
      return failure();
    Value negated =
        arith::NegFOp::create(rewriter, op.getLoc(), product.getLhs());
    rewriter.replaceOpWithNewOp<math::FmaOp>(op, negated, product.getRhs(),
                                             op.getLhs());
    return success();
  }
};

} // namespace

LogicalResult flashjit::attn::detail::foldConstantFactors(Operation *root) {
  RewritePatternSet patterns(root->getContext());
  patterns.add<QuotientAndUnitFactor, ProductOfProducts, ProductIntoFma,
               DifferenceOfProduct>(root->getContext());
  GreedyRewriteConfig config;
  config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
  return applyPatternsGreedily(root, std::move(patterns), config);
}
