//===- TileAttentionMasks.cpp - The tiled forward's modifiers and masks ---===//
//
/// \file
/// TiledForwardBuilder's score and mask modifiers and its masks, built on a
/// Br x Bc score tile inside the KV loop (TileAttention.cpp): the
/// score_mod region inlined on the scaled scores (ScoreMod.cpp), the
/// mask_mod region as a select of -inf, skipped on blocks a layout lists
/// as full or whose bounds prove it keeps them whole (MaskModBounds.cpp),
/// and the band and Nkv masks. Before (a mask_mod with a layout):
///
///   %s = tile.dot %q, %k {transpose_rhs}
///
/// After:
///
///   %e = memref.load %indices[...] : memref<?xi32>   // ~k: full
///   %partial = arith.cmpi sge, %e, %c0_i32
///   %s2 = scf.if %partial -> tensor<BrxBcxf32> {
///     %keep = <mask_mod on the index tiles> : tensor<BrxBcxi1>
///     scf.yield (arith.select %keep, %s, splat(-inf))
///   } else { scf.yield %s }
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/TiledForward.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

#include <limits>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;
using arith::CmpIPredicate;

namespace flashjit::attn::detail {

/// Whether iteration \p t (keys [n0, n0 + Bc)) needs the mask_mod: false
/// where the layout lists its block as full (abi::fullBlockEntry) or the
/// region's bounds prove it keeps the whole block (MaskModBounds.cpp);
/// null (always) where neither can say.
Value TiledForwardBuilder::maskModPartial(Value t, Value n0) {
  if (!op.hasMaskMod())
    return Value();
  Value full = sparseBlock ? listedBlockFull(list, t) : Value();
  BlockPositions at;
  at.batchLo = at.batchHi = bIdx;
  at.headLo = at.headHi = hIdx;
  at.qLo = m0;
  at.qHi = add(m0, cIdx(br - 1));
  if (pack) { // rows p are query p / gqa of head hIdx + p % gqa
    at.headHi = add(hIdx, sub(group, cIdx(1)));
    at.qLo = arith::DivUIOp::create(b, at.qLo, group);
    at.qHi = arith::DivUIOp::create(b, at.qHi, group);
  }
  at.kvLo = n0;
  at.kvHi = add(n0, cIdx(bc - 1));
  return maskModNeeded(b, b.getLoc(), op.getMaskMod(), full, at);
}

/// The index tiles and captured buffers of modifier \p region on the
/// scores of keys [n0, n0 + Bc): element (r, c) is query m0 + r and key
/// n0 + c of (batch, query head) (bIdx, hIdx). Builds only the index tiles
/// the region uses.
ScoreModIndices
TiledForwardBuilder::modifierIndices(Region &region, Value n0) {
  Tensor iTy = tile({br, bc}, b.getI32Type());
  ModifierPositions at;
  at.batch = bIdx;
  at.head = hIdx;
  auto packedHead = [&]() -> Value { // head hIdx + p % gqa of row p
    return arith::AddIOp::create(
        b, splat(toI32(hIdx), iTy),
        arith::RemUIOp::create(b, indexTile(iTy, 0, m0),
                               splat(toI32(group), iTy)));
  };
  if (pack)
    at.headTile = packedHead;
  auto q = [&] { return queryOf(indexTile(iTy, 0, m0)); };
  auto kv = [&] { return indexTile(iTy, 1, n0); };
  at.qIdx = q;
  at.kvIdx = kv;
  at.nq = nq;
  at.nkv = nkv;
  // The kernel's captured buffers: score_mod's, then mask_mod's, last.
  unsigned first = func.getNumArguments() - unsigned(totalCapturedTensors(op));
  if (isMaskModRegion(region))
    first += unsigned(capturedTensors(op.getScoreMod()));
  SmallVector<Value> captures;
  for (unsigned c = 0; c < unsigned(capturedTensors(region)); ++c)
    captures.push_back(func.getArgument(first + c));
  return modifierIndicesAt(region, iTy, at, captures);
}

/// The score_mod region on the scaled scores \p s of keys [n0, n0 + Bc).
Value TiledForwardBuilder::modifyScores(Value s, Value n0) {
  Region &region = op.getScoreMod();
  return inlineScoreMod(
      b, b.getLoc(), region, s, modifierIndices(region, n0));
}

/// -inf where the mask_mod region yields false for the scores \p s (raw or
/// modified) of keys [n0, n0 + Bc):
///
///   %keep = <mask_mod on the index tiles> : tensor<BrxBcxi1>
///   %s2 = arith.select %keep, %s, splat(-inf)
Value TiledForwardBuilder::applyMaskMod(Value s, Value n0) {
  Region &region = op.getMaskMod();
  Value keep = inlineMaskMod(
      b, b.getLoc(), region, {br, bc}, modifierIndices(region, n0));
  Tensor sTy = tile({br, bc}, f32);
  return select(keep, s,
                constTile(-std::numeric_limits<double>::infinity(), sTy));
}

/// -inf where key n0 + c is past Nkv or outside row m0 + r's band.
Value TiledForwardBuilder::maskScores(Value s, Value n0) {
  Type i32 = b.getI32Type();
  Tensor sTy = tile({br, bc}, i32), rowTy = tile({br}, i32);
  Value cols = indexTile(sTy, 1, n0); // kv_idx of each element
  Value ok = cmpI(CmpIPredicate::slt, cols, splat(toI32(nkv), sTy));
  if (hasBand) {
    Value diag =
        pack ? arith::AddIOp::create(b, queryOf(indexTile(rowTy, 0, m0)),
                                     splat(toI32(offset), rowTy))
             : indexTile(rowTy, 0, add(m0, offset));
    Value lo = arith::SubIOp::create(b, diag, splat(toI32(winL), rowTy));
    Value hi = arith::AddIOp::create(b, diag, splat(toI32(winR), rowTy));
    ok = andI(ok, cmpI(CmpIPredicate::sge, cols, broadcast(lo, sTy, 1)));
    ok = andI(ok, cmpI(CmpIPredicate::sle, cols, broadcast(hi, sTy, 1)));
  }
  Value negInf =
      constTile(-std::numeric_limits<double>::infinity(), tile({br, bc}, f32));
  return select(ok, s, negInf);
}

} // namespace flashjit::attn::detail
