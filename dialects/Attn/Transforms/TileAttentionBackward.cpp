//===- TileAttentionBackward.cpp - attn.flash_bwd -> the tiled FA-2 backward //
//
/// \file
/// `flashjit-tile-attention-backward` turns a backward description into three
/// functions in the tile dialect, sharing one argument list
/// (kernels/KernelABI.h, abi::bwd): the shared stage, where every
/// arithmetic decision of the backward is made, as the forward's
/// (TileOps.td states the contract). Before:
///
///   attn.flash_bwd @attention {element_type = bf16, head_dim_qk = 96 : i64,
///       head_dim_v = 96 : i64, mask = "causal", gqa = 1 : i64,
///       sparse_block = 0 : i64}                 // deterministic = false
///
/// After (abridged; R = kRowBlockRows = 64 rows, Br = 64 query rows, Bc = 32
/// keys; nl = -lse * log2(e), the second half of the delta workspace):
///
///   func.func @attention_preprocess(...)  // program: R rows, batch*head
///     %d = tile.reduce "sum" (extf(dO) * extf(O)) dim 1 -> delta[0]
///     %nl = select(lse == -inf, -inf, lse * (-1 / ln 2)) -> delta[1]
///     tile.store 0 -> dq_accum                    // atomic dQ only
///   func.func @attention(...)             // program: Bc keys, batch*kv head
///     %k, %v = tile.load (Bc rows)
///     scf.for %g = 0 to gqa iter_args(%dk, %dv) {  // the group's heads
///       scf.for %t = %lo to %hi iter_args(...) {   // Q blocks seeing the keys
///         %q, %do, %nl, %dl = tile.load (Br rows)
///         %st = tile.dot %k, %q {transpose_rhs}              // S^T
///         %pt = exp2(fma(%st, scale_log2e, bcast(%nl) dim 0)), masked
///         %pth = arith.truncf %pt                    // P as the MMAs take it
///         %dv2 = tile.dot %pth, %do acc %dv
///         %dpt = tile.dot %v, %do {transpose_rhs}
///         %dsh = arith.truncf (%pt * (%dpt - bcast(%dl) dim 0))
///         %dk2 = tile.dot %dsh, %q acc %dk
///         tile.atomic_add (tile.dot %dsh, %k {transpose_lhs}) -> dq_accum
///       }
///     }
///     tile.store truncf(%dk * scale), truncf(%dv)
///   func.func @attention_dq(...)          // role "dq_convert": R rows
///     tile.store truncf(tile.load dq_accum * scale) -> dQ
///
/// With `deterministic = true` the main function adds nothing to dq_accum
/// (and the preprocessing does not zero it), and @attention_dq (role "dq",
/// Br' x Bc' = dq-block-m x dq-block-n) is a separate pass over Q blocks,
/// with no atomics:
///
///   func.func @attention_dq(...)          // program: Br' rows, batch*head
///     scf.for %t = %lo to %hi iter_args(%dq) {   // KV blocks its rows see
///       ... the same P (S = Q K^T now) and dS; %dq2 = tile.dot %dsh, %k acc
///     }
///     tile.store truncf(%dq * scale)
///
/// The CPU and the GPU (compiler/Conversion/TileToGPU.h) both compile these
/// functions, so every loop, mask and rounding point is decided here. dS is
/// computed from P rounded to the element type (the P that dV's matmul
/// takes); P and dS are rounded where they feed a matmul. With GQA the main
/// program sums dK and dV over the query heads of its KV head's group.
/// Block-sparse: the main loop walks the transposed (KV-major) layout, the
/// dQ pass the forward's, every listed block (the masks zero what is outside
/// the band).
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/Passes.h"
#include "dialects/Attn/Transforms/ScoreMod.h"
#include "dialects/Attn/Transforms/TiledBackward.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <cmath>
#include <tuple>
#include <limits>

namespace flashjit::attn {
#define GEN_PASS_DEF_TILEATTENTIONBACKWARD
#include "dialects/Attn/Transforms/Passes.h.inc"
} // namespace flashjit::attn

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;
using flashjit::attn::detail::TiledBackwardBuilder;
namespace bwd = flashjit::abi::bwd;

