//===- TiledBuilder.h - Small IR constructors of the tiling passes -*- C++ -*-//
//
/// \file
/// The scalar constructors that the forward and backward tiling builders
/// share (index arithmetic, compares, selects, scalar loads of a BCSR
/// layout), and the passes' common driver. Internal to
/// dialects/Attn/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDBUILDER_H
#define FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDBUILDER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

#include <array>
#include <utility>

namespace flashjit::attn::detail {

/// Builds IR before one attn op, at its location.
class TiledBuilderBase {
protected:
  explicit TiledBuilderBase(mlir::Operation *op)
      : b(op->getLoc(), op), f32(b.getF32Type()), idxTy(b.getIndexType()) {}

  using Value = mlir::Value;
  Value cIdx(int64_t v) { return mlir::arith::ConstantIndexOp::create(b, v); }
  Value cF32(double v) {
    return mlir::arith::ConstantOp::create(b, b.getF32FloatAttr(float(v)));
  }
  Value add(Value x, Value y) { return mlir::arith::AddIOp::create(b, x, y); }
  Value sub(Value x, Value y) { return mlir::arith::SubIOp::create(b, x, y); }
  Value mul(Value x, Value y) { return mlir::arith::MulIOp::create(b, x, y); }
  Value mulC(Value x, int64_t c) { return mul(x, cIdx(c)); }
  Value minI(Value x, Value y) { return mlir::arith::MinSIOp::create(b, x, y); }
  Value maxI(Value x, Value y) { return mlir::arith::MaxSIOp::create(b, x, y); }
  Value cmpI(mlir::arith::CmpIPredicate p, Value x, Value y) {
    return mlir::arith::CmpIOp::create(b, p, x, y);
  }
  Value andI(Value x, Value y) { return mlir::arith::AndIOp::create(b, x, y); }
  Value orI(Value x, Value y) { return mlir::arith::OrIOp::create(b, x, y); }
  Value fadd(Value x, Value y) { return mlir::arith::AddFOp::create(b, x, y); }
  Value fsub(Value x, Value y) { return mlir::arith::SubFOp::create(b, x, y); }
  Value fmul(Value x, Value y) { return mlir::arith::MulFOp::create(b, x, y); }
  Value select(Value c, Value x, Value y) {
    return mlir::arith::SelectOp::create(b, c, x, y);
  }
  Value load(Value mem, mlir::ValueRange idx) {
    return mlir::memref::LoadOp::create(b, mem, idx);
  }
  Value indexCast(Value x) {
    return mlir::arith::IndexCastOp::create(b, idxTy, x);
  }
  /// Sequence \p batch of a variable-length batch (AttentionSpec::varlen):
  /// its first row cu[batch] and its length cu[batch + 1] - cu[batch], from
  /// the i32 offsets \p cu (two scalar loads).
  std::pair<Value, Value> sequenceOf(Value cu, Value batch) {
    Value start = indexCast(load(cu, {batch}));
    Value end = indexCast(load(cu, {add(batch, cIdx(1))}));
    return {start, sub(end, start)};
  }
  /// A loop's end for a varlen program: \p hi, or \p lo (no trips) where
  /// its block at \p first lies past \p count, its sequence's rows (the
  /// grid spans the longest sequence, so such a program has nothing to do).
  Value endWithinSequence(Value lo, Value hi, Value first, Value count) {
    return select(cmpI(mlir::arith::CmpIPredicate::slt, first, count), hi, lo);
  }

  mlir::ImplicitLocOpBuilder b;
  mlir::Type f32, idxTy;
};

/// The body of both tiling passes: checks Br and Bc (in [1, 1024], dividing
/// the sparse block) and replaces every \p OpT in \p module by what
/// `Builder(op, blockM, blockN, extra...).build()` makes.
template <typename OpT, typename Builder, typename... Extra>
mlir::LogicalResult tileEach(mlir::ModuleOp module, int64_t blockM,
                             int64_t blockN, Extra... extra) {
  if (blockM < 1 || blockN < 1 || blockM > 1024 || blockN > 1024)
    return module.emitError() << "block-m and block-n must be in [1, 1024], "
                                 "got "
                              << blockM << " and " << blockN;
  llvm::SmallVector<OpT> ops;
  module.walk([&](OpT op) { ops.push_back(op); });
  for (OpT op : ops) {
    int64_t sb = op.getSparseBlockAttr().getInt();
    if (sb > 0 && (sb % blockM != 0 || sb % blockN != 0))
      return op.emitOpError()
             << "block-m (" << blockM << ") and block-n (" << blockN
             << ") must divide sparse_block (" << sb << ")";
    Builder(op, blockM, blockN, extra...).build();
    op.erase();
  }
  return mlir::success();
}

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDBUILDER_H
