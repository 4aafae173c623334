//===- TileAttentionBackward.cpp - attn.flash_bwd -> the tiled FA-2 backward //
//
/// \file
/// `flashjit-tile-attention-backward` turns a backward description into three
/// functions sharing one argument list (kernels/KernelABI.h, abi::bwd). Before:
///
///   attn.flash_bwd @attention {element_type = bf16, head_dim_qk = 96 : i64,
///       head_dim_v = 96 : i64, mask = "causal", gqa = 1 : i64,
///       sparse_block = 0 : i64}                 // deterministic = false
///
/// After (abridged; Br = 64 query rows, Bc = 32 keys):
///
///   func.func @attention_preprocess(...)  // program: Q block, batch*head
///     delta[i] = sum_d dO[i, d] * O[i, d]; dq_accum[i, :] = 0
///   func.func @attention(...)             // program: KV block, batch*kv head
///     %kt, %vt = K, V tiles; %dk, %dv = 0        // f32, Bc rows
///     scf.for %g = 0 to gqa {                    // query heads of the group
///       scf.for %qb = %lo to %hi {               // Q blocks that see the keys
///         ... Q, dO tiles; lse * log2(e) (+inf: the row sees nothing)
///         ... P = exp2(S * scale * log2(e) - lse * log2(e)), masked only
///             if the block pair straddles the band
///         ... dV += P^T dO; dP = dO V^T; dS = P * (dP - delta); dK += dS^T Q
///         ... memref.atomic_rmw addf: dq_accum[rows] += dS K
///       }
///     }
///     dk = dK * scale; dv = dV
///   func.func @attention_dq(...)          // role "dq_convert": Q block,
///     dq = dq_accum * scale               // batch*head
///
/// With `deterministic = true` the main function adds nothing to dq_accum
/// (and the preprocessing does not zero it), and @attention_dq (role "dq")
/// is a separate pass over Q blocks, with no atomics:
///
///   func.func @attention_dq(...)          // program: Q block, batch*head
///     scf.for %kb = %lo to %hi {                 // KV blocks its rows see
///       ... the same P and dS; dQ += dS K
///     }
///     dq = dQ * scale
///
/// Atomic dQ (the default) sums in an order that varies run to run; the
/// separate pass is bit-identical run to run. With GQA the main program sums
/// dK and dV over the query heads of its KV head's group. P and dS are
/// rounded to the element type where they feed a matmul, as a tensor-core
/// kernel would (dQ's dS K too, in both modes). Block-sparse: the main loop
/// reads the transposed (KV-major) layout, the dQ pass the forward's.
/// Everything is scf/arith/math/memref, as the forward.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/Passes.h"
#include "dialects/Attn/Transforms/TiledBuilder.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>
#include <limits>

namespace flashjit::attn {
#define GEN_PASS_DEF_TILEATTENTIONBACKWARD
#include "dialects/Attn/Transforms/Passes.h.inc"
} // namespace flashjit::attn

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;
namespace bwd = flashjit::abi::bwd;

namespace {

using Pred = arith::CmpIPredicate;

/// Builds the three tiled functions of one attn.flash_bwd op.
class TiledBackwardBuilder : flashjit::attn::detail::TiledBuilderBase {
public:
  TiledBackwardBuilder(FlashBwdOp op, int64_t br, int64_t bc)
      : TiledBuilderBase(op), op(op), br(br), bc(bc), dqk(op.getHeadDimQk()),
        dv(op.getHeadDimV()), gqa(op.getGqa()),
        sparseBlock(op.getSparseBlock()), hasBand(op.getMask() != "none"),
        atomicDq(!op.getDeterministic()), elemTy(op.getElementType()) {}

  void build() {
    buildPreprocess();
    buildMain();
    if (atomicDq)
      buildDqConvert();
    else
      buildDq();
  }

private:
  Value arg(int i) { return func.getArgument(i); }
  Value buf(bwd::Buffer i) { return arg(i); }
  Value indexArg(bwd::IndexArg i) { return arg(bwd::NumBuffers + i); }
  Value f32Arg(bwd::ScalarArg i) {
    return arg(bwd::NumBuffers + bwd::NumIndexArgs + i);
  }
  Value pidM() {
    return arg(bwd::NumBuffers + bwd::NumIndexArgs + bwd::NumF32Args);
  }
  Value pidBH() {
    return arg(bwd::NumBuffers + bwd::NumIndexArgs + bwd::NumF32Args + 1);
  }
  /// b * stride_b + h * stride_h of a strided (B, H, N, d) buffer.
  Value headBase(bwd::IndexArg strideB, Value bI, Value hI) {
    return add(mul(bI, indexArg(strideB)),
               mul(hI, indexArg(bwd::IndexArg(strideB + 1))));
  }

