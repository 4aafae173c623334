//===- TileIRBuilder.h - Tile-level IR constructors of the tiling passes -===//
//
/// \file
/// Constructors of the tile dialect's values for the tiling passes: typed
/// tiles, splats and constants, iota, broadcasts, reductions, dots and the
/// strided global accesses, the loops carrying tiles, the walks over a band
/// of blocks or a BCSR layout's list, and the band masks, so that the
/// passes' algorithms read like the papers' pseudo-code. Internal to
/// dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEIRBUILDER_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEIRBUILDER_H

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/ScoreMod.h"
#include "dialects/Attn/Transforms/TiledBuilder.h"
#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinTypes.h"

namespace flashjit::attn::detail {

/// Window sizes are clamped to this before the i32 mask arithmetic: with
/// sequence lengths below 2^29 a clamped side still covers every key.
constexpr int64_t kWindowClamp = int64_t(1) << 30;

/// TiledBuilderBase plus the tile dialect: the arith helpers of the base
/// work on tiles too (arith ops are elementwise on tensors).
class TileIRBuilderBase : protected TiledBuilderBase {
protected:
  using TiledBuilderBase::TiledBuilderBase;
  using Tensor = mlir::RankedTensorType;

  Tensor tile(llvm::ArrayRef<int64_t> shape, mlir::Type elem) {
    return Tensor::get(shape, elem);
  }
  /// A tile of \p ty whose elements are all the scalar \p x.
  Value splat(Value x, Tensor ty) { return tile::SplatOp::create(b, ty, x); }
  /// A constant f32 tile of \p ty.
  Value constTile(double v, Tensor ty) {
    auto attr =
        mlir::DenseElementsAttr::get(ty, llvm::APFloat(static_cast<float>(v)));
    return mlir::arith::ConstantOp::create(b, ty, attr);
  }
  /// The row (dim 0) or column (dim 1) index of each element, i32.
  Value iota(Tensor ty, int64_t dim) {
    return tile::IotaOp::create(b, ty, dim);
  }
  /// Rank-1 \p v repeated along the new dimension \p dim of \p ty.
  Value broadcast(Value v, Tensor ty, int64_t dim) {
    return tile::BroadcastOp::create(b, ty, v, dim);
  }
  /// "max" or "sum" of a 2-D f32 tile along \p dim.
  Value reduce(llvm::StringRef kind, Value v, int64_t dim) {
    auto in = mlir::cast<Tensor>(v.getType());
    return tile::ReduceOp::create(b, tile({in.getDimSize(1 - dim)}, f32), kind,
                                  v, dim);
  }
  /// lhs rhs^T (+ acc) or lhs rhs (+ acc), f32.
  Value dot(Value lhs, Value rhs, Value acc, bool transposeLhs,
            bool transposeRhs) {
    auto l = mlir::cast<Tensor>(lhs.getType());
    auto r = mlir::cast<Tensor>(rhs.getType());
    int64_t m = l.getDimSize(transposeLhs ? 1 : 0);
    int64_t n = r.getDimSize(transposeRhs ? 0 : 1);
    return tile::DotOp::create(b, tile({m, n}, f32), lhs, rhs, acc,
                               transposeLhs, transposeRhs);
  }
  /// Rows [row0, row0 + shape[0]) of a strided tensor (rows past \p rows
  /// read as 0). \p stride is null for a rank-1 tile.
  /// With \p group (an index) row p is row p / group of head p % group,
  /// heads \p groupStride elements apart (TileOps.td).
  Value loadTile(Tensor ty, Value buf, Value offset, Value row0, Value rows,
                 Value stride, Value group = Value(),
                 Value groupStride = Value()) {
    return tile::LoadOp::create(b, ty, buf, offset, row0, rows, stride, group,
                                groupStride);
  }
  void storeTile(Value v, Value buf, Value offset, Value row0, Value rows,
                 Value stride, Value group = Value(),
                 Value groupStride = Value()) {
    tile::StoreOp::create(b, v, buf, offset, row0, rows, stride, group,
                          groupStride);
  }
  Value truncTile(Value v, mlir::Type elem) {
    auto ty = mlir::cast<Tensor>(v.getType());
    return mlir::arith::TruncFOp::create(b, ty.clone(elem), v);
  }
  /// \p v (bf16 / f16) widened to f32, exactly.
  Value extTile(Value v) {
    auto ty = mlir::cast<Tensor>(v.getType());
    return mlir::arith::ExtFOp::create(b, ty.clone(f32), v);
  }
  /// x * y + z, one rounding.
  Value fma(Value x, Value y, Value z) {
    return mlir::math::FmaOp::create(b, x, y, z);
  }
  Value exp2(Value x) { return mlir::math::Exp2Op::create(b, x); }
  Value log2(Value x) { return mlir::math::Log2Op::create(b, x); }
  Value maxF(Value x, Value y) {
    return mlir::arith::MaxNumFOp::create(b, x, y);
  }
  Value cmpF(mlir::arith::CmpFPredicate p, Value x, Value y) {
    return mlir::arith::CmpFOp::create(b, p, x, y);
  }
  /// An i32 copy of an index scalar.
  Value toI32(Value x) {
    return mlir::arith::IndexCastOp::create(b, b.getI32Type(), x);
  }
  /// \p x clamped to [-kWindowClamp, kWindowClamp]: a row bound computed
  /// from a (clamped) window, kept in i32 range as the GPU kernels keep it.
  Value clampBound(Value x) {
    return minI(maxI(x, cIdx(-kWindowClamp)), cIdx(kWindowClamp));
  }
  /// \p positions (an i32 tile) at most \p count - 1 (\p count: index):
  /// what a score_mod region that reads captured tensors sees, so that a
  /// tile's padding rows and columns (masked, or never stored) take the
  /// last real position's and its loads stay in the tensors.
  Value insideProblem(Value positions, Value count) {
    auto ty = mlir::cast<Tensor>(positions.getType());
    return mlir::arith::MinSIOp::create(b, positions,
                                        splat(toI32(sub(count, cIdx(1))), ty));
  }
  /// The global index start + r (dim 0) or start + c (dim 1) of each
  /// element of \p ty (i32).
  Value indexTile(Tensor ty, int64_t dim, Value start) {
    return mlir::arith::AddIOp::create(b, iota(ty, dim),
                                       splat(toI32(start), ty));
  }
  /// Whether column index cols[r][c] lies in [d_r - below, d_r + above],
  /// d_r = diag + r: the band that row r of the tile sees (i1 tile; \p cols
  /// from indexTile, \p below and \p above clamped windows).
  Value inBand(Value cols, Value diag, Value below, Value above) {
    using Pred = mlir::arith::CmpIPredicate;
    auto ty = mlir::cast<Tensor>(cols.getType());
    Tensor rowTy = tile({ty.getDimSize(0)}, b.getI32Type());
    Value d = indexTile(rowTy, 0, diag);
    Value lo = mlir::arith::SubIOp::create(b, d, splat(toI32(below), rowTy));
    Value hi = mlir::arith::AddIOp::create(b, d, splat(toI32(above), rowTy));
    return andI(cmpI(Pred::sge, cols, broadcast(lo, ty, 1)),
                cmpI(Pred::sle, cols, broadcast(hi, ty, 1)));
  }

