//===- TileToGPURows.cpp - Row-local tile programs -> a warp per row ------===//
//
/// \file
/// The placement of a tiled function with no product and no loop, every
/// tile of the same R rows (the backward's preprocess and dq_convert): each
/// warp of the block takes rows warp, warp + warps, ... in a loop, and the
/// lanes of a warp split a row's columns (lane, lane + 32, ...); a rank-1
/// tile is one value per row, the same in every lane. Such a program is
/// row-local (the tile IR's row reductions and broadcasts stay in a row),
/// so a row past the accesses' common bound is skipped as a whole. Before:
///
///   func.func @attention_preprocess(...) {attn.kernel = #attn.kernel<role =
///       "preprocess", ...>} {
///     %o = tile.load %O[%ob] rows %r0 of %nq stride %so : ...
///     tensor<64x96xbf16> %do = tile.load %DO[...] ... %d = tile.reduce "sum"
///     (extf %do * extf %o) dim 1 tile.store %d, %Delta[%sb] rows %r0 of %nq
///     ...
///   }
///
/// After:
///
///   gpu.func @attention_preprocess(...) kernel {   // 128 threads
///     scf.for %i = 0 to 16 {                       // 64 rows / 4 warps
///       %r = %i * 4 + warp
///       scf.if (%r0 + %r < %nq) {
///         // lane's columns c = lane + 32 j: O, dO loads (0 past column 96),
///         // products, the lane's sum, shfl.bfly 16, 8, 4, 2, 1;
///         // lane 0 stores delta
///       }
///     }
///   }
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/KernelEmitters.h"
#include "compiler/Conversion/TileToGPU.h"
#include "compiler/Conversion/TileToLoops.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/IRMapping.h"

#include <limits>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;
using arith::CmpIPredicate;

namespace {

/// One row's registers of a tile: a 2-D tile's values at the lane's
/// columns (lane + 32 j), a rank-1 tile's one value; a splat's one value
/// stands for every column.
struct RowRegs {
  SmallVector<Value> regs;
  bool pendingRound = false; ///< as Fragment::pendingRound
  Value at(int64_t j) const { return regs[regs.size() > 1 ? j : 0]; }
};

class RowKernelLowering {
public:
  RowKernelLowering(ImplicitLocOpBuilder &b, func::FuncOp fn,
                    const AttentionSpec &spec, const KernelPlacement &place)
      : b(b), g(b, spec.dtype == DType::BF16 ? flashjit::gpu::Elem::BF16
                                             : flashjit::gpu::Elem::F16),
        fn(fn), place(place) {}

  LogicalResult run(mlir::gpu::GPUModuleOp gpuModule);

private:
  LogicalResult analyse();
  LogicalResult lowerOp(Operation *op);
  LogicalResult lowerLoad(tile::LoadOp op);
  LogicalResult lowerStore(tile::StoreOp op);
  LogicalResult lowerReduce(tile::ReduceOp op);
  LogicalResult lowerIota(tile::IotaOp op);
  LogicalResult lowerGather(tile::GatherOp op);
  LogicalResult lowerScatter(tile::ScatterOp op);
  LogicalResult lowerElementwise(Operation *op);
  LogicalResult lowerFor(scf::ForOp loop);
  /// A row's registers of tile \p v as a loop carries them: every column
  /// register (a splat's one value repeated), so that the count is the
  /// type's.
  SmallVector<Value> carried(Value v);
  InFlightDiagnostic fail(Operation *op, StringRef what) {
    return op->emitOpError() << "cannot be lowered to the GPU: " << what;
  }
  bool isTile(Value v) { return isa<RankedTensorType>(v.getType()); }
  int64_t cols(Value v) {
    auto ty = cast<RankedTensorType>(v.getType());
    return ty.getRank() == 2 ? ty.getDimSize(1) : 0;
  }
  /// Column j of the lane (i32) and whether it exists in a row of \p n.
  Value column(int64_t j) { return g.add(lane, g.c32(32 * j)); }
  Value columnOk(int64_t j, int64_t n) {
    return 32 * (j + 1) <= n ? Value()
                             : g.cmp(CmpIPredicate::slt, column(j), g.c32(n));
  }
  Value toI64(Value index) {
    return arith::IndexCastOp::create(b, g.i64, index);
  }
  /// Element \p index (i64) of an f32, i32, i64 or 16-bit buffer \p base
  /// (a 16-bit one as f32).
  Value loadAt(Value base, Type elem, Value index);
  void storeAt(Value base, Type elem, Value index, Value v);