  void beginFunc(StringRef name, StringRef role);
  /// A row-block function's program: (batch, head), its first row, how
  /// many of its Br rows exist, and their index in the packed statistics.
  struct RowBlock {
    Value bI, hI, first, rows, statBase;
  };
  RowBlock rowBlock();
  void buildPreprocess();
  void buildMain();
  void buildDq();
  void buildDqConvert();

  void allocTiles();
  void zeroTile(Value tile, int64_t rows, int64_t cols);
  void loadRowBlock(Value m0, Value bI, Value hI);
  void loadKeyBlock(Value n0, Value bI, Value hkI);
  void computePAndDS(Value n0);
  void maskP(Value n0);
  void accumulateDKDV();
  void accumulateDQ();
  void addDQToAccum(Value bI, Value hI);
  Value dqAccumIndex(Value row, Value col);
  void writeRows(int64_t cols, Value count, Value dst, Value dstBase,
                 bwd::IndexArg strideN,
                 llvm::function_ref<Value(Value, Value)> element);
  void writeTile(Value tile, int64_t cols, Value count, Value dst,
                 Value dstBase, bwd::IndexArg strideN, Value factor);

  FlashBwdOp op;
  const int64_t br, bc, dqk, dv, gqa, sparseBlock;
  const bool hasBand;
  /// dQ by atomic adds into dq_accum (not `deterministic`): the main loop
  /// adds dS K, @f_dq only converts; else @f_dq is the separate pass.
  const bool atomicDq;
  Type elemTy;
  func::FuncOp func;

  // Values of the function being built, set up in beginFunc().
  Value nq, nkv, heads, offset, winL, winR, scaleLog2, scale;
  Value zeroF, posInf, negInf, log2e;
  // The tiles (allocated at the entry of the main and dQ functions).
  Value qTile, doTile, lseRow, dRow, kTile, vTile, pTile, dsTile;
  Value dkAcc, dvAcc, dqAcc;
  // The current Q block: first row, valid rows.
  Value m0, rowsValid;
};

} // namespace

/// Creates `@<name>` with the shared argument list, records the description,
/// the tiling and the function's role, and sets up the common values.
void TiledBackwardBuilder::beginFunc(StringRef name, StringRef role) {
  MLIRContext *ctx = b.getContext();
  b.setInsertionPoint(op);
  auto halfBuf = MemRefType::get({ShapedType::kDynamic}, elemTy);
  auto f32Buf = MemRefType::get({ShapedType::kDynamic}, f32);
  auto i32Buf = MemRefType::get({ShapedType::kDynamic}, b.getI32Type());
  SmallVector<Type> argTys;
  SmallVector<Attribute> argNames;
  for (int i = 0; i < bwd::NumBuffers; ++i) {
    bool isF32 = i == bwd::Lse || i == bwd::Delta || i == bwd::DqAccum;
    bool isI32 = i >= bwd::Counts;
    argTys.push_back(isF32 ? f32Buf : isI32 ? i32Buf : halfBuf);
    argNames.push_back(b.getStringAttr(bwd::bufferName(i)));
  }
  for (int i = 0; i < bwd::NumIndexArgs; ++i) {
    argTys.push_back(idxTy);
    argNames.push_back(b.getStringAttr(bwd::indexArgName(i)));
  }
  for (int i = 0; i < bwd::NumF32Args; ++i) {
    argTys.push_back(f32);
    argNames.push_back(b.getStringAttr(bwd::f32ArgName(i)));
  }
  for (const char *n : {"pid_m", "pid_bh"}) {
    argTys.push_back(idxTy);
    argNames.push_back(b.getStringAttr(n));
  }
  func = func::FuncOp::create(b, name, FunctionType::get(ctx, argTys, {}));
  func->setAttr("attn.kernel",
                KernelAttr::get(ctx, role, op.getHeadDimQk(), op.getHeadDimV(),
                                elemTy, op.getMask(), op.getGqa(),
                                op.getSparseBlock(), br, bc,
                                op.getDeterministic()));
  func->setAttr("attn.arg_names", b.getArrayAttr(argNames));

  b.setInsertionPointToStart(func.addEntryBlock());
  zeroF = cF32(0.0);
  posInf = cF32(std::numeric_limits<double>::infinity());
  negInf = cF32(-std::numeric_limits<double>::infinity());
  log2e = cF32(1.0 / std::log(2.0));
  nq = indexArg(bwd::SeqQ);
  nkv = indexArg(bwd::SeqKV);
  heads = indexArg(bwd::Heads);
  offset = sub(nkv, nq);
  if (hasBand) {
    winL = indexArg(bwd::WindowLeft);
    winR = indexArg(bwd::WindowRight);
  }
  scaleLog2 = f32Arg(bwd::ScaleLog2e);
  scale = f32Arg(bwd::Scale);
}

