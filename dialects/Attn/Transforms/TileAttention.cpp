//===- TileAttention.cpp - attn.flash_fwd -> the tiled FA-2 loop ----------===//
//
/// \file
/// `flashjit-tile-attention` turns a kernel description into one program of
/// the FlashAttention-2 forward, written in the tile dialect: the shared
/// stage that the CPU execution mode and the GPU lowering both compile, so
/// every arithmetic decision is made here. Before:
///
///   attn.flash_fwd @attention {element_type = bf16, head_dim_qk = 96 : i64,
///       head_dim_v = 96 : i64, mask = "causal", gqa = 1 : i64,
///       sparse_block = 0 : i64}
///
/// After (abridged; Br = 64, Bc = 32):
///
///   func.func @attention(%q: memref<?xbf16>, ..., %pid_m: index,
///       %pid_bh: index) attributes {attn.kernel = #attn.kernel<role =
///       "forward", ..., block_m = 64, block_n = 32, ...>} {
///     %q = tile.load %Q[%qoff] rows %m0 of %nq stride %sq
///     %r:3 = scf.for %t = %lo to %hi step %c1
///         iter_args(%o = %zeros, %m = %neginf, %l = %zero) {
///       %k = tile.load %K[...] rows %n0 of %nkv stride %sk
///       %v = tile.load %V[...] rows %n0 of %nkv stride %sv
///       %s = tile.dot %q, %k {transpose_rhs}            // raw scores, f32
///       %s2 = scf.if %straddles { select(in band, %s, -inf) } else { %s }
///       %mn = maxnumf(%m, reduce_max(%s2) * scale_log2e)
///       %mu = select(%mn == -inf, 0, %mn)
///       %a = exp2(%m - %mu)
///       %p = exp2(fma(%s2, scale_log2e, -bcast(%mu)))
///       %l2 = %l * %a + reduce_sum(%p)
///       %o2 = tile.dot truncf(%p), %v acc %o * bcast(%a)   // P rounded
///       scf.yield %o2, %mn, %l2
///     }
///     tile.store truncf(%r#0 * bcast(1 / l)), %O[...]  // 0 where l = 0
///     tile.store (m + log2 l) * ln 2, %LSE[...]           // -inf where l = 0
///   }
///
/// The row max is taken on the raw scores and then scaled: the scale is > 0
/// (the description's 0 means 1 / sqrt(d)), so max(s) * c = max(s * c), and
/// P = exp2(s * c - m) is one FMA per score. Blocks that lie outside the
/// band or past Nkv (a BCSR layout can list them) are fully masked, so they
/// add nothing.
///
/// With a score_mod region the scores are scaled first and the region is
/// inlined on the tile (ScoreMod.cpp), before the mask: S' = mod(scale *
/// Q K^T, b, h, i, j) with the query and key positions i = m0 + r and
/// j = n0 + c built as the mask builds its columns (indexTile); the row max
/// and P = exp2(S' * log2(e) - m) then use log2(e) in place of
/// scale_log2e, so m and lse are those of the modified scores.
/// `attn.kernel` names the modifier (score_mod = "alibi:8").
///
/// A mask_mod region is inlined after it (applyMaskMod): its i1 tile
/// selects -inf where it yields false, on the raw or the modified scores,
/// and `attn.kernel` says mask_mod = "custom".
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/Passes.h"
#include "dialects/Attn/Transforms/ScoreMod.h"
#include "dialects/Attn/Transforms/TileIRBuilder.h"
#include "dialects/Attn/Transforms/TiledForward.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>
#include <limits>
#include <tuple>

namespace flashjit::attn {
#define GEN_PASS_DEF_TILEATTENTION
#include "dialects/Attn/Transforms/Passes.h.inc"
} // namespace flashjit::attn

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;
using arith::CmpFPredicate;
using arith::CmpIPredicate;

using flashjit::attn::detail::kWindowClamp;
using flashjit::attn::detail::TiledForwardBuilder;

