//===- TiledBackward.h - The tiled backward's builder -----------*- C++ -*-===//
//
/// \file
/// The builder of flashjit-tile-attention-backward: three tile-IR functions
/// per attn.flash_bwd (and one per captured gradient summed in fixed
/// point), sharing one argument list (kernels/KernelABI.h, abi::bwd). The
/// row kernels (the preprocessing and atomic dQ's conversion) and the pass
/// are in TileAttentionBackward.cpp, the loops (the KV-major main loop and
/// the deterministic dQ pass) in TileAttentionBackwardLoops.cpp, the
/// deterministic captured gradients in TileAttentionCaptureGrads.cpp.
/// Internal to dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDBACKWARD_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDBACKWARD_H

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/FoldConstantFactors.h"
#include "dialects/Attn/Transforms/ScoreMod.h"
#include "dialects/Attn/Transforms/TileIRBuilder.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace flashjit::attn::detail {

/// Builds the three tiled functions of one attn.flash_bwd op: Br x Bc for
/// the main loop, Br' x Bc' (dqBr, dqBc) for the deterministic dQ pass
/// (0: the GPU's dqPassTiles for \p warps warps).
class TiledBackwardBuilder : TileIRBuilderBase {
public:
  TiledBackwardBuilder(FlashBwdOp op, int64_t br, int64_t bc, int64_t dqBr,
                       int64_t dqBc, int64_t warps, bool dqQuadOrder)
      : TileIRBuilderBase(op), op(op), br(br), bc(bc),
        dqBr(dqBr ? dqBr : dqTiles(op, br, bc, warps).rows),
        dqBc(dqBc ? dqBc : dqTiles(op, br, bc, warps).keys),
        dqk(op.getHeadDimQk()), dv(op.getHeadDimV()), gqa(op.getGqa()),
        sparseBlock(op.getSparseBlock()), hasBand(op.getMask() != "none"),
        atomicDq(!op.getDeterministic()),
        quadOrder(atomicDq && dqQuadOrder && dqk % 16 == 0),
        fixedPoint(op.getDeterministic() && op.getCaptureGrads() != 0),
        elemTy(op.getElementType()) {}

  static DqPassTiles dqTiles(FlashBwdOp op, int64_t br, int64_t bc,
                             int64_t warps) {
    TileConfig config;
    config.blockM = br;
    config.blockN = bc;
    config.warps = warps;
    return dqPassTiles(op.getHeadDimQk(), op.getSparseBlock(), config);
  }

  /// The loops' score tiles then lose the constant factors the modifier's
  /// chain rule left on them (FoldConstantFactors.h).
  void build() {
    buildPreprocess();
    buildMain();
    (void)foldConstantFactors(func);
    if (atomicDq) {
      buildDqConvert();
    } else {
      buildDq();
      (void)foldConstantFactors(func);
    }
    for (unsigned c = 0; fixedPoint && c < 64; ++c)
      if ((op.getCaptureGrads() >> c) & 1)
        buildCaptureConvert(c);
  }

private:
  using IndexArg = abi::bwd::IndexArg;