TiledBackwardBuilder::RowBlock TiledBackwardBuilder::rowBlock() {
  RowBlock r;
  r.bI = arith::DivUIOp::create(b, pidBH(), heads);
  r.hI = arith::RemUIOp::create(b, pidBH(), heads);
  r.first = mulC(pidM(), br);
  r.rows = minI(cIdx(br), sub(nq, r.first));
  r.statBase = add(mul(pidBH(), nq), r.first);
  return r;
}

/// delta[row] = sum_d dO[row, d] * O[row, d] (f32) for the rows of one Q
/// block of one (batch, head); with atomic dQ also dq_accum[row, :] = 0.
void TiledBackwardBuilder::buildPreprocess() {
  beginFunc((op.getSymName() + bwd::kPreprocessSuffix).str(), "preprocess");
  RowBlock blk = rowBlock();
  Value oBase = add(headBase(bwd::OStrideB, blk.bI, blk.hI),
                    mul(blk.first, indexArg(bwd::OStrideN)));
  Value doBase = add(headBase(bwd::DOStrideB, blk.bI, blk.hI),
                     mul(blk.first, indexArg(bwd::DOStrideN)));
  forLoop(cIdx(0), blk.rows, [&](Value r) {
    Value oRow = add(oBase, mul(r, indexArg(bwd::OStrideN)));
    Value doRow = add(doBase, mul(r, indexArg(bwd::DOStrideN)));
    Value d = forReduce(cIdx(0), cIdx(dv), zeroF, [&](Value c, Value a) {
      return fadd(a, fmul(loadF32(buf(bwd::DO), add(doRow, c)),
                          loadF32(buf(bwd::O), add(oRow, c))));
    });
    store(d, buf(bwd::Delta), {add(blk.statBase, r)});
    if (atomicDq)
      forLoop(cIdx(0), cIdx(dqk), [&](Value c) {
        store(zeroF, buf(bwd::DqAccum),
              {dqAccumIndex(add(blk.statBase, r), c)});
      });
  });
  func::ReturnOp::create(b);
}

void TiledBackwardBuilder::allocTiles() {
  auto tile = [&](int64_t rows, int64_t cols) -> Value {
    return memref::AllocaOp::create(b, MemRefType::get({rows, cols}, f32));
  };
  auto vec = [&](int64_t n) -> Value {
    return memref::AllocaOp::create(b, MemRefType::get({n}, f32));
  };
  qTile = tile(br, dqk);
  doTile = tile(br, dv);
  lseRow = vec(br);
  dRow = vec(br);
  kTile = tile(bc, dqk);
  vTile = tile(bc, dv);
  pTile = tile(br, bc);
  dsTile = tile(br, bc);
}

void TiledBackwardBuilder::zeroTile(Value tile, int64_t rows, int64_t cols) {
  forLoop(cIdx(0), cIdx(rows), [&](Value r) {
    forLoop(cIdx(0), cIdx(cols), [&](Value c) { store(zeroF, tile, {r, c}); });
  });
}