  ImplicitLocOpBuilder &b;
  flashjit::gpu::GpuBuilder g;
  func::FuncOp fn;
  KernelPlacement place;
  int64_t rows = 0;         ///< R: every tile's dim 0
  Value rowStart, rowBound; ///< the accesses' common row0 and rows
  IRMapping map;
  DenseMap<Value, RowRegs> regs;
  Value lane, row; ///< i32: the lane, and the tile row of this iteration
};

} // namespace

/// Every tile has R rows, every access the same row0 and rows, and there
/// is no product, loop or branch.
LogicalResult RowKernelLowering::analyse() {
  WalkResult walk = fn.walk([&](Operation *op) -> WalkResult {
    if (op == fn.getOperation())
      return WalkResult::advance();
    if (isa<tile::DotOp, tile::AtomicAddOp>(op) ||
        (op->getNumRegions() > 0 && !isa<scf::ForOp>(op)))
      return fail(op, "a row kernel has no product or branch (loops are "
                      "scf.for)");
    for (Value v : op->getResults())
      if (auto ty = dyn_cast<RankedTensorType>(v.getType())) {
        if (rows == 0)
          rows = ty.getDimSize(0);
        if (ty.getDimSize(0) != rows)
          return fail(op, "every tile of a row kernel has the same rows");
      }
    Value r0, n;
    if (auto l = dyn_cast<tile::LoadOp>(op)) {
      r0 = l.getRow0();
      n = l.getRows();
      if (l.getGroup())
        return fail(op, "a row kernel reads no grouped rows");
    } else if (auto s = dyn_cast<tile::StoreOp>(op)) {
      r0 = s.getRow0();
      n = s.getRows();
      if (s.getGroup())
        return fail(op, "a row kernel writes no grouped rows");
    } else {
      return WalkResult::advance();
    }
    if (!rowStart) {
      rowStart = r0;
      rowBound = n;
    }
    if (r0 != rowStart || n != rowBound)
      return fail(op, "the accesses of a row kernel share row0 and rows");
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  const int64_t warps = place.threads / 32;
  if (rows == 0 || !rowStart || rows % warps != 0)
    return fn.emitError() << "a row kernel needs tiles of a multiple of "
                          << warps << " rows and a tile.load or tile.store";
  return success();
}

Value RowKernelLowering::loadAt(Value base, Type elem, Value index) {
  if (elem.isF32() || elem.isInteger(32) || elem.isInteger(64))
    return LLVM::LoadOp::create(
        b, elem,
        LLVM::GEPOp::create(b, g.ptrGen, elem, base,
                            ArrayRef<LLVM::GEPArg>{index}));
  return g.loadElement(base, index);
}

void RowKernelLowering::storeAt(Value base, Type elem, Value index, Value v) {
  if (elem.isF32() || elem.isInteger(32) || elem.isInteger(64)) {
    LLVM::StoreOp::create(b, v,
                          LLVM::GEPOp::create(b, g.ptrGen, elem, base,
                                              ArrayRef<LLVM::GEPArg>{index}));
    return;
  }
  LLVM::StoreOp::create(b, g.toElementBits(v), g.elementPtr(base, index));
}

/// A row of a 2-D tile: the lane's columns, a clamped address and 0 where
/// the column does not exist (in quad order, `quad_order`, each column read
/// at buildQuadColumn: the warp's 32 columns still two whole 16-column groups);
/// a rank-1 tile: the row's value.
LogicalResult RowKernelLowering::lowerLoad(tile::LoadOp op) {
  Type elem = op.getType().getElementType();
  Value base = map.lookup(op.getBase());
  Value offset = toI64(map.lookup(op.getOffset()));
  Value r = g.add(
      arith::IndexCastOp::create(b, g.i32, map.lookup(op.getRow0())), row);
  RowRegs &out = regs[op.getResult()];
  if (op.getType().getRank() == 1) {
    out.regs.push_back(loadAt(base, elem, g.add(offset, g.ext64(r))));
    return success();
  }
  Value rowAt =
      g.add(offset, g.mul(g.ext64(r), toI64(map.lookup(op.getStride()))));
  const int64_t n = cols(op.getResult());
  for (int64_t j = 0; j < ceilDiv(n, 32); ++j) {
    Value ok = columnOk(j, n);
    Value col = ok ? g.select(ok, column(j), g.c32(0)) : column(j);
    if (op.getQuadOrder())
      col = buildQuadColumn(g.b, col);
    Value v = loadAt(base, elem, g.add(rowAt, g.ext64(col)));
    Value zero = elem.isInteger(64) ? g.c64(0) : g.cf(0.0);
    out.regs.push_back(ok ? g.select(ok, v, zero) : v);
  }
  return success();
}

/// The lane's columns that exist (a rank-1 tile: lane 0), in the buffer's
/// element type.
LogicalResult RowKernelLowering::lowerStore(tile::StoreOp op) {
  Value v = op.getValue();
  const RowRegs &in = regs[v];
  Type elem = cast<MemRefType>(op.getBase().getType()).getElementType();
  if ((elem.isBF16() || elem.isF16()) != in.pendingRound)
    return fail(op, "a 16-bit tile must come from arith.truncf");
  Value base = map.lookup(op.getBase());
  Value offset = toI64(map.lookup(op.getOffset()));
  Value r = g.add(
      arith::IndexCastOp::create(b, g.i32, map.lookup(op.getRow0())), row);
  if (cast<RankedTensorType>(v.getType()).getRank() == 1) {
    g.ifThen(g.cmp(CmpIPredicate::eq, lane, g.c32(0)), [&] {
      storeAt(base, elem, g.add(offset, g.ext64(r)), in.regs[0]);
    });
    return success();
  }
  Value rowAt =
      g.add(offset, g.mul(g.ext64(r), toI64(map.lookup(op.getStride()))));
  const int64_t n = cols(v);
  for (int64_t j = 0; j < ceilDiv(n, 32); ++j) {
    Value at = g.add(rowAt, g.ext64(column(j)));
    if (Value ok = columnOk(j, n))
      g.ifThen(ok, [&] { storeAt(base, elem, at, in.at(j)); });
    else
      storeAt(base, elem, at, in.at(j));
  }
  return success();
}

/// The lane's columns folded in order (missing ones as the identity), then
/// the warp's lanes by shfl.bfly 16, 8, 4, 2, 1.
LogicalResult RowKernelLowering::lowerReduce(tile::ReduceOp op) {
  if (op.getDim() != 1)
    return fail(op, "a row kernel reduces along its rows only");
  bool isMax = op.getKind() == "max";
  Value identity = g.cf(isMax ? -std::numeric_limits<double>::infinity() : 0.0);
  const RowRegs &in = regs[op.getValue()];
  const int64_t n = cols(op.getValue());
  Value acc = identity;
  for (int64_t j = 0; j < ceilDiv(n, 32); ++j) {
    Value v = in.at(j);
    if (Value ok = columnOk(j, n))
      v = g.select(ok, v, identity);
    acc = isMax ? g.fmax(acc, v) : g.fadd(acc, v);
  }
  for (int64_t m = 16; m >= 1; m /= 2) {
    Value other = g.shuffleXor(acc, m);
    acc = isMax ? g.fmax(acc, other) : g.fadd(acc, other);
  }
  regs[op.getResult()].regs.push_back(acc);
  return success();
}

/// The tile row (dim 0, and a rank-1 iota) or each register's column
/// (dim 1, lane + 32 j; past the tile's columns too, where no store or
/// reduction reads it).
LogicalResult RowKernelLowering::lowerIota(tile::IotaOp op) {
  RowRegs &out = regs[op.getResult()];
  if (op.getDim() == 0) {
    out.regs.push_back(row);
    return success();
  }
  for (int64_t j = 0; j < ceilDiv(cols(op.getResult()), 32); ++j)
    out.regs.push_back(column(j));
  return success();
}

/// Each register loaded at its index (the tiling keeps indices inside the
/// buffer, padding columns included): f32 captured data, i32 block classes.
LogicalResult RowKernelLowering::lowerGather(tile::GatherOp op) {
  Value base = map.lookup(op.getBase());
  RowRegs &out = regs[op.getResult()];
  Type elem = op.getType().getElementType();
  for (Value index : regs[op.getIndex()].regs)
    out.regs.push_back(loadAt(base, elem, g.ext64(index)));
  return success();
}

/// A rank-1 tile's row value written by lane 0, a 2-D tile's registers by
/// their lanes, each where its mask holds (and its column exists).
LogicalResult RowKernelLowering::lowerScatter(tile::ScatterOp op) {
  Type elem = cast<MemRefType>(op.getBase().getType()).getElementType();
  Value base = map.lookup(op.getBase());
  const RowRegs &value = regs[op.getValue()], &index = regs[op.getIndex()],
                &mask = regs[op.getMask()];
  if (value.pendingRound)
    return fail(op, "a rounded tile is consumed only by tile.store");
  const int64_t n = cols(op.getValue());
  if (n == 0) {
    Value write = g.andI(g.cmp(CmpIPredicate::eq, lane, g.c32(0)), mask.at(0));
    g.ifThen(write,
             [&] { storeAt(base, elem, g.ext64(index.at(0)), value.at(0)); });
    return success();
  }
  for (int64_t j = 0; j < ceilDiv(n, 32); ++j) {
    Value write = mask.at(j);
    if (Value ok = columnOk(j, n))
      write = g.andI(write, ok);
    g.ifThen(write,
             [&] { storeAt(base, elem, g.ext64(index.at(j)), value.at(j)); });
  }
  return success();
}

/// The same op on each register; rank-1 operands of a 2-D op (a row's
/// value) repeat over the lane's columns.
LogicalResult RowKernelLowering::lowerElementwise(Operation *op) {
  int64_t count = 1;
  for (Value v : op->getOperands())
    if (isTile(v)) {
      if (regs[v].pendingRound)
        return fail(op, "a rounded tile is consumed only by tile.store");
      count = std::max<int64_t>(count, regs[v].regs.size());
    }
  SmallVector<Type> types;
  for (Value r : op->getResults())
    types.push_back(cast<RankedTensorType>(r.getType()).getElementType());
  SmallVector<RowRegs> outs(op->getNumResults());
  for (int64_t i = 0; i < count; ++i) {
    SmallVector<Value> operands;
    for (Value v : op->getOperands())
      operands.push_back(isTile(v) ? regs[v].at(i) : map.lookup(v));
    FailureOr<SmallVector<Value>> res =
        lowerScalarElement(b, g, op, operands, types);
    if (failed(res))
      return failure();
    for (unsigned r = 0; r < op->getNumResults(); ++r)
      outs[r].regs.push_back((*res)[r]);
  }
  for (unsigned r = 0; r < op->getNumResults(); ++r)
    regs[op->getResult(r)] = std::move(outs[r]);
  return success();
}

SmallVector<Value> RowKernelLowering::carried(Value v) {
  if (!isTile(v))
    return {map.lookup(v)};
  const int64_t n = cols(v);
  SmallVector<Value> out;
  for (int64_t j = 0; j < std::max<int64_t>(1, ceilDiv(n, 32)); ++j)
    out.push_back(regs[v].at(j));
  return out;
}

/// A loop (the split-KV merge's over the splits): the same loop on the
/// row's registers, every tile iter_arg as the lane's column registers.
/// Before:
///
///   %r:2 = scf.for %s = %c0 to %n step %c1
///       iter_args(%acc = %zeros, %m = %neginf) -> (tensor<64x128xf32>,
///       tensor<64xf32>) { ... }
///
/// After (per row of the warp): `scf.for %s = %c0 to %n step %c1
/// iter_args(%a0, %a1, %a2, %a3, %m0) -> (f32, f32, f32, f32, f32)`,
/// columns lane + 32 j of %acc and the row's %m.
LogicalResult RowKernelLowering::lowerFor(scf::ForOp loop) {
  SmallVector<Value> inits;
  SmallVector<int64_t> sizes;
  for (Value v : loop.getInitArgs()) {
    if (isTile(v) && regs[v].pendingRound)
      return fail(loop, "a loop carries no rounded tile");
    SmallVector<Value> r = carried(v);
    sizes.push_back(r.size());
    inits.append(r);
  }
  auto lowered = scf::ForOp::create(b, map.lookup(loop.getLowerBound()),
                                    map.lookup(loop.getUpperBound()),
                                    map.lookup(loop.getStep()), inits);
  // Maps values[first, first + sizes[i]) to the i-th of \p to.
  auto bind = [&](ValueRange to, ValueRange values) {
    size_t first = 0;
    for (auto [i, v] : llvm::enumerate(to)) {
      ValueRange part = values.slice(first, sizes[i]);
      first += sizes[i];
      if (isTile(v))
        regs[v].regs.assign(part.begin(), part.end());
      else
        map.map(v, part.front());
    }
  };
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(lowered.getBody());
    map.map(loop.getInductionVar(), lowered.getInductionVar());
    bind(loop.getRegionIterArgs(), lowered.getRegionIterArgs());
    for (Operation &op : loop.getBody()->without_terminator())
      if (failed(lowerOp(&op)))
        return failure();
    SmallVector<Value> yielded;
    for (Value v : loop.getBody()->getTerminator()->getOperands())
      yielded.append(carried(v));
    scf::YieldOp::create(b, yielded);
  }
  bind(loop.getResults(), lowered.getResults());
  return success();
}

LogicalResult RowKernelLowering::lowerOp(Operation *op) {
  if (auto loop = dyn_cast<scf::ForOp>(op))
    return lowerFor(loop);
  if (auto l = dyn_cast<tile::LoadOp>(op))
    return lowerLoad(l);
  if (auto s = dyn_cast<tile::StoreOp>(op))
    return lowerStore(s);
  if (auto r = dyn_cast<tile::ReduceOp>(op))
    return lowerReduce(r);
  if (auto i = dyn_cast<tile::IotaOp>(op))
    return lowerIota(i);
  if (auto gather = dyn_cast<tile::GatherOp>(op))
    return lowerGather(gather);
  if (auto scatter = dyn_cast<tile::ScatterOp>(op))
    return lowerScatter(scatter);
  if (auto bc = dyn_cast<tile::BroadcastOp>(op)) {
    if (bc.getDim() != 1)
      return fail(op, "a row kernel broadcasts along its rows only");
    regs[bc.getResult()] = regs[bc.getValue()]; // repeats over the columns
    return success();
  }
  if (auto s = dyn_cast<tile::SplatOp>(op)) {
    regs[s.getResult()].regs.push_back(map.lookup(s.getValue()));
    return success();
  }
  if (auto c = dyn_cast<arith::ConstantOp>(op); c && isTile(c.getResult())) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    if (!dense || !dense.isSplat())
      return fail(op, "only splat constant tiles are lowered");
    regs[c.getResult()].regs.push_back(arith::ConstantOp::create(
        b, cast<TypedAttr>(dense.getSplatValue<Attribute>())));
    return success();
  }
  if (isa<arith::TruncFOp, arith::ExtFOp>(op) && isTile(op->getResult(0))) {
    // A tile loaded in the element type holds its values as f32 already,
    // so widening it is exact; rounding happens where it is stored.
    RowRegs out = regs[op->getOperand(0)];
    out.pendingRound = isa<arith::TruncFOp>(op);
    regs[op->getResult(0)] = std::move(out);
    return success();
  }
  bool touchesTiles =
      llvm::any_of(op->getOperands(), [&](Value v) { return isTile(v); }) ||
      llvm::any_of(op->getResults(), [&](Value v) { return isTile(v); });
  if (touchesTiles)
    return op->hasTrait<OpTrait::Elementwise>()
               ? lowerElementwise(op)
               : fail(op, "no GPU lowering for this op on tiles");
  // A scalar of a buffer (a varlen offset): one load by every thread.
  if (isa<memref::LoadOp>(op))
    return lowerScalarBufferLoad(b, g, op, map);
  if (llvm::any_of(op->getOperands(),
                   [](Value v) { return isa<MemRefType>(v.getType()); }))
    return fail(op, "a row kernel reads buffers by tile.load and scalar "
                    "memref.load only");
  b.clone(*op, map);
  return success();
}

