//===- TileAttentionBackwardLoops.cpp - The backward's loops, as tile IR --===//
//
/// \file
/// The two loops of flashjit-tile-attention-backward (see
/// TileAttentionBackward.cpp for the whole): the KV-major main loop (dK, dV
/// and atomic dQ's adds) and the deterministic dQ pass. Both recompute
/// P = exp2(S * scale * log2(e) - lse * log2(e)) with one FMA from the
/// preprocessing's -lse * log2(e), mask it where the block pair needs it,
/// round it to the element type for the product with dO, and take dS from
/// the unrounded P: dS = P (dP - delta), rounded for its products (as
/// FlashAttention-2 does; no conversion back from the element type). Only
/// block pairs that straddle the band (or Nkv) pay for the element mask.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/ScoreMod.h"
#include "dialects/Attn/Transforms/TiledBackward.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <cmath>
#include <tuple>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;
using flashjit::attn::detail::CaptureRead;
using flashjit::attn::detail::ScoreModDerivatives;
using flashjit::attn::detail::TiledBackwardBuilder;
using Pred = arith::CmpIPredicate;
namespace bwd = flashjit::abi::bwd;

/// The main loop: one program per (KV block of Bc keys at n0, batch * KV
/// head). K and V stay in tiles, dK and dV in f32 tiles carried by the loop
/// over the query heads of the group and, inside it, by the loop over the Q
/// blocks that see the keys.
///
///   %k = tile.load %K[...] rows %n0 of %nkv stride %sk   // Bc x dqk
///   %v = tile.load %V[...] rows %n0 of %nkv stride %sv   // Bc x dv
///   %r:2 = scf.for %g = %c0 to %gqa iter_args(%dk = 0, %dv = 0) {
///     %s:2 = scf.for %t = %lo to %hi iter_args(%dk1 = %dk, %dv1 = %dv) {
///       ... mainStep
///     }
///     scf.yield %s#0, %s#1
///   }
///   tile.store truncf(%r#0 * splat(%scale)), %DK[...] rows %n0 of %nkv
///   tile.store truncf(%r#1), %DV[...] rows %n0 of %nkv
///
/// [lo, hi): the Q blocks of Br rows that meet the rows that see a key of
/// the block, [max(0, n0 - off - R), min(Nq - 1, lastKey - off + L)]
/// (query i sees key j iff i + off - L <= j <= i + off + R); block-sparse,
/// every Br-block of the sparse Q blocks that the KV-major layout lists.
void TiledBackwardBuilder::buildMain() {
  beginFunc(op.getSymName(), "main", br, bc);
  Value kvHeads = arith::DivUIOp::create(b, heads, cIdx(gqa));
  Value bI = arith::DivUIOp::create(b, pidBH(), kvHeads);
  Value hkI = arith::RemUIOp::create(b, pidBH(), kvHeads);
  enterSequence(bI);
  n0 = mulC(pidM(), bc);
  kTile = loadRows(bwd::K, bwd::KStrideB, bI, hkI, bc, dqk, n0, nkv);
  vTile = loadRows(bwd::V, bwd::VStrideB, bI, hkI, bc, dv, n0, nkv);

  Value tLo, tHi;
  if (sparseBlock == 0) {
    Value keysValid = minI(cIdx(bc), sub(nkv, n0));
    Value lastKey = add(n0, sub(keysValid, cIdx(1)));
    Value lo = cIdx(0), hi = sub(nq, cIdx(1));
    if (hasBand) {
      lo = maxI(lo, sub(sub(n0, offset), winR));
      hi = minI(hi, add(sub(lastKey, offset), winL));
    }
    std::tie(tLo, tHi) = blocksMeeting(clampBound(lo), clampBound(hi), br);
    if (op.getVarlen())
      tHi = endWithinSequence(tLo, tHi, n0, nkv);
  }
  Value zeroK = constTile(0.0, tile({bc, dqk}, f32));
  Value zeroV = constTile(0.0, tile({bc, dv}, f32));
  SmallVector<Value> acc = forCarrying(
      cIdx(0), cIdx(gqa), ValueRange{zeroK, zeroV},
      [&](Value g, ValueRange in) {
        Value hI = add(mulC(hkI, gqa), g);
        Value lo = tLo, hi = tHi;
        if (sparseBlock != 0) {
          list = blockList(
              buf(bwd::KvCounts), buf(bwd::KvIndices),
              {indexArg(bwd::KvCountsStrideB), indexArg(bwd::KvCountsStrideH),
               indexArg(bwd::KvIndicesStrideB), indexArg(bwd::KvIndicesStrideH),
               indexArg(bwd::KvIndicesStrideM)},
              bI, hI, n0, sparseBlock, br, hi);
          lo = cIdx(0);
        }
        return forCarrying(lo, hi, in, [&](Value t, ValueRange carried) {
          Value first =
              sparseBlock == 0 ? mulC(t, br) : listedBlockStart(list, t);
          return mainStep(first, bI, hI, carried[0], carried[1],
                          maskModPartial(t, first, br, n0, bc, bI, hI));
        });
      });
  storeRows(acc[0], scale, bwd::DK, bwd::DKStrideB, bI, hkI, n0, nkv);
  storeRows(acc[1], Value(), bwd::DV, bwd::DVStrideB, bI, hkI, n0, nkv);
  func::ReturnOp::create(b);
}