/// Loads the Q block of rows [m0, m0 + Br) of query head hI: Q and dO tiles
/// (zero past Nq), lse * log2(e) (+inf for rows past Nq or that see no key,
/// so that their P is exp2(-inf) = 0) and delta.
void TiledBackwardBuilder::loadRowBlock(Value first, Value bI, Value hI) {
  m0 = first;
  rowsValid = minI(cIdx(br), sub(nq, m0));
  Value qBase =
      add(headBase(bwd::QStrideB, bI, hI), mul(m0, indexArg(bwd::QStrideN)));
  Value doBase =
      add(headBase(bwd::DOStrideB, bI, hI), mul(m0, indexArg(bwd::DOStrideN)));
  Value statBase = add(mul(add(mul(bI, heads), hI), nq), m0);
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    Value valid = cmpI(Pred::slt, r, rowsValid);
    Value row = select(valid, r, cIdx(0));
    Value qRow = add(qBase, mul(row, indexArg(bwd::QStrideN)));
    forLoop(cIdx(0), cIdx(dqk), [&](Value d) {
      Value x = select(valid, loadF32(buf(bwd::Q), add(qRow, d)), zeroF);
      store(x, qTile, {r, d});
    });
    Value doRow = add(doBase, mul(row, indexArg(bwd::DOStrideN)));
    forLoop(cIdx(0), cIdx(dv), [&](Value d) {
      Value x = select(valid, loadF32(buf(bwd::DO), add(doRow, d)), zeroF);
      store(x, doTile, {r, d});
    });
    Value lse = load(buf(bwd::Lse), {add(statBase, row)});
    Value seesKeys = arith::AndIOp::create(
        b, valid,
        arith::CmpFOp::create(b, arith::CmpFPredicate::OGT, lse, negInf));
    store(select(seesKeys, fmul(lse, log2e), posInf), lseRow, {r});
    Value delta = load(buf(bwd::Delta), {add(statBase, row)});
    store(select(valid, delta, zeroF), dRow, {r});
  });
}

/// Loads K and V of keys [n0, n0 + Bc) of KV head hkI (zero past Nkv).
void TiledBackwardBuilder::loadKeyBlock(Value n0, Value bI, Value hkI) {
  Value keysValid = minI(cIdx(bc), sub(nkv, n0));
  Value kBase =
      add(headBase(bwd::KStrideB, bI, hkI), mul(n0, indexArg(bwd::KStrideN)));
  Value vBase =
      add(headBase(bwd::VStrideB, bI, hkI), mul(n0, indexArg(bwd::VStrideN)));
  forLoop(cIdx(0), cIdx(bc), [&](Value c) {
    Value valid = cmpI(Pred::slt, c, keysValid);
    Value key = select(valid, c, cIdx(0));
    Value kRow = add(kBase, mul(key, indexArg(bwd::KStrideN)));
    forLoop(cIdx(0), cIdx(dqk), [&](Value d) {
      Value x = select(valid, loadF32(buf(bwd::K), add(kRow, d)), zeroF);
      store(x, kTile, {c, d});
    });
    Value vRow = add(vBase, mul(key, indexArg(bwd::VStrideN)));
    forLoop(cIdx(0), cIdx(dv), [&](Value d) {
      Value x = select(valid, loadF32(buf(bwd::V), add(vRow, d)), zeroF);
      store(x, vTile, {c, d});
    });
  });
}

/// For the loaded Q block (rows m0..) and key block (keys n0..):
/// P = exp2(Q K^T * scale * log2(e) - lse * log2(e)), 0 where masked;
/// dS = P * (dO V^T - delta). Only block pairs that cross Nkv or the band's
/// edge pay for the element mask.
void TiledBackwardBuilder::computePAndDS(Value n0) {
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    Value l2 = load(lseRow, {r});
    forLoop(cIdx(0), cIdx(bc), [&](Value c) {
      Value dot = forReduce(cIdx(0), cIdx(dqk), zeroF, [&](Value d, Value a) {
        return fadd(a, fmul(load(qTile, {r, d}), load(kTile, {c, d})));
      });
      Value p = math::Exp2Op::create(b, fsub(fmul(dot, scaleLog2), l2));
      store(p, pTile, {r, c});
    });
  });
  Value n1 = add(n0, cIdx(bc - 1));
  Value needsMask = cmpI(Pred::sge, n1, nkv);
  if (hasBand) {
    Value lastRow = add(m0, sub(rowsValid, cIdx(1)));
    Value fullLo = sub(add(lastRow, offset), winL);
    Value fullHi = add(add(m0, offset), winR);
    needsMask = orI(needsMask, cmpI(Pred::slt, n0, fullLo));
    needsMask = orI(needsMask, cmpI(Pred::sgt, n1, fullHi));
  }
  ifThen(needsMask, [&] { maskP(n0); });
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    Value delta = load(dRow, {r});
    forLoop(cIdx(0), cIdx(bc), [&](Value c) {
      Value dp = forReduce(cIdx(0), cIdx(dv), zeroF, [&](Value d, Value a) {
        return fadd(a, fmul(load(doTile, {r, d}), load(vTile, {c, d})));
      });
      Value ds = fmul(load(pTile, {r, c}), fsub(dp, delta));
      store(ds, dsTile, {r, c});
    });
  });
}

