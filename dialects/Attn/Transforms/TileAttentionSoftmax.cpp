//===- TileAttentionSoftmax.cpp - One block's online-softmax step ---------===//
//
/// \file
/// The forward's step on one block of keys, in the tile dialect: the score
/// modifier and its folds into the scale, the masks, the new row max and
/// sum, P, and O += P V (TiledForwardBuilder::update). The KV loops that
/// call it are in TileAttention.cpp. Before (one block's raw scores %s):
///
///   %s = tile.dot %q, %k {transpose_rhs}
///
/// After (no modifier; the mask branch only where the block straddles):
///
///   %s2 = scf.if %straddles { select(in band, %s, -inf) } else { %s }
///   %mn = maxnumf(%m, reduce_max(%s2) * scale_log2e)
///   %mu = select(%mn == -inf, 0, %mn)
///   %a = exp2(%m - %mu)
///   %p = exp2(fma(%s2, scale_log2e, -bcast(%mu)))
///   %l2 = %l * %a + reduce_sum(%p)
///   %o2 = tile.dot truncf(%p), %v acc %o * bcast(%a)
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/BiasProduct.h"
#include "dialects/Attn/Transforms/TileIRBuilder.h"
#include "dialects/Attn/Transforms/TiledForward.h"
#include "dialects/Attn/Transforms/UniformAddend.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Matchers.h"

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;
using arith::CmpFPredicate;
using arith::CmpIPredicate;
using flashjit::attn::detail::TiledForwardBuilder;

/// The value of \p v when it is a splat float constant tile (a region's
/// scalar constant, cloned on tiles), else nullopt.
static std::optional<double> splatConstant(Value v) {
  DenseElementsAttr dense;
  if (!matchPattern(v, m_Constant(&dense)) || !dense.isSplat() ||
      !isa<FloatType>(dense.getElementType()))
    return std::nullopt;
  return dense.getSplatValue<APFloat>().convertToDouble();
}

/// When the modified score tile \p s is x * c for a constant c > 0 (a
/// splat; softcap's C tanh(s / C) ends so), (x, c log2(e)): the softmax
/// can take its max and exponent on x with c folded into the exponent's
/// factor (max(x * c) = max(x) * c for c > 0, and P = exp2(x * (c log2 e)
/// - m)), one multiply a score fewer. Not when c log2(e) leaves the f32
/// normal range. The masks' -inf stays -inf on x.
static std::optional<std::pair<Value, double>> peelPositiveScale(Value s) {
  auto mul = s.getDefiningOp<arith::MulFOp>();
  if (!mul)
    return std::nullopt;
  for (unsigned k = 0; k < 2; ++k) {
    std::optional<double> c = splatConstant(mul->getOperand(k));
    if (!c)
      continue;
    const double factor = *c / std::log(2.0);
    if (*c > 0 && std::isfinite(*c) && std::isnormal(float(factor)))
      return std::make_pair(mul->getOperand(1 - k), factor);
  }
  return std::nullopt;
}

/// The row max in log2 units that a block of scores \p s may take in place
/// of its own, or nullopt: when \p s is tanh's tile (softcap's, after
/// peelPositiveScale), every score lies in [-1, 1], so f = \p factor (the
/// top score's log2 units) bounds every row's max, and P against it is at
/// least exp2(-2 f); while that stays a normal number of P's type \p elem
/// (2 f <= 120 for bf16, whose exponent is f32's: softcap C <= 41.5; <= 12
/// for fp16), the softmax needs no row max: P = exp2(x f - f) and lse =
/// f + log2(l) are the same numbers up to rounding, and no row is lost to
/// underflow, however far below the bound its own max lies.
static std::optional<double> fixedRowMax(Value s, double factor, Type elem) {
  const double span = elem.isBF16() ? 120.0 : 12.0;
  if (!s.getDefiningOp<math::TanhOp>() || !(factor > 0) || 2 * factor > span)
    return std::nullopt;
  return factor;
}