flashjit::attn::detail::ForwardArguments
flashjit::attn::detail::forwardArguments(OpBuilder &b, FlashFwdOp op,
                                         bool split) {
  Type elemTy = op.getElementType(), f32 = b.getF32Type(),
       idxTy = b.getIndexType();
  auto bufTy = MemRefType::get({ShapedType::kDynamic}, elemTy);
  auto f32BufTy = MemRefType::get({ShapedType::kDynamic}, f32);
  auto i32BufTy = MemRefType::get({ShapedType::kDynamic}, b.getI32Type());
  ForwardArguments a;
  // q, k, v, o; lse; counts, indices, cu_seqlens_q, cu_seqlens_kv.
  a.types = {bufTy,    bufTy,    bufTy,    bufTy,   f32BufTy,
             i32BufTy, i32BufTy, i32BufTy, i32BufTy};
  if (split)
    a.types.append({f32BufTy, f32BufTy});
  const int numBufs = split ? int(abi::split::NumBuffers) : abi::NumBuffers;
  const int numIdx = split ? abi::split::NumIndexArgs : abi::NumIndexArgs;
  for (int i = 0; i < numBufs; ++i)
    a.names.push_back(b.getStringAttr(abi::split::bufferName(i)));
  for (int i = 0; i < numIdx; ++i) {
    a.types.push_back(idxTy);
    a.names.push_back(b.getStringAttr(
        i < abi::NumIndexArgs ? abi::indexArgName(i) : "kv_splits"));
  }
  a.types.append({f32, idxTy, idxTy});
  for (const char *n : {"scale_log2e", "pid_m", "pid_bh"})
    a.names.push_back(b.getStringAttr(n));
  if (split) {
    a.types.push_back(idxTy);
    a.names.push_back(b.getStringAttr("pid_split"));
  }
  // The modifiers' captured tensors (score_mod's, then mask_mod's), after
  // everything else (the kernel ABI's positions stay as they are).
  const int64_t captures = totalCapturedTensors(op);
  for (int64_t c = 0; c < captures; ++c) {
    a.types.push_back(f32BufTy);
    a.names.push_back(b.getStringAttr("capture" + std::to_string(c)));
  }
  return a;
}

func::FuncOp TiledForwardBuilder::build() {
  MLIRContext *ctx = b.getContext();
  auto [argTys, argNames] = forwardArguments(b, op, split);
  func = func::FuncOp::create(b, op.getSymName(),
                              FunctionType::get(ctx, argTys, {}));
  // The modifier by name, so that a reader of this stage checks it.
  std::string scoreMod = op.namedScoreMod().value_or("custom");
  func->setAttr("attn.kernel",
                KernelAttr::get(ctx, split ? "forward_split" : "forward", dqk,
                                dv, elemTy, op.getMask(), op.getGqa(),
                                sparseBlock, br, bc,
                                /*deterministic=*/false, scoreMod,
                                op.hasMaskMod() ? "custom" : ""));
  func->setAttr("attn.arg_names", b.getArrayAttr(argNames));
  b.setInsertionPointToStart(func.addEntryBlock());

  setUpProgram();
  qTile = loadTile(tile({br, dqk}, elemTy), arg(abi::Q), qBase, m0, nRows,
                   indexArg(abi::QStrideN), group,
                   group ? indexArg(abi::QStrideH) : Value());
  loopBounds();

  Tensor oTy = tile({br, dv}, f32), rowTy = tile({br}, f32);
  SmallVector<Value> init = {
      constTile(0.0, oTy),
      constTile(-std::numeric_limits<double>::infinity(), rowTy),
      constTile(0.0, rowTy)};
  SmallVector<Value> out;
  if (leadTwo)
    out = buildLeadTwoLoop(init);
  else if (overlap)
    out = buildOverlappedLoop(init);
  else
    out = buildLoop(init)->getResults();
  writeOutput(out[0], out[1], out[2]);
  func::ReturnOp::create(b);
  if (split) {
    b.setInsertionPointAfter(func);
    flashjit::attn::detail::buildSplitCombine(b, op, func);
  }
  if (op.hasMaskMod() && sparseBlock > 0) {
    b.setInsertionPointAfter(func);
    flashjit::attn::detail::buildMaskBlocks(b, op);
  }
  return func;
}