/// P[r, c] = 0 where key n0 + c is past Nkv or outside row m0 + r's band.
void TiledBackwardBuilder::maskP(Value n0) {
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    Value diag = add(add(m0, r), offset);
    forLoop(cIdx(0), cIdx(bc), [&](Value c) {
      Value j = add(n0, c);
      Value visible = cmpI(Pred::slt, j, nkv);
      if (hasBand) {
        visible = andI(visible, cmpI(Pred::sge, j, sub(diag, winL)));
        visible = andI(visible, cmpI(Pred::sle, j, add(diag, winR)));
      }
      store(select(visible, load(pTile, {r, c}), zeroF), pTile, {r, c});
    });
  });
}

/// dV[c] += P[r, c] dO[r] and dK[c] += dS[r, c] Q[r] (scale applied at the
/// end), with P and dS rounded to the element type as the matmuls take them.
void TiledBackwardBuilder::accumulateDKDV() {
  forLoop(cIdx(0), cIdx(bc), [&](Value c) {
    forLoop(cIdx(0), cIdx(br), [&](Value r) {
      Value p = roundTo(elemTy, load(pTile, {r, c}));
      Value ds = roundTo(elemTy, load(dsTile, {r, c}));
      forLoop(cIdx(0), cIdx(dv), [&](Value d) {
        store(fadd(load(dvAcc, {c, d}), fmul(p, load(doTile, {r, d}))), dvAcc,
              {c, d});
      });
      forLoop(cIdx(0), cIdx(dqk), [&](Value d) {
        store(fadd(load(dkAcc, {c, d}), fmul(ds, load(qTile, {r, d}))), dkAcc,
              {c, d});
      });
    });
  });
}

/// dQ[r] += dS[r, c] K[c] (scale applied at the end).
void TiledBackwardBuilder::accumulateDQ() {
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    forLoop(cIdx(0), cIdx(bc), [&](Value c) {
      Value ds = roundTo(elemTy, load(dsTile, {r, c}));
      forLoop(cIdx(0), cIdx(dqk), [&](Value d) {
        store(fadd(load(dqAcc, {r, d}), fmul(ds, load(kTile, {c, d}))), dqAcc,
              {r, d});
      });
    });
  });
}

/// The index of dq_accum[row, col]: packed f32 [B * H * Nq, dqk], \p row
/// counted as delta's ((b * H + h) * Nq + i).
Value TiledBackwardBuilder::dqAccumIndex(Value row, Value col) {
  return add(mulC(row, dqk), col);
}

/// dq_accum[rows of the loaded Q block of (bI, hI), :] += the dQ tile, by
/// atomic adds: the programs of other KV blocks add to the same rows.
void TiledBackwardBuilder::addDQToAccum(Value bI, Value hI) {
  Value rowBase = add(mul(add(mul(bI, heads), hI), nq), m0);
  forLoop(cIdx(0), rowsValid, [&](Value r) {
    Value row = add(rowBase, r);
    forLoop(cIdx(0), cIdx(dqk), [&](Value d) {
      memref::AtomicRMWOp::create(b, arith::AtomicRMWKind::addf,
                                  load(dqAcc, {r, d}), buf(bwd::DqAccum),
                                  ValueRange{dqAccumIndex(row, d)});
    });
  });
}