/// \p modified, the region's result on the scaled scores \p scaled =
/// S * scale, after this fold: when the region's one use of \p scaled is a
/// product or quotient with a constant c (softcap's s / C), the two
/// become one product, S * (scale * c) or S * (scale * (1 / c)), its
/// factor computed once beside scale: one multiply a score fewer (the GPU
/// divides by a constant as a product with its reciprocal anyway). Only
/// for |c| in [2^-60, 2^60], where scale * c stays a finite f32 for every
/// scale the problem allows ([2^-126, 2^63]; a factor that underflows
/// does so where S * scale * c was already below f32's normal range).
Value TiledForwardBuilder::foldScaleIntoProduct(Value scaled, Value modified) {
  if (!scaled.hasOneUse())
    return modified;
  Operation *user = *scaled.getUsers().begin();
  const bool quotient = isa<arith::DivFOp>(user);
  // scaled * c, c * scaled or scaled / c (not c / scaled).
  if (!(quotient || isa<arith::MulFOp>(user)) ||
      (quotient && user->getOperand(0) != scaled))
    return modified;
  std::optional<double> c =
      splatConstant(user->getOperand(user->getOperand(0) == scaled ? 1 : 0));
  if (!c || !std::isfinite(*c) || std::abs(*c) < 0x1p-60 ||
      std::abs(*c) > 0x1p60)
    return modified;
  Value factor;
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointAfterValue(scale);
    factor = fmul(scale, cF32(quotient ? 1.0 / *c : *c));
  }
  auto product = scaled.getDefiningOp<arith::MulFOp>();
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(product);
  Operation *oldSplat = product.getRhs().getDefiningOp();
  product.getRhsMutable().assign(splat(factor, cast<Tensor>(scaled.getType())));
  if (oldSplat && oldSplat->use_empty())
    oldSplat->erase();
  Value folded = user->getResult(0);
  folded.replaceAllUsesWith(scaled);
  user->erase();
  return modified == folded ? scaled : modified;
}

/// \p modified after this fold: when the region's one use of the scaled
/// scores \p scaled = S * scale is a sum with a tile X (ALiBi's s +
/// slope (j - i)), the product and the sum become one fma(S, scale, X):
/// one instruction a score fewer, and one step fewer between the Q K^T
/// product and the scores (X does not need S).
Value TiledForwardBuilder::foldScaleIntoSum(Value scaled, Value modified) {
  if (!scaled.hasOneUse())
    return modified;
  auto sum = dyn_cast<arith::AddFOp>(*scaled.getUsers().begin());
  if (!sum || sum.getLhs() == sum.getRhs())
    return modified;
  auto product = scaled.getDefiningOp<arith::MulFOp>();
  Value other = sum.getLhs() == scaled ? sum.getRhs() : sum.getLhs();
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(sum);
  Value fused = math::FmaOp::create(b, sum.getLoc(), product.getLhs(),
                                    product.getRhs(), other);
  Value folded = sum.getResult();
  folded.replaceAllUsesWith(fused);
  sum.erase();
  product.erase();
  return modified == folded ? fused : modified;
}