/// One Q block of Br rows at \p first of query head \p hI against the
/// resident keys, S^T-major (keys on the rows, as the GPU's MMAs have
/// them). Rows past Nq read zeros (Q, dO and their statistics), so their
/// P is exactly 1 and their contributions exactly 0.
///
///   %q = tile.load %Q[...] rows %m0 of %nq stride %sq     // Br x dqk
///   %do = tile.load %DO[...] rows %m0 of %nq stride %sdo  // Br x dv
///   %nl = tile.load %DELTA[%bhn + %stat] rows %m0 of %nq  // Br
///   %dl = tile.load %DELTA[%stat] rows %m0 of %nq         // Br
///   %st = tile.dot %k, %q {transpose_rhs}                  // Bc x Br
///   %pt = math.exp2 (math.fma %st, splat(%scale_log2e), bcast(%nl) dim 0)
///   %pt2 = maskMain(%pt)
///   %pth = arith.truncf %pt2 : ... to tensor<BcxBrxbf16>
///   %dv2 = tile.dot %pth, %do acc %dv
///   %dpt = tile.dot %v, %do {transpose_rhs}
///   %ds = arith.mulf %pt2, (%dpt - bcast(%dl) dim 0)  // with a modifier
///                        // and no captured gradient, %pt2 * d s'/d s
///   %dsh = arith.truncf %ds
///   %dk2 = tile.dot %dsh, %q acc %dk
///   %dq = tile.dot %dsh, %k {transpose_lhs}                // atomic dQ
///   tile.atomic_add %dq, %DQACC[%stat * dqk] rows %m0 of %nq stride %dqk
SmallVector<Value> TiledBackwardBuilder::mainStep(Value first, Value bI,
                                                  Value hI, Value dk,
                                                  Value dvAcc, Value partial) {
  Value stat = statBase(bI, hI);
  Tensor rowTy = tile({br}, f32), sTy = tile({bc, br}, f32);
  Value q = loadRows(bwd::Q, bwd::QStrideB, bI, hI, br, dqk, first, nq);
  Value dO = loadRows(bwd::DO, bwd::DOStrideB, bI, hI, br, dv, first, nq);
  Value nl =
      loadTile(rowTy, buf(bwd::Delta), add(bhn, stat), first, nq, Value());
  Value dl = loadTile(rowTy, buf(bwd::Delta), stat, first, nq, Value());

  Value st = dot(kTile, q, Value(), false, /*transposeRhs=*/true), dmod;
  SmallVector<CaptureRead> reads;
  Value pt = exp2(exponent(st, broadcast(nl, sTy, /*dim=*/0), first, n0,
                           /*keysOnRows=*/true, bI, hI, dmod, &reads,
                           partial));
  Value pm = maskMain(pt, first);
  Value pth = truncTile(pm, elemTy);
  // Without captured gradients, P d score'/d score at once: one tile stays
  // live across the products below instead of P and the derivative (the
  // softcap backward's registers).
  Value pd = dmod && reads.empty() ? fmul(pm, dmod) : pm;
  Value dvNew = dot(pth, dO, dvAcc, false, false);
  Value dpt = dot(vTile, dO, Value(), false, /*transposeRhs=*/true);
  // The gradient of the modified scores, then (by d score'/d score) of the
  // scaled ones, from P unrounded (which the captured tensors' gradients
  // read too: their sums over whole rows, a temperature or a slope, cancel).
  Value dpMinusD = fsub(dpt, broadcast(dl, sTy, /*dim=*/0));
  Value ds = fmul(pd, dpMinusD);
  if (!reads.empty())
    addCaptureGrads(reads, ds, first);
  if (dmod && !reads.empty())
    ds = fmul(ds, dmod);
  Value dsh = truncTile(ds, elemTy);
  Value dkNew = dot(dsh, q, dk, false, false);
  if (atomicDq) {
    Value dq = dot(dsh, kTile, Value(), /*transposeLhs=*/true, false);
    tile::AtomicAddOp::create(b, dq, buf(bwd::DqAccum), mulC(stat, dqk), first,
                              nq, cIdx(dqk), quadOrder);
  }
  return {dkNew, dvNew};
}