/// Which (batch, head, Q block) this program owns (GQA maps query head h to
/// KV head h / gqa), the bases of its rows, and the band of keys it sees.
void TiledForwardBuilder::setUpProgram() {
  nqMax = indexArg(abi::SeqQ);
  nkv = indexArg(abi::SeqKV);
  scaleLog2 = arg(numBufs + numIdx);
  expFactor = op.hasScoreMod() ? cF32(1.0 / std::log(2.0)) : scaleLog2;
  // scale = scale_log2e * ln 2: the kernel's one scale argument.
  if (op.hasScoreMod())
    scale = fmul(scaleLog2, cF32(std::log(2.0)));
  Value pidM = arg(numBufs + numIdx + 1);
  Value pidBH = arg(numBufs + numIdx + 2);
  Value heads = indexArg(abi::Heads);
  Value hkIdx;
  if (pack) {
    // pid_bh = b * (H / gqa) + hk; hIdx is the group's first query head.
    Value kvHeads = arith::DivUIOp::create(b, heads, cIdx(op.getGqa()));
    bIdx = arith::DivUIOp::create(b, pidBH, kvHeads);
    hkIdx = arith::RemUIOp::create(b, pidBH, kvHeads);
    hIdx = mulC(hkIdx, op.getGqa());
    group = cIdx(op.getGqa());
  } else {
    bIdx = arith::DivUIOp::create(b, pidBH, heads);
    hIdx = arith::RemUIOp::create(b, pidBH, heads);
    hkIdx = arith::DivUIOp::create(b, hIdx, cIdx(op.getGqa()));
  }
  // Varlen: this batch's sequence, its rows from its first; the padded
  // rows (lse, the split workspaces) stay nqMax per (batch, head).
  nq = nqMax;
  Value startQ, startKV; // varlen only
  if (op.getVarlen()) {
    std::tie(startQ, nq) = sequenceOf(arg(abi::CuSeqQ), bIdx);
    std::tie(startKV, nkv) = sequenceOf(arg(abi::CuSeqKV), bIdx);
  }
  nRows = pack ? mulC(nq, op.getGqa()) : nq;
  m0 = mulC(pidM, br);
  // Varlen: the sequence's first row in place of the batch (whose stride
  // the kernel ignores).
  auto base = [&](abi::IndexArg sb, abi::IndexArg sh, Value head, Value start,
                  abi::IndexArg sn) {
    Value at = op.getVarlen() ? mul(start, indexArg(sn))
                              : mul(bIdx, indexArg(sb));
    return add(at, mul(head, indexArg(sh)));
  };
  qBase = base(abi::QStrideB, abi::QStrideH, hIdx, startQ, abi::QStrideN);
  kBase = base(abi::KStrideB, abi::KStrideH, hkIdx, startKV, abi::KStrideN);
  vBase = base(abi::VStrideB, abi::VStrideH, hkIdx, startKV, abi::VStrideN);
  oBase = base(abi::OStrideB, abi::OStrideH, hIdx, startQ, abi::OStrideN);
  Value bh = pack ? add(mul(bIdx, heads), hIdx) : pidBH;
  lseBase = mul(bh, nqMax);
  if (split) {
    // Split s's slab of the workspaces: [s, b, h, 0, 0].
    sIdx = arg(numBufs + numIdx + 3);
    nSplits = indexArg(abi::split::KvSplits);
    Value slab = add(mul(sIdx, mul(indexArg(abi::Batch), heads)), bh);
    lsePartBase = mul(slab, nqMax);
    oPartBase = mulC(lsePartBase, dv);
  }

  // The band of visible keys (bottom-right aligned): row i sees
  // [i + off - L, i + off + R], off = Nkv - Nq. [jLo, jHi] covers the rows
  // of this block; keys in [fullLo, fullHi] are visible from all of them.
  offset = sub(nkv, nq);
  Value rowsValid = minI(cIdx(br), sub(nRows, m0));
  Value lastRow = add(m0, sub(rowsValid, cIdx(1)));
  // The first and last query positions of the block's rows.
  Value firstQ = pack ? arith::DivUIOp::create(b, m0, group).getResult() : m0;
  Value lastQ =
      pack ? arith::DivUIOp::create(b, lastRow, group).getResult() : lastRow;
  if (hasBand) {
    winL = minI(indexArg(abi::WindowLeft), cIdx(kWindowClamp));
    winR = minI(indexArg(abi::WindowRight), cIdx(kWindowClamp));
    jLo = maxI(cIdx(0), sub(add(firstQ, offset), winL));
    jHi = minI(sub(nkv, cIdx(1)), add(add(lastQ, offset), winR));
    fullLo = sub(add(lastQ, offset), winL);
    fullHi = add(add(firstQ, offset), winR);
  } else {
    jLo = cIdx(0);
    jHi = sub(nkv, cIdx(1));
  }
}

