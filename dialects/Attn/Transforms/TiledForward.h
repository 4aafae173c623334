//===- TiledForward.h - The tiled forward's builder ------------*- C++ -*-===//
//
/// \file
/// The builder of flashjit-tile-attention: one tile-IR function per
/// attn.flash_fwd (and, split-KV, its combine: TileAttentionSplit.cpp).
/// The program, its loops and the online-softmax update are in
/// TileAttention.cpp, the score and mask modifiers and the masks in
/// TileAttentionMasks.cpp. Internal to dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDFORWARD_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDFORWARD_H

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/ScoreMod.h"
#include "dialects/Attn/Transforms/TileIRBuilder.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

namespace flashjit::attn::detail {

/// Builds the tiled function for one attn.flash_fwd op.
class TiledForwardBuilder : TileIRBuilderBase {
public:
  /// \p split: the split-KV partial (role "forward_split"), followed by
  /// its combine function (TileAttentionSplit.cpp).
  /// \p overlap: the software-pipelined KV loop (buildOverlappedLoop);
  /// \p biasProduct: there, an affine bias as one more product step
  /// (BiasProduct.h), with bf16 head dims up to 128 and Bc up to 128;
  /// \p lead 2: there, S two blocks ahead of the softmax
  /// (buildLeadTwoLoop; the bias product is then not taken).
  TiledForwardBuilder(FlashFwdOp op, int64_t br, int64_t bc, bool split,
                      bool overlap, bool biasProduct = false, int64_t lead = 1)
      : TileIRBuilderBase(op), op(op), br(br), bc(bc), dqk(op.getHeadDimQk()),
        dv(op.getHeadDimV()), sparseBlock(op.getSparseBlock()),
        hasBand(op.getMask() != "none"), split(split), overlap(overlap),
        biasProduct(biasProduct && overlap && lead != 2 && bc <= 128 &&
                    std::max(dqk, dv) <= 128),
        leadTwo(overlap && lead == 2),
        pack(split && abi::split::packsGqa(op.getGqa(), sparseBlock > 0)),
        numBufs(split ? int(abi::split::NumBuffers) : int(abi::NumBuffers)),
        numIdx(split ? abi::split::NumIndexArgs : abi::NumIndexArgs),
        elemTy(op.getElementType()) {}

  mlir::func::FuncOp build();

private:
  Value arg(int i) { return func.getArgument(i); }
  Value indexArg(int i) { return arg(numBufs + i); }
  /// Row p's query position (p / gqa when GQA-packed) of an i32 index tile.
  Value queryOf(Value rows);

  void setUpProgram();
  void loopBounds();
  Value blockStart(Value t);
  Value loadK(Value n0);
  Value loadV(Value n0);
  Value scores(Value k);
  llvm::SmallVector<Value> step(Value t, Value o, Value m, Value l);
  /// One block's softmax: the new row max and sum, O's factor, P (f32).
  struct BlockSoftmax {
    Value m, l, alpha, p;
  };
  BlockSoftmax softmax(Value s, Value n0, Value m, Value l, Value partial);
  Value usableMax(Value m);
  llvm::SmallVector<Value> update(Value s, Value n0, Value v, Value o, Value m,
                                  Value l, Value partial);
  Value rescaledProduct(Value o, Value alpha, Value p, Value v);
  Value maskModPartial(Value t, Value n0);
  mlir::scf::ForOp buildLoop(llvm::ArrayRef<Value> init);
  /// Both overlapped loops' start: whether the range has a block, its last
  /// block and that block's start, and the carried (O, m, l, P rounded,
  /// previous max) after the first block's softmax.
  struct OverlappedStart {
    Value live, last, nLast;
    llvm::SmallVector<Value> carried;
  };
  OverlappedStart startOverlapped(llvm::ArrayRef<Value> init);
  llvm::SmallVector<Value> buildOverlappedLoop(llvm::ArrayRef<Value> init);
  llvm::SmallVector<Value> overlappedStep(mlir::ValueRange args, Value v,
                                          Value s, Value next, Value nNext);
  Value lastProduct(mlir::ValueRange r, Value v);
  /// The overlapped loop with S of block t + 2 issued before block t + 1's
  /// softmax (TileAttention.cpp).
  llvm::SmallVector<Value> buildLeadTwoLoop(llvm::ArrayRef<Value> init);
  ScoreModIndices modifierIndices(mlir::Region &region,
                                                          Value n0);
  Value modifyScores(Value s, Value n0);
  Value foldScaleIntoProduct(Value scaled, Value modified);
  Value foldScaleIntoSum(Value scaled, Value modified);
  Value applyMaskMod(Value s, Value n0);
  Value maskScores(Value s, Value n0);
  void writeOutput(Value o, Value m, Value l);

  FlashFwdOp op;
  const int64_t br, bc, dqk, dv, sparseBlock;
  const bool hasBand;
  /// Split-KV; and GQA packing (split, gqa > 1, dense): the group's query
  /// heads are the rows of one tile (kernels/KernelABI.h, abi::split).
  const bool split, overlap, biasProduct;
  /// The overlapped loop with S two blocks ahead (buildLeadTwoLoop).
  const bool leadTwo;
  const bool pack;
  const int numBufs, numIdx;
  mlir::Type elemTy;
  mlir::func::FuncOp func;

  // Scalars of the program, set up in setUpProgram() and loopBounds().
  /// nq and nkv: this program's sequence lengths; nqMax: seq_q, the padded
  /// rows per (batch, head) of lse and the workspaces (nq but for varlen).
  Value nq, nqMax, nkv, scaleLog2, m0, bIdx, hIdx;
  /// The rows of the program's row space (Nq, or Nq * gqa packed), the
  /// packed group (an index constant; null unpacked), the split and the
  /// split count (split only).
  Value nRows, group, sIdx, nSplits;
  /// The factor of the row max and of P's exponent: scale_log2e, or
  /// log2(e) when a score_mod has already scaled the scores.
  Value expFactor, scale;
  Value qBase, kBase, vBase, oBase, lseBase, oPartBase, lsePartBase;
  Value offset, winL, winR, jLo, jHi, fullLo, fullHi;
  Value tLo, tHi;
  BlockList list;
  Value qTile;
};


} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDFORWARD_H