/// Without a modifier: fma(raw, splat(scale_log2e), negLse), \p dmod null.
/// With one (ScoreMod.cpp), P is recomputed from the modified scores as
/// the forward made them, and dS later takes their derivative:
///
///   %sc = arith.mulf %raw, splat(%scale)
///   %m, %dm = <score_mod on %sc, and d %m / d %sc>
///   %e = math.fma %m, splat(log2(e)), %negLse
Value TiledBackwardBuilder::exponent(Value raw, Value negLse, Value q0,
                                     Value kv0, bool keysOnRows, Value bI,
                                     Value hI, Value &dmod,
                                     SmallVector<CaptureRead> *reads,
                                     Value partial) {
  auto ty = cast<Tensor>(raw.getType());
  auto masked = [&](Value s) {
    if (!op.hasMaskMod())
      return s;
    auto apply = [&] { return applyMaskMod(s, q0, kv0, keysOnRows, bI, hI); };
    return partial ? ifElse(partial, s, apply) : apply();
  };
  if (!op.hasScoreMod())
    return fma(masked(raw), splat(scaleLog2, ty), negLse);
  ScoreModDerivatives mod = modifyScores(raw, q0, kv0, keysOnRows, bI, hI,
                                         reads ? op.getCaptureGrads() : 0);
  dmod = mod.dScore;
  if (reads)
    *reads = std::move(mod.reads);
  return fma(masked(mod.value), constTile(1.0 / std::log(2.0), ty), negLse);
}

/// For each read: tile.scatter_add select(valid, g * d, 0), grad[index]
/// (deterministic: its fixed-point words into the accumulators),
/// valid: key n0 + r < Nkv and query first + c < Nq (the positions the
/// region saw were clamped there, so padding elements would add into a real
/// element's gradient).
void TiledBackwardBuilder::addCaptureGrads(ArrayRef<CaptureRead> reads,
                                           Value g, Value first) {
  auto ty = cast<Tensor>(g.getType());
  Tensor iTy = tile(ty.getShape(), b.getI32Type());
  Value valid =
      andI(cmpI(Pred::slt, indexTile(iTy, 0, n0), splat(toI32(nkv), iTy)),
           cmpI(Pred::slt, indexTile(iTy, 1, first), splat(toI32(nq), iTy)));
  Value zero = constTile(0.0, ty);
  for (const CaptureRead &r : reads) {
    Value v = select(valid, fmul(g, r.derivative), zero);
    if (fixedPoint)
      addFixedPoint(v, r.capture, r.index);
    else
      tile::ScatterAddOp::create(b, v, captureBuf(r.capture, /*grad=*/true),
                                 r.index);
  }
}

Value TiledBackwardBuilder::maskModPartial(Value t, Value q0, int64_t rows,
                                           Value kv0, int64_t cols, Value bI,
                                           Value hI) {
  if (!op.hasMaskMod())
    return Value();
  Value full = sparseBlock ? listedBlockFull(list, t) : Value();
  flashjit::attn::detail::BlockPositions at{
      bI, bI, hI, hI, q0, add(q0, cIdx(rows - 1)), kv0,
      add(kv0, cIdx(cols - 1))};
  return flashjit::attn::detail::maskModNeeded(b, b.getLoc(), op.getMaskMod(),
                                               full, at);
}