LogicalResult RowKernelLowering::run(mlir::gpu::GPUModuleOp gpuModule) {
  if (failed(tile::verifyWritesOutput(fn)) || failed(analyse()))
    return failure();
  if (failed(checkPlacedArguments(fn, place)))
    return failure();
  auto kernel = createPlacedKernel(b, g, gpuModule, fn, place, 0);
  b.setInsertionPointToStart(&kernel.getBody().front());
  mapPlacedArguments(b, g, fn, kernel, place, map);
  Value tid = g.threadIdX();
  Value warp = g.divU(tid, g.c32(32));
  lane = g.remU(tid, g.c32(32));
  const int64_t warps = place.threads / 32;

  // The scalars first (no scalar depends on a tile), then the tile ops
  // once per row of the warp.
  Block &body = fn.getBody().front();
  auto isTileOp = [&](Operation &op) {
    return op.getDialect() ==
               b.getContext()->getLoadedDialect<tile::TileDialect>() ||
           llvm::any_of(op.getResults(), [&](Value v) { return isTile(v); });
  };
  for (Operation &op : body.without_terminator())
    if (!isTileOp(op) && failed(lowerOp(&op)))
      return failure();
  auto loop = scf::ForOp::create(b, g.c32(0), g.c32(rows / warps), g.c32(1));
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    row = g.add(g.mul(loop.getInductionVar(), g.c32(warps)), warp);
    Value r =
        g.add(arith::IndexCastOp::create(b, g.i32, map.lookup(rowStart)), row);
    Value exists =
        g.cmp(CmpIPredicate::slt, r,
              arith::IndexCastOp::create(b, g.i32, map.lookup(rowBound)));
    LogicalResult lowered = success();
    g.ifThen(exists, [&] {
      for (Operation &op : body.without_terminator())
        if (succeeded(lowered) && isTileOp(op))
          lowered = lowerOp(&op);
    });
    if (failed(lowered))
      return failure();
  }
  mlir::gpu::ReturnOp::create(b);
  return success();
}

LogicalResult conversion::lowerRowKernel(func::FuncOp fn,
                                         mlir::gpu::GPUModuleOp gpuModule,
                                         const AttentionSpec &spec,
                                         const KernelPlacement &place) {
  ImplicitLocOpBuilder b(fn.getLoc(), fn.getContext());
  return RowKernelLowering(b, fn, spec, place).run(gpuModule);
}