/// The KV loop's iterations [tLo, tHi): the blocks of Bc keys that meet
/// [jLo, jHi], or every Bc-block of the sparse blocks the layout lists.
///
/// Split-KV: the s-th of S runs of ceil((tHi - tLo) / S) of them (empty
/// past the end).
void TiledForwardBuilder::loopBounds() {
  if (sparseBlock == 0) {
    std::tie(tLo, tHi) = blocksMeeting(jLo, jHi, bc);
  } else {
    list =
        blockList(arg(abi::Counts), arg(abi::Indices),
                  {indexArg(abi::CountsStrideB), indexArg(abi::CountsStrideH),
                   indexArg(abi::IndicesStrideB), indexArg(abi::IndicesStrideH),
                   indexArg(abi::IndicesStrideM)},
                  bIdx, hIdx, m0, sparseBlock, bc, tHi);
    tLo = cIdx(0);
  }
  // Varlen: a program past its sequence's rows visits nothing and stores
  // nothing.
  if (op.getVarlen())
    tHi = endWithinSequence(tLo, tHi, m0, nRows);
  if (!split)
    return;
  Value n = sub(tHi, tLo);
  Value run = arith::DivUIOp::create(b, add(n, sub(nSplits, cIdx(1))), nSplits);
  Value first = add(tLo, mul(sIdx, run));
  tLo = minI(first, tHi);
  tHi = minI(tHi, add(first, run));
}

Value TiledForwardBuilder::queryOf(Value rows) {
  if (!pack)
    return rows;
  auto ty = cast<Tensor>(rows.getType());
  return arith::DivUIOp::create(b, rows, splat(toI32(group), ty));
}

/// The KV loop over [tLo, tHi) carrying (O, m, l), one step() each.
scf::ForOp TiledForwardBuilder::buildLoop(ArrayRef<Value> init) {
  auto loop = scf::ForOp::create(b, tLo, tHi, cIdx(1), init);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(loop.getBody());
  auto carried = loop.getRegionIterArgs();
  scf::YieldOp::create(
      b, step(loop.getInductionVar(), carried[0], carried[1], carried[2]));
  return loop;
}