Value TiledBackwardBuilder::captureBuf(unsigned c, bool grad) {
  const unsigned captures = unsigned(totalCapturedTensors(op));
  return arg(firstCaptureArg() + c + (grad ? captures : 0));
}

flashjit::attn::detail::ScoreModIndices
TiledBackwardBuilder::modifierIndices(Region &region, Value like, Value q0,
                                      Value kv0, bool keysOnRows, Value bI,
                                      Value hI) {
  using namespace flashjit::attn::detail;
  auto ty = cast<Tensor>(like.getType());
  Tensor iTy = tile(ty.getShape(), b.getI32Type());
  ModifierPositions at;
  at.batch = bI;
  at.head = hI;
  auto q = [&] { return indexTile(iTy, keysOnRows ? 1 : 0, q0); };
  auto kv = [&] { return indexTile(iTy, keysOnRows ? 0 : 1, kv0); };
  at.qIdx = q;
  at.kvIdx = kv;
  at.nq = nq;
  at.nkv = nkv;
  // score_mod's captured tensors first, then mask_mod's.
  unsigned first =
      isMaskModRegion(region) ? unsigned(capturedTensors(op.getScoreMod())) : 0;
  SmallVector<Value> captures;
  for (unsigned c = 0; c < unsigned(capturedTensors(region)); ++c)
    captures.push_back(captureBuf(first + c));
  return modifierIndicesAt(region, iTy, at, captures);
}

ScoreModDerivatives
TiledBackwardBuilder::modifyScores(Value raw, Value q0, Value kv0,
                                   bool keysOnRows, Value bI, Value hI,
                                   int64_t gradCaptures) {
  using namespace flashjit::attn::detail;
  auto ty = cast<Tensor>(raw.getType());
  Region &region = op.getScoreMod();
  ScoreModIndices indices =
      modifierIndices(region, raw, q0, kv0, keysOnRows, bI, hI);
  // The pass checked the region (checkScoreModDifferentiable, by the score
  // and by the captured tensors of capture_grads).
  return *inlineScoreModWithDerivatives(b, b.getLoc(), region,
                                        fmul(raw, splat(scale, ty)), indices,
                                        gradCaptures);
}

///   %keep = <mask_mod on the index tiles> : tensor<..xi1>
///   %s2 = arith.select %keep, %s, splat(-inf)
Value TiledBackwardBuilder::applyMaskMod(Value s, Value q0, Value kv0,
                                         bool keysOnRows, Value bI, Value hI) {
  using namespace flashjit::attn::detail;
  auto ty = cast<Tensor>(s.getType());
  Region &region = op.getMaskMod();
  Value keep = inlineMaskMod(
      b, b.getLoc(), region, ty.getShape(),
      modifierIndices(region, s, q0, kv0, keysOnRows, bI, hI));
  return select(keep, s,
                constTile(-std::numeric_limits<double>::infinity(), ty));
}