/// Creates `@<name>` with the shared argument list, records the description,
/// the function's tiling and its role, and sets up the common scalars.
void TiledBackwardBuilder::beginFunc(StringRef name, StringRef role,
                                     int64_t blockM, int64_t blockN) {
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
  // The modifiers' captured tensors (score_mod's, then mask_mod's), after
  // everything else (as the forward's: the ABI's positions stay as they
  // are).
  const int64_t captures = totalCapturedTensors(op);
  for (int64_t c = 0; c < captures; ++c) {
    argTys.push_back(f32Buf);
    argNames.push_back(b.getStringAttr("capture" + std::to_string(c)));
  }
  // Then a gradient buffer each (written where capture_grads says).
  for (int64_t c = 0; c < captures; ++c) {
    argTys.push_back(f32Buf);
    argNames.push_back(b.getStringAttr("capture_grad" + std::to_string(c)));
  }
  // Deterministic: each one's fixed-point accumulators, then the sizes.
  if (fixedPoint) {
    auto i64Buf = MemRefType::get({ShapedType::kDynamic}, b.getI64Type());
    for (int64_t c = 0; c < captures; ++c)
      for (const char *word : {"capture_hi", "capture_lo"}) {
        argTys.push_back(i64Buf);
        argNames.push_back(b.getStringAttr(word + std::to_string(c)));
      }
    for (int64_t c = 0; c < captures; ++c) {
      argTys.push_back(idxTy);
      argNames.push_back(b.getStringAttr("capture_size" + std::to_string(c)));
    }
  }
  func = func::FuncOp::create(b, name, FunctionType::get(ctx, argTys, {}));
  func->setAttr("attn.kernel",
                KernelAttr::get(ctx, role, dqk, dv, elemTy, op.getMask(), gqa,
                                sparseBlock, blockM, blockN,
                                op.getDeterministic(),
                                op.namedScoreMod().value_or("custom"),
                                op.hasMaskMod() ? "custom" : ""));
  func->setAttr("attn.arg_names", b.getArrayAttr(argNames));

  b.setInsertionPointToStart(func.addEntryBlock());
  nqMax = nq = indexArg(bwd::SeqQ);
  nkv = indexArg(bwd::SeqKV);
  heads = indexArg(bwd::Heads);
  bhn = mul(mul(indexArg(bwd::Batch), heads), nqMax);
  offset = sub(nkv, nq);
  if (hasBand) {
    winL = clampWindow(indexArg(bwd::WindowLeft));
    winR = clampWindow(indexArg(bwd::WindowRight));
  }
  scaleLog2 = f32Arg(bwd::ScaleLog2e);
  scale = f32Arg(bwd::Scale);
}

void TiledBackwardBuilder::enterSequence(Value bI) {
  if (!op.getVarlen())
    return;
  std::tie(startQ, nq) = sequenceOf(buf(bwd::CuSeqQ), bI);
  std::tie(startKV, nkv) = sequenceOf(buf(bwd::CuSeqKV), bI);
  offset = sub(nkv, nq);
}

void TiledBackwardBuilder::storeRows(Value acc, Value factor, bwd::Buffer t,
                                     IndexArg strideB, Value bI, Value hI,
                                     Value row0, Value count) {
  auto ty = cast<Tensor>(acc.getType());
  if (factor)
    acc = fmul(acc, splat(factor, ty));
  storeTile(truncTile(acc, elemTy), buf(t), headBase(strideB, bI, hI), row0,
            count, indexArg(IndexArg(strideB + 2)));
}

/// One program per R = kRowBlockRows rows of one (batch, head): delta =
/// rowsum(dO * O) and, after it in the workspace, -lse * log2(e) (-inf where
/// lse = -inf, so that the row's P is exp2(-inf) = 0); with atomic dQ also
/// dq_accum of the rows zeroed. Rows past Nq are neither read nor written.
///
///   %o = tile.load %O[...] rows %first of %nq stride %so
///       : memref<?xbf16> -> tensor<64x96xbf16>
///   %do = tile.load %DO[...] ...
///   %d = tile.reduce "sum" (arith.mulf (extf %do), (extf %o)) dim 1
///   tile.store %d, %DELTA[%stat] rows %first of %nq
///   %lse = tile.load %LSE[%stat] rows %first of %nq : ... tensor<64xf32>
///   %nl = arith.select (%lse == -inf), -inf, (arith.mulf %lse, -1/ln 2)
///   tile.store %nl, %DELTA[%bhn + %stat] rows %first of %nq
///   tile.store dense<0.0>, %DQACC[%stat * dqk] rows %first of %nq
///       stride %dqk                                  // atomic dQ only
void TiledBackwardBuilder::buildPreprocess() {
  beginFunc((op.getSymName() + bwd::kPreprocessSuffix).str(), "preprocess", br,
            bc);
  const int64_t rows = bwd::kRowBlockRows;
  Value bI = arith::DivUIOp::create(b, pidBH(), heads);
  Value hI = arith::RemUIOp::create(b, pidBH(), heads);
  enterSequence(bI);
  Value first = mulC(pidM(), rows);
  Value stat = mul(pidBH(), nqMax);
  Value o = loadRows(bwd::O, bwd::OStrideB, bI, hI, rows, dv, first, nq);
  Value dO = loadRows(bwd::DO, bwd::DOStrideB, bI, hI, rows, dv, first, nq);
  Value d = reduce("sum", fmul(extTile(dO), extTile(o)), 1);
  storeTile(d, buf(bwd::Delta), stat, first, nq, Value());

  Tensor rowTy = tile({rows}, f32);
  Value lse = loadTile(rowTy, buf(bwd::Lse), stat, first, nq, Value());
  Value negInf = constTile(-std::numeric_limits<double>::infinity(), rowTy);
  Value nl = select(cmpF(arith::CmpFPredicate::OEQ, lse, negInf), negInf,
                    fmul(lse, constTile(-1.0 / std::log(2.0), rowTy)));
  storeTile(nl, buf(bwd::Delta), add(bhn, stat), first, nq, Value());
  if (atomicDq)
    storeTile(constTile(0.0, tile({rows, dqk}, f32)), buf(bwd::DqAccum),
              mulC(stat, dqk), first, nq, cIdx(dqk));
  func::ReturnOp::create(b);
}