/// The software-pipelined KV loop (`overlap-softmax`), in the order of
/// FlashAttention-3's intra-warpgroup overlap: iteration t issues S of
/// block t + 1 and O += P_t V_t, then runs block t + 1's softmax while the
/// second product is in flight. The first block's scores and softmax come
/// before the loop, the last block's P V after it; the loop carries P
/// rounded (half the registers of S, and written only once the product
/// that read it is done) and the row max before block t's (O's factor
/// exp2(%mp - %mu) is taken again from it, so that the GPU skips the
/// rescale where no row of a warp moved). Returns the final (O, m, l):
///
///   %last = tLo < tHi ? tHi - 1 : tLo        // the loop: [tLo, %last)
///   %s0 = tile.dot %q, tile.load %K[block tLo, or 0 if there is none]
///   %m0, %l0, %p0 = the softmax of %s0 (no running sum)
///   %r:5 = scf.for %t = %tLo to %last iter_args(%o = 0, %m = %m0,
///       %l = select(%tLo < %tHi, %l0, 0), %p = truncf %p0, %mp = -inf) {
///     %kn = tile.load %K[block t + 1]
///     %v = tile.load %V[block t]
///     %sn = tile.dot %q, %kn {transpose_rhs}
///     %mu = select(%m == -inf, 0, %m)
///     %o2 = tile.dot %p, %v acc %o * bcast(exp2(%mp - %mu))  // in flight
///     ... the softmax of %sn -> %m2, %l2, %p2 ...            // meanwhile
///     scf.yield %o2, %m2, %l2, truncf %p2, %m
///   }
///   %pv = tile.dot %r#3, tile.load %V[block %last, or 0 if there is none]
///       acc %r#0 * bcast(exp2(%r#4 - select(%r#1 == -inf, 0, %r#1)))
///   %o = select(%tLo < %tHi, %pv, 0)
///
/// No block's scores are made twice. Where there is no block the loop is
/// empty and l = 0 (lse = -inf), and the select drops the P V of block 0
/// that the epilogue made anyway: O is +0 as the plain loop's, not the
/// -0 of a negative sum times 0 nor the NaN of a NaN or inf in keys no
/// row may see (T30: `SameBitsAsThePlainLoop` on empty sparse rows). The
/// epilogue's V block is found before the loop (so that the K/V ring's
/// producer, which runs only the scalar ops before it, can copy it). Each
/// block's arithmetic is the plain loop's, in the same order (O = P V +
/// O a of the same operands), so the result is the plain loop's bit for
/// bit.
TiledForwardBuilder::OverlappedStart
TiledForwardBuilder::startOverlapped(ArrayRef<Value> init) {
  Value live = cmpI(CmpIPredicate::ult, tLo, tHi);
  Value first = arith::SelectOp::create(b, live, blockStart(tLo), cIdx(0));
  Value last = arith::SelectOp::create(b, live, sub(tHi, cIdx(1)), tLo);
  Value nLast = arith::SelectOp::create(b, live, blockStart(last), cIdx(0));
  BlockSoftmax sm0 = softmax(scores(loadK(first)), first, init[1], Value(),
                             maskModPartial(tLo, first));
  // An empty loop leaves l = 0: O = 0 and lse = -inf, whatever m is.
  return {live,
          last,
          nLast,
          {init[0], sm0.m, select(live, sm0.l, init[2]),
           truncTile(sm0.p, elemTy), init[1]}};
}

SmallVector<Value>
TiledForwardBuilder::buildOverlappedLoop(ArrayRef<Value> init) {
  auto [live, last, nLast, carried] = startOverlapped(init);
  auto loop = scf::ForOp::create(b, tLo, last, cIdx(1), carried);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value t = loop.getInductionVar();
    auto args = loop.getRegionIterArgs();
    Value n0 = blockStart(t);
    Value next = add(t, cIdx(1));
    Value nNext = blockStart(next);
    Value kNext = loadK(nNext);
    Value v = loadV(n0);
    Value sNext = scores(kNext);
    scf::YieldOp::create(b, overlappedStep(args, v, sNext, next, nNext));
  }
  auto r = loop.getResults();
  Value o = select(live, lastProduct(r, loadV(nLast)), init[0]);
  return {o, r[1], r[2]};
}

/// The body of both overlapped loops after their S product is issued, on
/// the carried (O, m, l, P rounded, previous max) \p args: O += P V of
/// block t (its V tile \p v) on O rescaled by exp2(previous max - max),
/// then the softmax of block \p next (keys from \p nNext) on its raw
/// scores \p s. Returns the next (O, m, l, P rounded, previous max).
SmallVector<Value> TiledForwardBuilder::overlappedStep(ValueRange args, Value v,
                                                       Value s, Value next,
                                                       Value nNext) {
  Value alpha = exp2(fsub(args[4], usableMax(args[1])));
  Value oNew = rescaledProduct(args[0], alpha, args[3], v);
  BlockSoftmax sm =
      softmax(s, nNext, args[1], args[2], maskModPartial(next, nNext));
  return {oNew, sm.m, sm.l, truncTile(sm.p, elemTy), args[1]};
}