/// P^T with 0 where key n0 + r does not see query first + c: outside the
/// band ([r - off - R, r - off + L] of queries) or, with atomic dQ, past
/// Nkv (such keys would feed dQ; their P need not be finite).
///
///   band:  scf.if %straddles { select(visible, %pt, 0) } else { %pt }
///          %straddles: n0 < lastQuery + off - L or lastKey > first + off
///          + R (or, atomic dQ, n0 + Bc > Nkv), the block pair's corners
///   none, atomic dQ: the same, %straddles: n0 + Bc > Nkv (the last KV
///          block's programs only)
///   none, deterministic: %pt (keys past Nkv feed only dK, dV rows that
///          are not stored)
/// With a score modifier, also 0 for the queries past Nq (%straddles: the
/// block's rows pass Nq): their scores are the modifier's of zero rows,
/// whose P = exp2(mod - 0) may be inf, and inf * 0 (their dO) a NaN in dV.
Value TiledBackwardBuilder::maskMain(Value pt, Value first) {
  const bool guardRows = op.hasScoreMod();
  if (!hasBand && !atomicDq && !guardRows)
    return pt;
  Tensor iTy = tile({bc, br}, b.getI32Type());
  Value zero = constTile(0.0, tile({bc, br}, f32));
  auto visible = [&]() -> Value {
    Value ok;
    auto both = [&](Value c) { ok = ok ? andI(ok, c) : c; };
    if (atomicDq)
      both(cmpI(Pred::slt, indexTile(iTy, 0, n0), splat(toI32(nkv), iTy)));
    if (hasBand)
      both(inBand(indexTile(iTy, 1, first), sub(n0, offset), winR, winL));
    if (guardRows)
      both(cmpI(Pred::slt, indexTile(iTy, 1, first), splat(toI32(nq), iTy)));
    return select(ok, pt, zero);
  };
  Value straddles;
  auto either = [&](Value c) { straddles = straddles ? orI(straddles, c) : c; };
  if (hasBand) {
    Value lastQ = add(first, cIdx(br - 1)), lastK = add(n0, cIdx(bc - 1));
    // The later corner's test first: the kernels without a modifier keep
    // their code (the order these ops were built in before).
    Value late = cmpI(Pred::sgt, lastK, add(add(first, offset), winR));
    either(orI(cmpI(Pred::slt, n0, sub(add(lastQ, offset), winL)), late));
  }
  if (atomicDq)
    either(cmpI(Pred::sgt, add(n0, cIdx(bc)), nkv));
  if (guardRows)
    either(cmpI(Pred::sgt, add(first, cIdx(br)), nq));
  return ifElse(straddles, pt, visible);
}

/// The deterministic dQ pass: one program per (Q block of Br' rows at m0,
/// batch * head); Q, dO and their statistics stay in tiles while it walks
/// the KV blocks of Bc' keys its rows see (the forward's band or layout).
///
///   %q, %do, %nl, %dl = tile.load (Br' rows at %m0)
///   %dq = scf.for %t = %lo to %hi iter_args(%acc = 0) {   // Br' x dqk
///     ... dqStep
///   }
///   tile.store truncf(%dq * splat(%scale)), %DQ[...] rows %m0 of %nq
void TiledBackwardBuilder::buildDq() {
  beginFunc((op.getSymName() + bwd::kDqSuffix).str(), "dq", dqBr, dqBc);
  Value bI = arith::DivUIOp::create(b, pidBH(), heads);
  Value hI = arith::RemUIOp::create(b, pidBH(), heads);
  Value hkI = arith::DivUIOp::create(b, hI, cIdx(gqa));
  enterSequence(bI);
  m0 = mulC(pidM(), dqBr);
  Value stat = statBase(bI, hI);
  Tensor rowTy = tile({dqBr}, f32);
  qTile = loadRows(bwd::Q, bwd::QStrideB, bI, hI, dqBr, dqk, m0, nq);
  doTile = loadRows(bwd::DO, bwd::DOStrideB, bI, hI, dqBr, dv, m0, nq);
  negLse = loadTile(rowTy, buf(bwd::Delta), add(bhn, stat), m0, nq, Value());
  delta = loadTile(rowTy, buf(bwd::Delta), stat, m0, nq, Value());

  // Keys [fullLo, fullHi] are visible from every row of the block; the
  // rows see [jLo, jHi].
  Value rowsValid = minI(cIdx(dqBr), sub(nq, m0));
  Value lastRow = add(m0, sub(rowsValid, cIdx(1)));
  Value jLo = cIdx(0), jHi = sub(nkv, cIdx(1));
  if (hasBand) {
    jLo = maxI(jLo, sub(add(m0, offset), winL));
    jHi = minI(jHi, add(add(lastRow, offset), winR));
    fullLo = clampBound(sub(add(lastRow, offset), winL));
    fullHi = clampBound(add(add(m0, offset), winR));
  }
  Value tLo, tHi;
  if (sparseBlock == 0) {
    std::tie(tLo, tHi) = blocksMeeting(clampBound(jLo), clampBound(jHi), dqBc);
    if (op.getVarlen())
      tHi = endWithinSequence(tLo, tHi, m0, nq);
  } else {
    list =
        blockList(buf(bwd::Counts), buf(bwd::Indices),
                  {indexArg(bwd::CountsStrideB), indexArg(bwd::CountsStrideH),
                   indexArg(bwd::IndicesStrideB), indexArg(bwd::IndicesStrideH),
                   indexArg(bwd::IndicesStrideM)},
                  bI, hI, m0, sparseBlock, dqBc, tHi);
    tLo = cIdx(0);
  }
  Value zero = constTile(0.0, tile({dqBr, dqk}, f32));
  SmallVector<Value> dq =
      forCarrying(tLo, tHi, ValueRange{zero}, [&](Value t, ValueRange carried) {
        Value first =
            sparseBlock == 0 ? mulC(t, dqBc) : listedBlockStart(list, t);
        return SmallVector<Value>{
            dqStep(first, bI, hI, hkI, carried[0],
                   maskModPartial(t, m0, dqBr, first, dqBc, bI, hI))};
      });
  storeRows(dq[0], scale, bwd::DQ, bwd::DQStrideB, bI, hI, m0, nq);
  func::ReturnOp::create(b);
}