/// The online-softmax step of raw scores \p s of keys [n0, n0 + Bc): the
/// score modifier (a trailing positive constant factor peeled into the
/// exponent's, peelPositiveScale; a bias's part that is one value per
/// block, ALiBi's slope (n0 - m0), peeled into the row max and the
/// exponent's offset, peelUniformAddend; a tanh's tile, softcap's, whose
/// range allows it, takes a fixed row max, fixedRowMax), the mask_mod (only
/// where \p partial
/// holds, when given: a full block needs none), the mask, then the new row
/// max, O's factor, P (f32) and the new row sum; \p l null is a first block
/// (the sum is P's alone: 0 * a + x is x).
TiledForwardBuilder::BlockSoftmax TiledForwardBuilder::softmax(Value s,
                                                               Value n0,
                                                               Value m, Value l,
                                                               Value partial) {
  Value factor = expFactor; // scores to log2 units of P
  Value shift; // the scores' uniform addend (a Br tile), peeled, or null
  bool rawBias = false; // the scores are raw, the shift is scaled (log2 e)
  std::optional<double> fixedMax; // a bound that serves as every row's max
  if (op.hasScoreMod()) {
    Value scaled = fmul(s, splat(scale, tile({br, bc}, f32)));
    s = modifyScores(scaled, n0);
    s = foldScaleIntoSum(scaled, foldScaleIntoProduct(scaled, s));
    if (auto peeled = peelPositiveScale(s)) {
      Operation *product = s.getDefiningOp();
      s = peeled->first;
      factor = cF32(peeled->second);
      if (product->use_empty())
        product->erase(); // nothing reads x * c any more
      fixedMax = fixedRowMax(s, peeled->second, elemTy);
    }
    if (auto peeled = peelUniformAddend(b, b.getLoc(), s))
      std::tie(s, shift) = *peeled;
    // In the overlapped loop (warpgroup MMAs) an affine bias left in the
    // loop becomes one more step of the Q K^T product: raw scores again.
    if (biasProduct && factor == expFactor && !fixedMax)
      if (auto raw = biasAsProduct(b, s, scale)) {
        s = *raw;
        factor = scaleLog2;
        rawBias = true;
      }
  }
  if (op.hasMaskMod())
    s = partial ? ifElse(partial, s, [&] { return applyMaskMod(s, n0); })
                : applyMaskMod(s, n0);

  // Only blocks that cross Nkv or the band's edge pay for the mask.
  Value n1 = add(n0, cIdx(bc - 1));
  Value needsMask = cmpI(CmpIPredicate::sge, n1, nkv);
  if (hasBand) {
    needsMask = orI(needsMask, cmpI(CmpIPredicate::slt, n0, fullLo));
    needsMask = orI(needsMask, cmpI(CmpIPredicate::sgt, n1, fullHi));
  }
  s = ifElse(needsMask, s, [&] { return maskScores(s, n0); });

  Tensor rowTy = tile({br}, f32), sTy = tile({br, bc}, f32);
  Value rowFactor = splat(factor, rowTy);
  // The shift's factor: log2(e) where the scores are raw (the bias product).
  Value shiftFactor = rawBias ? splat(expFactor, rowTy) : rowFactor;
  Value mBlock;
  if (fixedMax) { // no reduction: the bound is every block's max
    mBlock = constTile(*fixedMax, rowTy);
  } else {
    Value rowMax = reduce("max", s, 1);
    if (shift && rawBias) // max(x f + u e) = max(x) f + u e
      mBlock = fma(rowMax, rowFactor, fmul(shift, shiftFactor));
    else if (shift) // max(x + u) = max(x) + u; -inf stays -inf
      mBlock = fmul(fadd(rowMax, shift), rowFactor);
    else
      mBlock = fmul(rowMax, rowFactor);
  }
  Value mNew = maxF(m, mBlock);
  Value mUse = usableMax(mNew);
  Value alpha = exp2(fsub(m, mUse));
  Value negMRow = mlir::arith::NegFOp::create(b, mUse);
  if (shift) // (x + u) f - m = x f + (u f - m), per row
    negMRow = fma(shift, shiftFactor, negMRow);
  Value negM = broadcast(negMRow, sTy, 1);
  Value p = exp2(math::FmaOp::create(b, s, splat(factor, sTy), negM));
  Value rowSum = reduce("sum", p, 1);
  Value lNew = l ? fadd(fmul(l, alpha), rowSum) : rowSum;
  return {mNew, lNew, alpha, p};
}

/// The row max \p m as P's subtrahend: 0 for a row that has seen no key
/// (m = -inf), so that no -inf - -inf is taken.
Value TiledForwardBuilder::usableMax(Value m) {
  Tensor rowTy = cast<Tensor>(m.getType());
  Value negInf = constTile(-std::numeric_limits<double>::infinity(), rowTy);
  return select(cmpF(CmpFPredicate::OEQ, m, negInf), constTile(0.0, rowTy), m);
}

/// O += P V after softmax(): (O * a + P V, the new m, the new l) of raw
/// scores \p s of keys [n0, n0 + Bc) and their V tile \p v.
SmallVector<Value> TiledForwardBuilder::update(Value s, Value n0, Value v,
                                               Value o, Value m, Value l,
                                               Value partial) {
  BlockSoftmax sm = softmax(s, n0, m, l, partial);
  return {rescaledProduct(o, sm.alpha, truncTile(sm.p, elemTy), v), sm.m, sm.l};
}

/// O * bcast(\p alpha) + \p p V: O rescaled to the new row max, then the
/// block's product accumulated onto it (\p p rounded).
Value TiledForwardBuilder::rescaledProduct(Value o, Value alpha, Value p,
                                           Value v) {
  Value oScaled = fmul(o, broadcast(alpha, tile({br, dv}, f32), 1));
  return dot(p, v, oScaled, false, false);
}