/// dst[dstBase + i * stride_n + d] = elem(element(i, d)), i < count,
/// d < cols.
void TiledBackwardBuilder::writeRows(
    int64_t cols, Value count, Value dst, Value dstBase, bwd::IndexArg strideN,
    llvm::function_ref<Value(Value, Value)> element) {
  forLoop(cIdx(0), count, [&](Value i) {
    Value row = add(dstBase, mul(i, indexArg(strideN)));
    forLoop(cIdx(0), cIdx(cols), [&](Value d) {
      store(arith::TruncFOp::create(b, elemTy, element(i, d)), dst,
            {add(row, d)});
    });
  });
}

/// dst[dstBase + i * stride_n + d] = elem(tile[i, d] * factor), i < count.
void TiledBackwardBuilder::writeTile(Value tile, int64_t cols, Value count,
                                     Value dst, Value dstBase,
                                     bwd::IndexArg strideN, Value factor) {
  writeRows(cols, count, dst, dstBase, strideN, [&](Value i, Value d) {
    Value x = load(tile, {i, d});
    return factor ? fmul(x, factor) : x;
  });
}

/// The main loop: one program per (KV block, batch * KV head); dK and dV of
/// its keys stay in f32 tiles while it walks the Q blocks of every query head
/// of the group; with atomic dQ it adds each Q block's dS K into dq_accum.
void TiledBackwardBuilder::buildMain() {
  beginFunc(op.getSymName(), "main");
  Value kvHeads = arith::DivUIOp::create(b, heads, cIdx(gqa));
  Value bI = arith::DivUIOp::create(b, pidBH(), kvHeads);
  Value hkI = arith::RemUIOp::create(b, pidBH(), kvHeads);
  Value n0 = mulC(pidM(), bc);
  Value keysValid = minI(cIdx(bc), sub(nkv, n0));
  Value lastKey = add(n0, sub(keysValid, cIdx(1)));

  allocTiles();
  dkAcc = memref::AllocaOp::create(b, MemRefType::get({bc, dqk}, f32));
  dvAcc = memref::AllocaOp::create(b, MemRefType::get({bc, dv}, f32));
  if (atomicDq)
    dqAcc = memref::AllocaOp::create(b, MemRefType::get({br, dqk}, f32));
  loadKeyBlock(n0, bI, hkI);
  zeroTile(dkAcc, bc, dqk);
  zeroTile(dvAcc, bc, dv);

  // Rows that see a key of the block: query i sees key j iff
  // i + off - L <= j <= i + off + R, i.e. i in [j - off - R, j - off + L].
  Value iLo = cIdx(0), iHi = sub(nq, cIdx(1));
  if (hasBand) {
    iLo = maxI(iLo, sub(sub(n0, offset), winR));
    iHi = minI(iHi, add(sub(lastKey, offset), winL));
  }
  auto processQBlock = [&](Value first, Value hI) {
    loadRowBlock(first, bI, hI);
    computePAndDS(n0);
    accumulateDKDV();
    if (atomicDq) {
      // This block pair's share of dQ (the same rounded dS as dK's).
      zeroTile(dqAcc, br, dqk);
      accumulateDQ();
      addDQToAccum(bI, hI);
    }
  };
  forLoop(cIdx(0), cIdx(gqa), [&](Value g) {
    Value hI = add(mulC(hkI, gqa), g);
    if (sparseBlock == 0) {
      // The Q blocks of Br rows in [iLo, iHi].
      forBlocksInRange(iLo, iHi, br,
                       [&](Value first) { processQBlock(first, hI); });
      return;
    }
    // Block-sparse: the sparse Q blocks that the KV-major (transposed)
    // layout lists for this key block's sparse block, each as
    // sparse_block / Br Q blocks, skipping those outside [iLo, iHi].
    Value kvsb = arith::DivUIOp::create(b, n0, cIdx(sparseBlock));
    forListedBlocks(
        buf(bwd::KvCounts), buf(bwd::KvIndices),
        {indexArg(bwd::KvCountsStrideB), indexArg(bwd::KvCountsStrideH),
         indexArg(bwd::KvIndicesStrideB), indexArg(bwd::KvIndicesStrideH),
         indexArg(bwd::KvIndicesStrideM)},
        bI, hI, kvsb, sparseBlock, br, iLo, iHi,
        [&](Value first) { processQBlock(first, hI); });
  });

  Value dkBase =
      add(headBase(bwd::DKStrideB, bI, hkI), mul(n0, indexArg(bwd::DKStrideN)));
  Value dvBase =
      add(headBase(bwd::DVStrideB, bI, hkI), mul(n0, indexArg(bwd::DVStrideN)));
  writeTile(dkAcc, dqk, keysValid, buf(bwd::DK), dkBase, bwd::DKStrideN, scale);
  writeTile(dvAcc, dv, keysValid, buf(bwd::DV), dvBase, bwd::DVStrideN, {});
  func::ReturnOp::create(b);
}