  Value arg(int i) { return func.getArgument(i); }
  Value buf(abi::bwd::Buffer i) { return arg(i); }
  Value indexArg(IndexArg i) { return arg(abi::bwd::NumBuffers + i); }
  Value f32Arg(abi::bwd::ScalarArg i) {
    return arg(abi::bwd::NumBuffers + abi::bwd::NumIndexArgs + i);
  }
  Value pidM() {
    return arg(abi::bwd::NumBuffers + abi::bwd::NumIndexArgs +
               abi::bwd::NumF32Args);
  }
  Value pidBH() {
    return arg(abi::bwd::NumBuffers + abi::bwd::NumIndexArgs +
               abi::bwd::NumF32Args + 1);
  }
  /// The first captured tensor's argument (after the pids).
  static int firstCaptureArg() {
    return abi::bwd::NumBuffers + abi::bwd::NumIndexArgs +
           abi::bwd::NumF32Args + 2;
  }
  /// b * stride_b + h * stride_h of a strided (B, H, N, d) buffer; varlen:
  /// the first row of the program's sequence times stride_n in place of
  /// b * stride_b (a query side tensor: Q, O, dO, dQ; else a key side one).
  Value headBase(IndexArg strideB, Value bI, Value hI) {
    Value head = mul(hI, indexArg(IndexArg(strideB + 1)));
    if (!op.getVarlen())
      return add(mul(bI, indexArg(strideB)), head);
    const bool querySide = strideB == IndexArg::QStrideB ||
                           strideB == IndexArg::OStrideB ||
                           strideB == IndexArg::DOStrideB ||
                           strideB == IndexArg::DQStrideB;
    return add(mul(querySide ? startQ : startKV,
                   indexArg(IndexArg(strideB + 2))),
               head);
  }
  /// (b * H + h) * seq_q: where the rows of query head (b, h) start in the
  /// packed statistics (lse, delta; dq_accum times dqk); padded rows with
  /// varlen.
  Value statBase(Value bI, Value hI) {
    return mul(add(mul(bI, heads), hI), nqMax);
  }
  /// Varlen: batch \p bI's sequence: sets nq, nkv, offset (its own) and
  /// startQ, startKV (its first rows). Without varlen nothing changes.
  void enterSequence(Value bI);
  /// \p x clamped like a window side (kWindowClamp).
  Value clampWindow(Value x) { return minI(x, cIdx(kWindowClamp)); }
  /// The rows [row0, row0 + rows) of a strided element-type tensor.
  Value loadRows(abi::bwd::Buffer t, IndexArg strideB, Value bI, Value hI,
                 int64_t rows, int64_t cols, Value row0, Value count) {
    return loadTile(tile({rows, cols}, elemTy), buf(t),
                    headBase(strideB, bI, hI), row0, count,
                    indexArg(IndexArg(strideB + 2)));
  }
  /// elem(\p acc (* \p factor)) into the rows [row0, ...) of \p t.
  void storeRows(Value acc, Value factor, abi::bwd::Buffer t, IndexArg strideB,
                 Value bI, Value hI, Value row0, Value count);

  // TileAttentionBackward.cpp: the functions' common part and the row
  // kernels.
  void beginFunc(llvm::StringRef name, llvm::StringRef role, int64_t blockM,
                 int64_t blockN);
  void buildPreprocess();
  void buildDqConvert();

  // TileAttentionBackwardLoops.cpp: the loops.
  void buildMain();
  llvm::SmallVector<Value> mainStep(Value first, Value bI, Value hI, Value dk,
                                    Value dvAcc, Value partial = Value());
  /// Whether iteration \p t (queries [q0, q0 + rows), keys [kv0, kv0 +
  /// cols) of (bI, hI)) needs the mask_mod: false where the layout lists
  /// its block as full or the region's bounds prove it keeps the block
  /// whole; null (always) where neither can say.
  Value maskModPartial(Value t, Value q0, int64_t rows, Value kv0,
                       int64_t cols, Value bI, Value hI);
  Value maskMain(Value pt, Value first);
  /// With a score_mod: the modified scores of the product tile \p raw
  /// (scaled first) and their derivative with respect to the scaled
  /// score; its positions start at query \p q0 and key \p kv0, keys on
  /// the rows (S^T) or the columns; \p hI: the query head. With
  /// \p gradCaptures, the loads of those captured tensors too.
  ScoreModDerivatives modifyScores(Value raw, Value q0, Value kv0,
                                   bool keysOnRows, Value bI, Value hI,
                                   int64_t gradCaptures = 0);
  /// The index tiles and captured buffers of modifier \p region on a tile
  /// shaped as \p like (positions as modifyScores').
  flashjit::attn::detail::ScoreModIndices
  modifierIndices(mlir::Region &region, Value like, Value q0, Value kv0,
                  bool keysOnRows, Value bI, Value hI);
  /// \p s (raw or modified scores of \p modifierIndices' tile) with -inf
  /// where the mask_mod region yields false.
  Value applyMaskMod(Value s, Value q0, Value kv0, bool keysOnRows, Value bI,
                     Value hI);
  /// P's exponent: raw * scale * log2(e) + negLse (its broadcast), or
  /// mod(raw * scale) * log2(e) + negLse with its derivative in \p dmod;
  /// -inf where a mask_mod masks the element (so P = 0 there; only where
  /// \p partial holds, when given);
  /// with \p reads, the loads of the captured tensors whose gradient the
  /// description asks for (capture_grads) in it.
  Value exponent(Value raw, Value negLse, Value q0, Value kv0, bool keysOnRows,
                 Value bI, Value hI, Value &dmod,
                 llvm::SmallVector<CaptureRead> *reads = nullptr,
                 Value partial = Value());
  /// Adds \p g (the gradient of the modified scores of the S^T tile at key
  /// n0 and query \p first) times each read's derivative into its captured
  /// tensor's gradient buffer, at the read's indices (0 where the key or
  /// the query is past the problem).
  void addCaptureGrads(llvm::ArrayRef<CaptureRead> reads, Value g,
                       Value first);
  /// The buffer of captured tensor \p c, and of its gradient (every
  /// function takes the captured tensors, then a gradient buffer each).
  Value captureBuf(unsigned c, bool grad = false);