/// The last block's O += P V after an overlapped loop, on the carried (O,
/// m, l, P rounded, previous max) \p r and that block's V tile \p v: O
/// rescaled by exp2(previous max - max), as overlappedStep's.
Value TiledForwardBuilder::lastProduct(ValueRange r, Value v) {
  Value alpha = exp2(fsub(r[4], usableMax(r[1])));
  return rescaledProduct(r[0], alpha, r[3], v);
}

/// The overlapped loop with S two blocks ahead (`softmax-lead=2`): iteration
/// t issues S of block t + 2, then O += P_t V_t, then the softmax of block
/// t + 1 on the raw S the loop carried, so that no softmax waits for a
/// product of its own (on the GPU both consumer warpgroups may then be in
/// their softmax at once). Each block's arithmetic is the plain loop's,
/// in the same order. Returns the final (O, m, l):
///
///   %has2 = tLo + 1 < tHi; %last = tLo < tHi ? tHi - 1 : tLo
///   %m0, %l0, %p0 = the softmax of tile.dot %q, K[block tLo]
///   %s1 = tile.dot %q, K[block tLo + 1, or tLo without it]
///   %r:6 = scf.for %t = %tLo to (%has2 ? %last - 1 : %tLo)
///       iter_args(%o = 0, %m = %m0, %l = %l0, %p = truncf %p0,
///                 %mp = -inf, %s = %s1) {
///     %sn = tile.dot %q, K[block t + 2] {transpose_rhs}
///     %o2 = tile.dot %p, V[block t] acc %o * bcast(exp2(%mp - %mu))
///     ... the softmax of %s (block t + 1) -> %m2, %l2, %p2 ...
///     scf.yield %o2, %m2, %l2, truncf %p2, %m, %sn
///   }
///   %o1 = P V of %r#3 and V[block %last - 1, or tLo] (as the loop's)
///   %o2 = %o1 rescaled, plus the P V of %r#5's softmax (block %last)
///   (O, m, l) = %has2 ? (%o2, its m, its l) : (%o1, %r#1, %r#2),
///               O = 0 where tLo >= tHi (l is then 0: lse = -inf)
///
/// Block starts past the loop's range are never read: an index that may
/// not exist (tLo + 1, %last - 1) is taken only under %has2.
SmallVector<Value> TiledForwardBuilder::buildLeadTwoLoop(ArrayRef<Value> init) {
  auto [live, last, nLast, carried] = startOverlapped(init);
  Value second = add(tLo, cIdx(1));
  Value has2 = cmpI(CmpIPredicate::ult, second, tHi);
  Value nSecond = blockStart(arith::SelectOp::create(b, has2, second, tLo));
  Value loopEnd = arith::SelectOp::create(b, has2, sub(last, cIdx(1)), tLo);
  Value nTail = blockStart(loopEnd);
  carried.push_back(scores(loadK(nSecond)));
  auto loop = scf::ForOp::create(b, tLo, loopEnd, cIdx(1), carried);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value t = loop.getInductionVar();
    auto args = loop.getRegionIterArgs();
    Value n0 = blockStart(t);
    Value next = add(t, cIdx(1));
    Value nNext = blockStart(next);
    Value nAfter = blockStart(add(t, cIdx(2)));
    Value kAfter = loadK(nAfter);
    Value v = loadV(n0);
    Value sAfter = scores(kAfter);
    SmallVector<Value> yielded = overlappedStep(args, v, args[5], next, nNext);
    yielded.push_back(sAfter);
    scf::YieldOp::create(b, yielded);
  }
  auto r = loop.getResults();
  // One block: P of block tLo times its V. Two or more: P of block last - 1
  // times its V and block last's softmax (a step of the loop), then block
  // last's P V (for one block the step's softmax is made on block tLo
  // again and dropped).
  SmallVector<Value> c =
      overlappedStep(r.take_front(5), loadV(nTail), r[5], last, nLast);
  Value o = select(has2, lastProduct(c, loadV(nLast)), c[0]);
  Value m = select(has2, c[1], r[1]);
  Value l = select(has2, c[2], r[2]);
  return {select(live, o, init[0]), m, l};
}