/// The dQ pass: one program per (Q block, batch * head); walks the KV blocks
/// its rows see (as the forward does) and sums dQ in an f32 tile.
void TiledBackwardBuilder::buildDq() {
  beginFunc((op.getSymName() + bwd::kDqSuffix).str(), "dq");
  Value bI = arith::DivUIOp::create(b, pidBH(), heads);
  Value hI = arith::RemUIOp::create(b, pidBH(), heads);
  Value hkI = arith::DivUIOp::create(b, hI, cIdx(gqa));
  allocTiles();
  dqAcc = memref::AllocaOp::create(b, MemRefType::get({br, dqk}, f32));
  loadRowBlock(mulC(pidM(), br), bI, hI);
  zeroTile(dqAcc, br, dqk);

  // The band of keys the block's rows see (as in the forward).
  Value lastRow = add(m0, sub(rowsValid, cIdx(1)));
  Value jLo = cIdx(0), jHi = sub(nkv, cIdx(1));
  if (hasBand) {
    jLo = maxI(jLo, sub(add(m0, offset), winL));
    jHi = minI(jHi, add(add(lastRow, offset), winR));
  }
  auto processKVBlock = [&](Value n0) {
    loadKeyBlock(n0, bI, hkI);
    computePAndDS(n0);
    accumulateDQ();
  };
  if (sparseBlock == 0) {
    forBlocksInRange(jLo, jHi, bc, [&](Value n0) { processKVBlock(n0); });
  } else {
    Value qsb = arith::DivUIOp::create(b, m0, cIdx(sparseBlock));
    forListedBlocks(buf(bwd::Counts), buf(bwd::Indices),
                    {indexArg(bwd::CountsStrideB), indexArg(bwd::CountsStrideH),
                     indexArg(bwd::IndicesStrideB),
                     indexArg(bwd::IndicesStrideH),
                     indexArg(bwd::IndicesStrideM)},
                    bI, hI, qsb, sparseBlock, bc, jLo, jHi,
                    [&](Value n0) { processKVBlock(n0); });
  }

  Value dqBase =
      add(headBase(bwd::DQStrideB, bI, hI), mul(m0, indexArg(bwd::DQStrideN)));
  writeTile(dqAcc, dqk, rowsValid, buf(bwd::DQ), dqBase, bwd::DQStrideN, scale);
  func::ReturnOp::create(b);
}

/// The last step of atomic dQ: one program per (Q block, batch * head)
/// writes dQ = elem(dq_accum * scale) of its rows.
void TiledBackwardBuilder::buildDqConvert() {
  beginFunc((op.getSymName() + bwd::kDqSuffix).str(), "dq_convert");
  RowBlock blk = rowBlock();
  Value dqBase = add(headBase(bwd::DQStrideB, blk.bI, blk.hI),
                     mul(blk.first, indexArg(bwd::DQStrideN)));
  writeRows(dqk, blk.rows, buf(bwd::DQ), dqBase, bwd::DQStrideN,
            [&](Value i, Value c) {
              Value x = load(buf(bwd::DqAccum),
                             {dqAccumIndex(add(blk.statBase, i), c)});
              return fmul(x, scale);
            });
  func::ReturnOp::create(b);
}

namespace {
struct TileAttentionBackwardPass
    : public flashjit::attn::impl::TileAttentionBackwardBase<
          TileAttentionBackwardPass> {
  using TileAttentionBackwardBase::TileAttentionBackwardBase;

  void runOnOperation() override {
    if (failed(
            flashjit::attn::detail::tileEach<FlashBwdOp, TiledBackwardBuilder>(
                getOperation(), blockM, blockN)))
      signalPassFailure();
  }
};
} // namespace