  // TileAttentionCaptureGrads.cpp: deterministic captured gradients
  // (abi::bwd::fixedPointCaptureGrads), summed in fixed point.
  /// Captured tensor \p c's accumulator of hi (\p lo false) or lo words,
  /// and its size (index): the arguments after the gradient buffers.
  Value captureWords(unsigned c, bool lo);
  Value captureSize(unsigned c);
  /// W = abi::bwd::captureWords(size) of captured tensor \p c (index): the
  /// hi words' count, and where lo holds the non-finite count.
  Value wordCount(unsigned c);
  /// \p v (f32) split exactly into its two fixed-point words, each added
  /// at \p index into captured tensor \p c's accumulators.
  void addFixedPoint(Value v, unsigned c, Value index);
  /// `@f_capture_grad<c>` (role "capture_convert"): the words of captured
  /// tensor \p c back to f32, added into its gradient.
  void buildCaptureConvert(unsigned c);
  void buildDq();
  Value dqStep(Value first, Value bI, Value hI, Value hkI, Value dq,
               Value partial = Value());
  Value maskDq(Value p, Value first);

  FlashBwdOp op;
  const int64_t br, bc, dqBr, dqBc, dqk, dv, gqa, sparseBlock;
  const bool hasBand;
  /// dQ by atomic adds into dq_accum (not `deterministic`): the main loop
  /// adds dS K, @f_dq only converts; else @f_dq is the separate pass.
  const bool atomicDq;
  /// dq_accum's rows in quad order (the pass's `dq-quad-order`, dqk a
  /// multiple of 16): the main loop's tile.atomic_add and the conversion's
  /// tile.load carry `quad_order`.
  const bool quadOrder;
  /// Captured tensors' gradients in fixed point (deterministic with
  /// capture_grads); else by f32 atomic adds.
  const bool fixedPoint;
  mlir::Type elemTy;
  mlir::func::FuncOp func;

  // Scalars of the function being built, set up in beginFunc(): the
  // lengths, B * H * Nq (where -lse * log2(e) starts in delta), Nkv - Nq,
  // the windows (clamped; 0 without a band), the scales.
  // With varlen, nq, nkv and offset are the program's sequence's (set by
  // enterSequence), nqMax the padded rows (seq_q); startQ and startKV its
  // first rows (null without varlen).
  Value nq, nqMax, nkv, heads, bhn, offset, winL, winR, scaleLog2, scale;
  Value startQ, startKV;
  // The program's tiles and scalars (main: the resident key block; dQ
  // pass: the resident Q block).
  Value kTile, vTile, qTile, doTile, negLse, delta;
  Value n0, m0, fullLo, fullHi;
  BlockList list;
};

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDBACKWARD_H