/// One KV block of Bc' keys at \p first against the resident Q block:
///
///   %k = tile.load %K[...] rows %n0 of %nkv stride %sk    // Bc' x dqk
///   %v = tile.load %V[...] rows %n0 of %nkv stride %sv    // Bc' x dv
///   %s = tile.dot %q, %k {transpose_rhs}                   // Br' x Bc'
///   %p = math.exp2 (math.fma %s, splat(%scale_log2e), bcast(%nl) dim 1)
///   %p2 = maskDq(%p)
///   %dp = tile.dot %do, %v {transpose_rhs}
///   %dsh = arith.truncf (arith.mulf %p2, (%dp - bcast(%dl) dim 1))
///   %dq2 = tile.dot %dsh, %k acc %dq
Value TiledBackwardBuilder::dqStep(Value first, Value bI, Value hI, Value hkI,
                                   Value dq, Value partial) {
  Tensor sTy = tile({dqBr, dqBc}, f32);
  Value k = loadRows(bwd::K, bwd::KStrideB, bI, hkI, dqBc, dqk, first, nkv);
  Value v = loadRows(bwd::V, bwd::VStrideB, bI, hkI, dqBc, dv, first, nkv);
  Value s = dot(qTile, k, Value(), false, /*transposeRhs=*/true), dmod;
  Value p = exp2(exponent(s, broadcast(negLse, sTy, /*dim=*/1), m0, first,
                          /*keysOnRows=*/false, bI, hI, dmod, nullptr,
                          partial));
  Value pm = maskDq(p, first);
  Value dp = dot(doTile, v, Value(), false, /*transposeRhs=*/true);
  Value ds = fmul(pm, fsub(dp, broadcast(delta, sTy, /*dim=*/1)));
  if (dmod)
    ds = fmul(ds, dmod);
  return dot(truncTile(ds, elemTy), k, dq, false, false);
}

/// P with 0 where key first + c is past Nkv or outside row m0 + r's band
/// ([r + off - L, r + off + R]), only in the blocks that cross Nkv or the
/// band's edge:
///
///   scf.if %needs { select(visible, %p, 0) } else { %p }
///   %needs: first + Bc' > Nkv, or (band) first < fullLo or
///           first + Bc' - 1 > fullHi
Value TiledBackwardBuilder::maskDq(Value p, Value first) {
  Value needs = cmpI(Pred::sgt, add(first, cIdx(dqBc)), nkv);
  if (hasBand) {
    needs = orI(needs, cmpI(Pred::slt, first, fullLo));
    needs = orI(needs, cmpI(Pred::sgt, add(first, cIdx(dqBc - 1)), fullHi));
  }
  return ifElse(needs, p, [&] {
    Tensor iTy = tile({dqBr, dqBc}, b.getI32Type());
    Value cols = indexTile(iTy, 1, first);
    Value ok = cmpI(Pred::slt, cols, splat(toI32(nkv), iTy));
    if (hasBand)
      ok = andI(ok, inBand(cols, add(m0, offset), winL, winR));
    return select(ok, p, constTile(0.0, tile({dqBr, dqBc}, f32)));
  });
}