  /// The iterations [first, end) over the blocks of \p step rows that meet
  /// rows [lo, hi] (none when hi < lo): block t starts at t * step.
  std::pair<Value, Value> blocksMeeting(Value lo, Value hi, int64_t step) {
    Value first = mlir::arith::DivSIOp::create(b, lo, cIdx(step));
    Value end = add(mlir::arith::DivSIOp::create(b, hi, cIdx(step)), cIdx(1));
    return {first,
            select(cmpI(mlir::arith::CmpIPredicate::sge, hi, lo), end, first)};
  }
  /// A BCSR layout's list for one (batch, head, owner block), walked in
  /// blocks of `step` rows: iteration t covers rows [start(t), start(t) +
  /// step) of the listed sparse block t / perSparse.
  struct BlockList {
    Value indices, listBase, perSparse;
    int64_t sparseBlock, step;
  };
  /// The list of (\p batch, \p head)'s sparse block that holds row
  /// \p first (the program's own block) and its iteration count (counts *
  /// sparseBlock / step) in \p iterations. \p strides are the layout's
  /// (counts b, counts h, indices b, indices h, indices m).
  BlockList blockList(Value counts, Value indices, std::array<Value, 5> strides,
                      Value batch, Value head, Value first, int64_t sparseBlock,
                      int64_t step, Value &iterations) {
    BlockList l{indices, Value(), cIdx(sparseBlock / step), sparseBlock, step};
    Value owner = mlir::arith::DivUIOp::create(b, first, cIdx(sparseBlock));
    Value countAt =
        add(add(mul(batch, strides[0]), mul(head, strides[1])), owner);
    l.listBase = add(add(mul(batch, strides[2]), mul(head, strides[3])),
                     mul(owner, strides[4]));
    iterations = mul(indexCast(load(counts, {countAt})), l.perSparse);
    return l;
  }
  /// The list's i32 entry of iteration \p t (a scalar load): the sparse
  /// block, or ~block for a full one (abi::fullBlockEntry).
  Value listedEntry(const BlockList &l, Value t) {
    Value entry = mlir::arith::DivUIOp::create(b, t, l.perSparse);
    return load(l.indices, {add(l.listBase, entry)});
  }
  /// The first row of iteration \p t of \p l: the entry's block (e ^ (e >>
  /// 31), which is ~e for a full block's e < 0).
  Value listedBlockStart(const BlockList &l, Value t) {
    Value e = listedEntry(l, t);
    Value sign = mlir::arith::ShRSIOp::create(
        b, e, mlir::arith::ConstantOp::create(b, b.getI32IntegerAttr(31)));
    Value listed = indexCast(mlir::arith::XOrIOp::create(b, e, sign));
    Value within = mlir::arith::RemUIOp::create(b, t, l.perSparse);
    return add(mulC(listed, l.sparseBlock), mulC(within, l.step));
  }
  /// Whether iteration \p t's block is listed as full (its entry < 0): a
  /// mask_mod keeps all its elements, so the tiling skips the mask there.
  Value listedBlockFull(const BlockList &l, Value t) {
    return cmpI(mlir::arith::CmpIPredicate::slt, listedEntry(l, t),
                mlir::arith::ConstantOp::create(b, b.getI32IntegerAttr(0)));
  }