/// The K (V) tile of keys [n0, n0 + Bc).
Value TiledForwardBuilder::loadK(Value n0) {
  return loadTile(tile({bc, dqk}, elemTy), arg(abi::K), kBase, n0, nkv,
                  indexArg(abi::KStrideN));
}

Value TiledForwardBuilder::loadV(Value n0) {
  return loadTile(tile({bc, dv}, elemTy), arg(abi::V), vBase, n0, nkv,
                  indexArg(abi::VStrideN));
}

/// The raw scores Q K^T of K tile \p k (f32).
Value TiledForwardBuilder::scores(Value k) {
  return dot(qTile, k, Value(), false, /*transposeRhs=*/true);
}

/// First key of iteration \p t.
Value TiledForwardBuilder::blockStart(Value t) {
  return sparseBlock == 0 ? mulC(t, bc) : listedBlockStart(list, t);
}

/// One iteration of the KV loop over keys [n0, n0 + Bc): the online-softmax
/// update of (O, m, l). m is in scaled log2 units; a row that has seen no
/// key keeps m = -inf and uses 0 as the subtrahend (no inf - inf).
SmallVector<Value> TiledForwardBuilder::step(Value t, Value o, Value m,
                                             Value l) {
  Value n0 = blockStart(t);
  Value k = loadK(n0);
  Value v = loadV(n0);
  return update(scores(k), n0, v, o, m, l, maskModPartial(t, n0));
}

/// O = acc / l and lse = (m + log2 l) * ln 2; a row that saw no key (l = 0)
/// gets O = 0 and lse = -inf. Split-KV: both in f32 into the split's slab
/// of o_part and lse_part, for the combine function to merge.
void TiledForwardBuilder::writeOutput(Value o, Value m, Value l) {
  Tensor rowTy = tile({br}, f32), oTy = tile({br, dv}, f32);
  Value zero = constTile(0.0, rowTy);
  Value empty = cmpF(CmpFPredicate::OEQ, l, zero);
  Value inv =
      select(empty, zero, arith::DivFOp::create(b, constTile(1.0, rowTy), l));
  Value out = fmul(o, broadcast(inv, oTy, 1));
  // Packed rows: heads nq * dv (nq) elements apart in o_part (lse_part).
  if (split)
    storeTile(out, arg(abi::split::OPart), oPartBase, m0, nRows, cIdx(dv),
              group, group ? mulC(nqMax, dv) : Value());
  else
    storeTile(truncTile(out, elemTy), arg(abi::O), oBase, m0, nq,
              indexArg(abi::OStrideN));
  Value lse = fmul(fadd(m, log2(l)), constTile(std::log(2.0), rowTy));
  lse = select(empty,
               constTile(-std::numeric_limits<double>::infinity(), rowTy), lse);
  if (split)
    storeTile(lse, arg(abi::split::LsePart), lsePartBase, m0, nRows, Value(),
              group, group ? nqMax : Value());
  else
    storeTile(lse, arg(abi::Lse), lseBase, m0, nq, Value());
}

namespace {
struct TileAttentionPass
    : public flashjit::attn::impl::TileAttentionBase<TileAttentionPass> {
  using TileAttentionBase::TileAttentionBase;

  void runOnOperation() override {
    if (softmaxLead != 1 && softmaxLead != 2) {
      getOperation().emitError()
          << "softmax-lead must be 1 or 2, got " << int64_t(softmaxLead);
      return signalPassFailure();
    }
    WalkResult checked = getOperation().walk([](FlashFwdOp op) {
      for (Region *region : {&op.getScoreMod(), &op.getMaskMod()})
        if (!region->empty() &&
            failed(flashjit::attn::detail::checkScoreModTileable(op, *region)))
          return WalkResult::interrupt();
      return WalkResult::advance();
    });
    if (checked.wasInterrupted())
      return signalPassFailure();
    if (failed(
            flashjit::attn::detail::tileEach<FlashFwdOp, TiledForwardBuilder>(
                getOperation(), blockM, blockN, bool(kvSplit),
                bool(overlapSoftmax), bool(biasProduct), int64_t(softmaxLead))))
      signalPassFailure();
  }
};
} // namespace