/// The last step of atomic dQ: one program per kRowBlockRows rows of one
/// (batch, head) writes dQ = elem(dq_accum * scale) of its rows.
///
///   %acc = tile.load %DQACC[%stat * dqk] rows %first of %nq stride %dqk
///       (quad_order where the main loop's atomic_add has it)
///       : memref<?xf32> -> tensor<64x96xf32>
///   tile.store (arith.truncf (arith.mulf %acc, (tile.splat %scale))),
///       %DQ[...] rows %first of %nq stride %sdq
void TiledBackwardBuilder::buildDqConvert() {
  beginFunc((op.getSymName() + bwd::kDqSuffix).str(), "dq_convert", br, bc);
  const int64_t rows = bwd::kRowBlockRows;
  Value bI = arith::DivUIOp::create(b, pidBH(), heads);
  Value hI = arith::RemUIOp::create(b, pidBH(), heads);
  enterSequence(bI);
  Value first = mulC(pidM(), rows);
  Value acc = loadTile(tile({rows, dqk}, f32), buf(bwd::DqAccum),
                       mulC(mul(pidBH(), nqMax), dqk), first, nq, cIdx(dqk));
  if (quadOrder)
    acc.getDefiningOp<tile::LoadOp>().setQuadOrder(true);
  storeRows(acc, scale, bwd::DQ, bwd::DQStrideB, bI, hI, first, nq);
  func::ReturnOp::create(b);
}

namespace {
struct TileAttentionBackwardPass
    : public flashjit::attn::impl::TileAttentionBackwardBase<
          TileAttentionBackwardPass> {
  using TileAttentionBackwardBase::TileAttentionBackwardBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    const int64_t dqM = dqBlockM, dqN = dqBlockN;
    if (dqM < 0 || dqN < 0 || dqM > 1024 || dqN > 1024) {
      module.emitError() << "dq-block-m and dq-block-n must be 0 (block-m, "
                            "block-n) or in [1, 1024], got "
                         << dqM << " and " << dqN;
      return signalPassFailure();
    }
    if (warps < 0 || warps > 16) {
      module.emitError() << "warps must be in [0, 16], got "
                         << int64_t(warps);
      return signalPassFailure();
    }
    // 0: the GPU's rule (dqPassTiles), or Br x Bc without warps.
    const int64_t dqBr = dqM ? dqM : warps ? 0 : int64_t(blockM);
    const int64_t dqBc = dqN ? dqN : warps ? 0 : int64_t(blockN);
    // Only the separate dQ pass (deterministic) uses Br' x Bc'; tileEach
    // checks block-m and block-n (the default).
    const bool ownDqTiling = dqM || dqN;
    WalkResult walk = module.walk([&](FlashBwdOp op) {
      using namespace flashjit::attn::detail;
      // Only score_mod's captured tensors take gradients (a mask_mod's
      // are read by a predicate).
      const int64_t captures = capturedTensors(op.getScoreMod());
      if (op.getCaptureGrads() < 0 || (op.getCaptureGrads() >> captures)) {
        op.emitOpError() << "capture_grads (" << op.getCaptureGrads()
                         << ") names captured tensors beyond the score_mod "
                            "region's "
                         << captures;
        return WalkResult::interrupt();
      }
      if (op.hasScoreMod() &&
          (failed(checkScoreModTileable(op, op.getScoreMod())) ||
           failed(checkScoreModDifferentiable(op, op.getScoreMod(),
                                              op.getCaptureGrads()))))
        return WalkResult::interrupt();
      if (op.hasMaskMod() && failed(checkScoreModTileable(op, op.getMaskMod())))
        return WalkResult::interrupt();
      int64_t sb = op.getSparseBlock();
      if (!ownDqTiling || !op.getDeterministic() || sb == 0 ||
          (sb % dqBr == 0 && sb % dqBc == 0))
        return WalkResult::advance();
      op.emitOpError() << "dq-block-m (" << dqBr << ") and dq-block-n (" << dqBc
                       << ") must divide sparse_block (" << sb << ")";
      return WalkResult::interrupt();
    });
    if (walk.wasInterrupted() ||
        failed(
            flashjit::attn::detail::tileEach<FlashBwdOp, TiledBackwardBuilder>(
                module, blockM, blockN, dqBr, dqBc, int64_t(warps),
                bool(dqQuadOrder))))
      signalPassFailure();
  }
};
} // namespace