  /// Where a modifier region runs: its index arguments on tiles of i32.
  struct ModifierPositions {
    Value batch, head; ///< index scalars, splat over the tile
    /// Replaces \p head where the head varies along the tile (an i32 tile:
    /// the query heads of a GQA-packed tile), built when used.
    llvm::function_ref<Value()> headTile;
    /// q_idx and kv_idx tiles (i32), built only when the region uses them.
    llvm::function_ref<Value()> qIdx, kvIdx;
    /// The positions are clamped below these (index) where they address
    /// captured tensors (scoreModIndexAddresses), or always with \p
    /// clampAlways: the tile's padding then takes the last real position's,
    /// so that its loads stay in the tensors.
    Value nq, nkv;
    bool clampAlways = false;
  };
  /// The index tiles of \p region of shape \p iTy at \p at (the ones it
  /// uses) and its captured buffers \p captures: what inlineScoreMod and
  /// inlineMaskMod take, the same for every tiling (forward, backward,
  /// the mask's block classification).
  ScoreModIndices modifierIndicesAt(mlir::Region &region, Tensor iTy,
                                    const ModifierPositions &at,
                                    llvm::ArrayRef<Value> captures) {
    ScoreModIndices indices;
    if (scoreModUses(region, 1))
      indices.batch = splat(toI32(at.batch), iTy);
    if (scoreModUses(region, 2))
      indices.head = at.headTile ? at.headTile() : splat(toI32(at.head), iTy);
    auto clamp = [&](unsigned i) {
      return at.clampAlways ||
             (!captures.empty() && scoreModIndexAddresses(region, i));
    };
    if (scoreModUses(region, 3))
      indices.qIdx = clamp(3) ? insideProblem(at.qIdx(), at.nq) : at.qIdx();
    if (scoreModUses(region, 4))
      indices.kvIdx = clamp(4) ? insideProblem(at.kvIdx(), at.nkv) : at.kvIdx();
    indices.captures.assign(captures.begin(), captures.end());
    return indices;
  }

  /// `scf.for iv = lb to ub iter_args(init) { yield body(iv, carried) }`,
  /// its results.
  template <typename Fn>
  llvm::SmallVector<Value> forCarrying(Value lb, Value ub,
                                       mlir::ValueRange init, Fn &&body) {
    auto loop = mlir::scf::ForOp::create(b, lb, ub, cIdx(1), init);
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    llvm::SmallVector<Value> next =
        body(loop.getInductionVar(), loop.getRegionIterArgs());
    mlir::scf::YieldOp::create(b, next);
    return llvm::SmallVector<Value>(loop.getResults());
  }
  /// `scf.if cond -> T { then() } else { otherwise }` yielding one value.
  template <typename Fn> Value ifElse(Value cond, Value otherwise, Fn &&then) {
    auto ifOp = mlir::scf::IfOp::create(b, otherwise.getType(), cond,
                                        /*withElseRegion=*/true);
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    mlir::scf::YieldOp::create(b, mlir::ValueRange{then()});
    b.setInsertionPointToStart(ifOp.elseBlock());
    mlir::scf::YieldOp::create(b, mlir::ValueRange{otherwise});
    return ifOp.getResult(0);
  }
};

/// The tiled forward's arguments for \p op (kernels/KernelABI.h: the
/// buffers, index arguments, scale_log2e, pid_m, pid_bh, and with \p split
/// the split-KV ABI's), then the modifiers' captured tensors: their types
/// and the names recorded as `attn.arg_names`.
struct ForwardArguments {
  llvm::SmallVector<mlir::Type> types;
  llvm::SmallVector<mlir::Attribute> names;
};
ForwardArguments forwardArguments(mlir::OpBuilder &b, FlashFwdOp op,
                                  bool split);

/// Builds `@f_blocks` (role "mask_blocks") at \p at: the block-sparse
/// layout of \p op's mask_mod region, evaluated per block pair
/// (TileAttentionBlocks.cpp).
void buildMaskBlocks(mlir::OpBuilder &at, FlashFwdOp op);

/// Builds `@f_combine`, the lse merge of the split-KV partial function
/// \p partial (role "forward_split") of \p op, at \p at
/// (TileAttentionSplit.cpp).
void buildSplitCombine(mlir::OpBuilder &at, FlashFwdOp op,
                       mlir::func::FuncOp partial);

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEIRBUILDER_H
