//===- TileIRBuilder.h - Tile-level IR constructors of the tiling passes -===//
//
/// \file
/// Constructors of the tile dialect's values for the tiling passes: typed
/// tiles, splats and constants, iota, broadcasts, reductions, dots and the
/// strided global accesses, so that the passes' algorithms read like the
/// papers' pseudo-code. Internal to dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEIRBUILDER_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEIRBUILDER_H

#include "dialects/Attn/Transforms/TiledBuilder.h"
#include "dialects/Tile/IR/TileDialect.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinTypes.h"

namespace flashjit::attn::detail {

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
  Value loadTile(Tensor ty, Value buf, Value offset, Value row0, Value rows,
                 Value stride) {
    return tile::LoadOp::create(b, ty, buf, offset, row0, rows, stride);
  }
  void storeTile(Value v, Value buf, Value offset, Value row0, Value rows,
                 Value stride) {
    tile::StoreOp::create(b, v, buf, offset, row0, rows, stride);
  }
  Value truncTile(Value v, mlir::Type elem) {
    auto ty = mlir::cast<Tensor>(v.getType());
    return mlir::arith::TruncFOp::create(b, ty.clone(elem), v);
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

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEIRBUILDER_H
