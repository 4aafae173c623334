//===- TiledBuilder.h - Small IR constructors of the tiling passes -*- C++ -*-//
//
/// \file
/// The scalar and loop constructors that the forward and backward tiling
/// builders share, so that their algorithms read like the papers. Internal
/// to dialects/Attn/Transforms.
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
  void store(Value v, Value mem, mlir::ValueRange idx) {
    mlir::memref::StoreOp::create(b, v, mem, idx);
  }
  /// Loads a 16-bit element and widens it to f32.
  Value loadF32(Value mem, Value idx) {
    return mlir::arith::ExtFOp::create(b, f32, load(mem, idx));
  }
  /// Rounds an f32 to \p elemTy and back: what a matmul on 16-bit operands
  /// sees.
  Value roundTo(mlir::Type elemTy, Value x) {
    Value low = mlir::arith::TruncFOp::create(b, elemTy, x);
    return mlir::arith::ExtFOp::create(b, f32, low);
  }
  Value indexCast(Value x) {
    return mlir::arith::IndexCastOp::create(b, idxTy, x);
  }

  /// `for iv = lb to ub { body(iv) }`.
  template <typename Fn> void forLoop(Value lb, Value ub, Fn &&body) {
    auto loop = mlir::scf::ForOp::create(b, lb, ub, cIdx(1));
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    body(loop.getInductionVar());
  }
  /// `for iv = lb to ub iter(acc = init) { acc = body(iv, acc) }`.
  template <typename Fn>
  Value forReduce(Value lb, Value ub, Value init, Fn &&body) {
    auto loop =
        mlir::scf::ForOp::create(b, lb, ub, cIdx(1), mlir::ValueRange{init});
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value next = body(loop.getInductionVar(), loop.getRegionIterArgs()[0]);
    mlir::scf::YieldOp::create(b, next);
    return loop.getResult(0);
  }
  /// `if (cond) { body() }`.
  template <typename Fn> void ifThen(Value cond, Fn &&body) {
    auto ifOp = mlir::scf::IfOp::create(b, cond, /*withElseRegion=*/false);
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    body();
  }

  /// `for each block of \p step rows starting in [lo, hi]: body(first)`,
  /// the blocks aligned to \p step (none when hi < lo).
  template <typename Fn>
  void forBlocksInRange(Value lo, Value hi, int64_t step, Fn &&body) {
    Value first = mlir::arith::DivSIOp::create(b, lo, cIdx(step));
    Value end = add(mlir::arith::DivSIOp::create(b, hi, cIdx(step)), cIdx(1));
    Value last =
        select(cmpI(mlir::arith::CmpIPredicate::sge, hi, lo), end, first);
    forLoop(first, last, [&](Value blk) { body(mulC(blk, step)); });
  }

  /// The blocks a BCSR layout lists: for the sparse block \p owner (in
  /// units of \p sparseBlock) of (\p batch, \p head), each listed sparse
  /// block is walked as sparseBlock / step blocks of \p step rows, and
  /// body(first) runs for those that meet [lo, hi]. \p strides are the
  /// layout's (counts b, counts h, indices b, indices h, indices m).
  template <typename Fn>
  void forListedBlocks(Value counts, Value indices,
                       std::array<Value, 5> strides, Value batch, Value head,
                       Value owner, int64_t sparseBlock, int64_t step, Value lo,
                       Value hi, Fn &&body) {
    using Pred = mlir::arith::CmpIPredicate;
    Value countAt =
        add(add(mul(batch, strides[0]), mul(head, strides[1])), owner);
    Value count = indexCast(load(counts, {countAt}));
    Value listBase = add(add(mul(batch, strides[2]), mul(head, strides[3])),
                         mul(owner, strides[4]));
    forLoop(cIdx(0), count, [&](Value t) {
      Value listed = indexCast(load(indices, {add(listBase, t)}));
      forLoop(cIdx(0), cIdx(sparseBlock / step), [&](Value u) {
        Value first = add(mulC(listed, sparseBlock), mulC(u, step));
        Value meets = andI(cmpI(Pred::sle, first, hi),
                           cmpI(Pred::sge, add(first, cIdx(step - 1)), lo));
        ifThen(meets, [&] { body(first); });
      });
    });
  }

  mlir::ImplicitLocOpBuilder b;
  mlir::Type f32, idxTy;
};

/// The body of both tiling passes: checks Br and Bc (in [1, 1024], dividing
/// the sparse block) and replaces every \p OpT in \p module by what
/// `Builder(op, blockM, blockN).build()` makes.
template <typename OpT, typename Builder>
mlir::LogicalResult tileEach(mlir::ModuleOp module, int64_t blockM,
                             int64_t blockN) {
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
    Builder(op, blockM, blockN).build();
    op.erase();
  }
  return mlir::success();
}

} // namespace flashjit::attn::detail

#endif // FLASHJIT_DIALECTS_ATTN_TRANSFORMS_TILEDBUILDER_H
