//===- TileToGPUMemory.cpp - Global tiles <-> shared memory and registers -===//
//
/// \file
/// The memory op family of the tile lowering (TileToGPU.h): tile.load into
/// a shared-memory slot by cp.async, tile.store from registers, and the
/// scalar memref.load of a layout entry.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;
using arith::CmpIPredicate;

/// A shared tile's copies: where its loop's pipeline issues them, nothing
/// here; elsewhere in place. Before:
///
///   %k = tile.load %K[%off] rows %n0 of %nkv stride %sn
///       : memref<?xbf16> -> tensor<64x96xbf16>
///
/// After (the slot at byte 16384, rows of 16 chunks; one cp.async of 16
/// bytes per thread and chunk, zero-filled past Nkv and past column 96):
///
///   llvm.call_intrinsic "llvm.nvvm.cp.async.cg.shared.global.16.s"(...)
///   ...
///   llvm.call_intrinsic "llvm.nvvm.cp.async.commit.group"()
LogicalResult TileKernelLowering::lowerLoad(tile::LoadOp op) {
  if (pipelined.contains(op) || placeRingEpilogueLoad(op))
    return success();
  if (op == queryLoad) { // the producer's tensor copy (TileToGPUTma.cpp)
    queryPending = true; // waited for before its first product
    return success();
  }
  if (homes.lookup(op.getResult()) == TileHome::Registers)
    return lowerRowValues(op);
  // Inside a loop without a pipeline, the slot's readers of the previous
  // iteration must be done before it is overwritten.
  if (op->getParentOfType<scf::ForOp>())
    g.barrier();
  return issueCopy(op, Value());
}

LogicalResult TileKernelLowering::mapIteration(ArrayRef<tile::LoadOp> ops,
                                               Value iv, IRMapping &another) {
  another = map;
  auto loop = cast<scf::ForOp>(ops.front()->getParentOp());
  another.map(loop.getInductionVar(), iv);
  // The scalar ops of the loop body that the loads' operands depend on.
  llvm::SetVector<Operation *> slice;
  SmallVector<Value> work;
  for (tile::LoadOp op : ops)
    work.append(op->getOperands().begin(), op->getOperands().end());
  while (!work.empty()) {
    Value v = work.pop_back_val();
    Operation *def = v.getDefiningOp();
    if (!def || def->getBlock() != loop.getBody() || slice.contains(def))
      continue;
    slice.insert(def);
    work.append(def->getOperands().begin(), def->getOperands().end());
  }
  SmallVector<Operation *> ordered(slice.begin(), slice.end());
  llvm::sort(ordered,
             [](Operation *x, Operation *y) { return x->isBeforeInBlock(y); });
  for (Operation *def : ordered) {
    if (isa<memref::LoadOp>(def)) {
      if (failed(lowerScalarLoad(def, another)))
        return failure();
    } else if (def->getNumRegions() == 0) {
      b.clone(*def, another);
    } else {
      return fail(ops.front(), "its address depends on an op with regions");
    }
  }
  return success();
}

LogicalResult TileKernelLowering::issueCopy(ArrayRef<tile::LoadOp> ops,
                                            Value iv, Value dstShift,
                                            bool commit) {
  // Another iteration's copies evaluate the loads' operands again, in a
  // mapping of their own; this iteration's use the walk's.
  IRMapping another;
  IRMapping &local = iv ? another : map;
  if (iv && failed(mapIteration(ops, iv, another)))
    return failure();
  for (size_t i = 0; i < ops.size();) {
    tile::LoadOp op = ops[i];
    if (homes.lookup(op.getResult()) == TileHome::SharedVector) {
      if (op.getGroup())
        return fail(op, "vector copies of grouped rows are not implemented");
      size_t next = i + 1;
      while (next < ops.size() && copiesWith(op, ops[next], next - i))
        ++next;
      copyVectors(ops.slice(i, next - i), local, dstShift);
      i = next;
      continue;
    }
    const SharedSlot &slot = slots[op.getResult()];
    RankedTensorType ty = op.getType();
    Value colBase = slot.splitCols ? splitStart : g.c32(0);
    Value offset = toI64(local.lookup(op.getOffset()));
    Value stride = toI64(local.lookup(op.getStride()));
    Value row0 = toI32(local.lookup(op.getRow0()));
    Value rows = toI32(local.lookup(op.getRows()));
    Value dst = g.c32(slot.offset);
    if (dstShift)
      dst = g.add(dst, dstShift);
    gpu::TileSource src{local.lookup(op.getBase()),
                        offset,
                        stride,
                        row0,
                        rows,
                        ty.getDimSize(0),
                        ty.getDimSize(1),
                        colBase,
                        slot.padCols,
                        slot.rowChunks,
                        dst,
                        blockBytes(ty.getDimSize(0))};
    if (op.getGroup()) {
      src.groupSize = toI32(local.lookup(op.getGroup()));
      src.groupStride = toI64(local.lookup(op.getGroupStride()));
    }
    gpu::copyTileAsync(
        g,
        gpu::TileCopier{smem, copyTid ? copyTid : tid,
                        copyThreads ? copyThreads : place.threads, copyBytes},
        src);
    ++i;
  }
  if (commit)
    g.commitGroup();
  pendingCopies = true;
  return success();
}

/// A rank-1 f32 tile into per-row registers (its users broadcast it over
/// the columns). Before:
///
///   %nl = tile.load %Delta[%off] rows %m0 of %nq
///       : memref<?xf32> -> tensor<64xf32>
///
/// After, per row register (mi, h), row r = m0 + warp row + mi * 16 + 8 h +
/// grp: `%v = ld.global.f32 [Delta + off + (r < nq ? r : 0)]`, then
/// `select(r < nq, %v, 0)`.
LogicalResult TileKernelLowering::lowerRowValues(tile::LoadOp op) {
  if (op.getType().getRank() != 1)
    return fail(op, "register loads of 2-D tiles are not implemented yet");
  if (op.getGroup())
    return fail(op, "register loads of grouped rows are not implemented");
  Value base = scalar(op.getBase());
  Value offset = toI64(scalar(op.getOffset()));
  Value row0 = toI32(scalar(op.getRow0()));
  Value rows = toI32(scalar(op.getRows()));
  Fragment out;
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t h = 0; h < 2; ++h) {
      Value r =
          g.add(row0, g.add(warpRow0, g.add(grp, g.c32(mi * 16 + 8 * h))));
      Value ok = g.cmp(CmpIPredicate::slt, r, rows);
      Value at = g.add(offset, g.ext64(g.select(ok, r, g.c32(0))));
      Value v =
          LLVM::LoadOp::create(b, g.f32,
                               LLVM::GEPOp::create(b, g.ptrGen, g.f32, base,
                                                   ArrayRef<LLVM::GEPArg>{at}));
      out.regs.push_back(g.select(ok, v, g.cf(0.0)));
    }
  frags[op.getResult()] = std::move(out);
  return success();
}

bool TileKernelLowering::copiesWith(tile::LoadOp first, tile::LoadOp next,
                                    int64_t k) {
  const int64_t bytes = first.getType().getDimSize(0) * 4;
  return homes.lookup(next.getResult()) == TileHome::SharedVector &&
         next.getType() == first.getType() && bytes % 16 == 0 &&
         next.getBase() == first.getBase() &&
         next.getRow0() == first.getRow0() &&
         next.getRows() == first.getRows() &&
         slots[next.getResult()].offset ==
             slots[first.getResult()].offset + k * bytes;
}

/// Rank-1 f32 tiles into their SharedVector slots: element e of tile k by
/// a 4-byte cp.async from base[offset_k + row0 + e], zero-filled (src-size
/// 0) where row0 + e >= rows. Tiles that read the same rows into adjacent
/// slots (copiesWith) are one vector of their elements in slot order, so
/// that every thread copies one element where the threads cover them.
/// Before:
///
///   %nl = tile.load %Delta[%offl] rows %m0 of %nq
///       : memref<?xf32> -> tensor<128xf32>
///   %dl = tile.load %Delta[%offd] rows %m0 of %nq
///       : memref<?xf32> -> tensor<128xf32>
///
/// After, per thread (256 threads: one pass, element tid % 128 of tile
/// tid / 128):
///
///   %ok = m0 + tid % 128 < nq
///   cp.async.ca.shared.global [slot + 4 tid], [Delta + (tid < 128 ? offl
///       : offd) + (ok ? m0 + tid % 128 : 0)], 4, (ok ? 4 : 0)
void TileKernelLowering::copyVectors(ArrayRef<tile::LoadOp> ops,
                                     IRMapping &local, Value dstShift) {
  tile::LoadOp first = ops.front();
  const int64_t n = first.getType().getDimSize(0);
  const int64_t total = n * int64_t(ops.size());
  Value t = copyTid ? copyTid : tid;
  SmallVector<Value> offsets;
  for (tile::LoadOp op : ops)
    offsets.push_back(toI64(local.lookup(op.getOffset())));
  Value row0 = toI32(local.lookup(first.getRow0()));
  Value rows = toI32(local.lookup(first.getRows()));
  Value base = local.lookup(first.getBase());
  Value dst0 = g.c32(slots[first.getResult()].offset);
  if (dstShift)
    dst0 = g.add(dst0, dstShift);
  for (int64_t pass = 0; pass < total; pass += place.threads) {
    auto body = [&] {
      Value i = g.add(t, g.c32(pass));
      Value e = ops.size() > 1 ? g.remU(i, g.c32(n)) : i;
      Value offset = offsets.front();
      for (size_t k = 1; k < ops.size(); ++k)
        offset = g.select(g.cmp(CmpIPredicate::uge, i, g.c32(k * n)),
                          offsets[k], offset);
      Value r = g.add(row0, e);
      Value ok = g.cmp(CmpIPredicate::slt, r, rows);
      Value at = g.add(offset, g.ext64(g.select(ok, r, g.c32(0))));
      Value src = g.toGlobal(LLVM::GEPOp::create(b, g.ptrGen, g.f32, base,
                                                 ArrayRef<LLVM::GEPArg>{at}));
      Value dst = g.sharedBytePtr(smem, g.add(dst0, g.mul(i, g.c32(4))));
      g.copyAsync(dst, src, g.select(ok, g.c32(4), g.c32(0)), 4);
    };
    if (pass + place.threads <= total)
      body();
    else
      g.ifThen(g.cmp(CmpIPredicate::ult, t, g.c32(total - pass)), body);
  }
}

Value TileKernelLowering::slotOffset(Value v) {
  Value off = g.c32(slots.count(v) ? slots[v].offset : staging[v].offset);
  if (Value shift = stageShift.lookup(v))
    off = g.add(off, shift);
  return off;
}

/// A register tile's rows (and columns) that exist, written element by
/// element. Before:
///
///   tile.store %o, %O[%off] rows %m0 of %nq stride %sn
///       : tensor<64x96xbf16>, memref<?xbf16>
///
/// After, per register (mi, ni, e) of the thread:
///
///   %row = m0 + warp row + mi * 16 + grp + 8 * (e / 2)
///   %col = chunk column + ni * 8 + 2 * tig + e % 2
///   scf.if (%row < %nq && %col < 96) {
///     llvm.store (cvt.rn.bf16 %v), %O[off + row * sn + col]
///   }
///
/// A rank-1 tile (one value per row, replicated over the row's 4 lanes and
/// over the column chunks) is stored by lane tig = 0 of chunk 0.
LogicalResult TileKernelLowering::lowerStore(tile::StoreOp op) {
  Value v = op.getValue();
  if (homes.lookup(v) != TileHome::Registers || !frags.count(v))
    return fail(op, "only register tiles can be stored");
  // The dK/dV kernel's branches store only their own output.
  if (otherBranchOutput(op))
    return success();
  const Fragment &f = frags[v];
  RankedTensorType ty = tileType(v);
  Type elem = ty.getElementType();
  bool half = elem == g.halfTy;
  if (!half && !elem.isF32())
    return fail(op, "stores bf16/f16 or f32 tiles, got ") << ty;
  if (half != f.pendingRound)
    return fail(op, "a 16-bit tile must come from arith.truncf");
  const StoreRows to = storeRowsOf(op);
  if (std::optional<StagingSlot> through = stagingSlotFor(op))
    return storeThroughShared(op, f, to, *through);
  Value base = to.base, row0 = to.row0, rows = to.rows;
  auto store = [&](Value value, Value index64) {
    if (half) {
      LLVM::StoreOp::create(b, g.toElementBits(value),
                            g.elementPtr(base, index64));
      return;
    }
    Value ptr = LLVM::GEPOp::create(b, g.ptrGen, g.f32, base,
                                    ArrayRef<LLVM::GEPArg>{index64});
    LLVM::StoreOp::create(b, value, ptr);
  };
  if (ty.getRank() == 1) {
    Value writer = g.andI(g.cmp(CmpIPredicate::eq, tig, g.c32(0)),
                          g.cmp(CmpIPredicate::eq, chunk, g.c32(0)));
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t h = 0; h < 2; ++h) {
        Value row =
            g.add(row0, g.add(warpRow0, g.add(grp, g.c32(mi * 16 + 8 * h))));
        Value ok = g.andI(writer, g.cmp(CmpIPredicate::slt, row, rows));
        g.ifThen(ok, [&] { store(f.regs[2 * mi + h], to.rowAt(g, row)); });
      }
    return success();
  }
  const int64_t nt = nTiles(ty);
  Value colBase = colStart(ty);
  Value cols = g.c32(ty.getDimSize(1));
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t h = 0; h < 2; ++h) {
      Value row =
          g.add(row0, g.add(warpRow0, g.add(grp, g.c32(mi * 16 + 8 * h))));
      Value rowOk = g.cmp(CmpIPredicate::slt, row, rows);
      Value rowAt = to.rowAt(g, row);
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t e = 0; e < 2; ++e) {
          Value col =
              g.add(colBase, g.add(g.c32(ni * 8 + e), g.mul(tig, g.c32(2))));
          Value ok = g.andI(rowOk, g.cmp(CmpIPredicate::slt, col, cols));
          Value x = f.regs[(mi * nt + ni) * 4 + 2 * h + e];
          g.ifThen(ok, [&] { store(x, g.add(rowAt, g.ext64(col))); });
        }
    }
  return success();
}

TileKernelLowering::StoreRows
TileKernelLowering::storeRowsOf(tile::StoreOp op) {
  StoreRows to;
  to.base = scalar(op.getBase());
  to.offset = toI64(scalar(op.getOffset()));
  to.row0 = toI32(scalar(op.getRow0()));
  to.rows = toI32(scalar(op.getRows()));
  if (op.getStride())
    to.stride = toI64(scalar(op.getStride()));
  // A row group's size and stride (TileOps.td), for GpuBuilder::rowOffset.
  if (op.getGroup()) {
    to.group = toI32(scalar(op.getGroup()));
    to.groupStride = toI64(scalar(op.getGroupStride()));
  }
  return to;
}

/// A scalar read of a buffer (a BCSR layout's count or index). Before:
///
///   %c = memref.load %counts[%i] : memref<?xi32>
///
/// After:
///
///   %p = llvm.getelementptr %counts[%i64] : (!llvm.ptr, i64) -> !llvm.ptr, i32
///   %c = llvm.load %p : !llvm.ptr -> i32
LogicalResult flashjit::conversion::lowerScalarBufferLoad(
    ImplicitLocOpBuilder &b, gpu::GpuBuilder &g, Operation *op,
    IRMapping &mapping) {
  auto load = cast<memref::LoadOp>(op);
  if (load.getIndices().size() != 1)
    return op->emitOpError() << "cannot be lowered to the GPU: buffers are "
                                "1-D";
  Type elem = load.getType();
  Value index = arith::IndexCastOp::create(
      b, g.i64, mapping.lookup(load.getIndices()[0]));
  Value ptr =
      LLVM::GEPOp::create(b, g.ptrGen, elem, mapping.lookup(load.getMemRef()),
                          ArrayRef<LLVM::GEPArg>{index});
  mapping.map(load.getResult(), LLVM::LoadOp::create(b, elem, ptr));
  return success();
}

LogicalResult TileKernelLowering::lowerScalarLoad(Operation *op,
                                                  IRMapping &mapping) {
  return lowerScalarBufferLoad(b, g, op, mapping);
}

/// A captured tensor's element for each register of the index tile: the
/// gather takes the index tile's register layout, one global load per
/// distinct index register (a splat index, one load).
///
///   %g = tile.gather %t[%idx] : memref<?xf32>, tensor<128x64xi32>
///       -> tensor<128x64xf32>
///
/// becomes, for each register %i of %idx's fragment,
///
///   %p = llvm.getelementptr %t[sext(%i)] : (!llvm.ptr, i64) -> !llvm.ptr, f32
///   %g_i = llvm.load %p : !llvm.ptr -> f32
///
/// The tiling keeps every index of a padding element inside the problem
/// (TileAttention.cpp, modifyScores), so no load leaves the tensor.
LogicalResult TileKernelLowering::lowerGather(tile::GatherOp op) {
  if (!op.getType().getElementType().isF32())
    return fail(op, "the attention kernels gather f32 (captured tensors)");
  auto it = frags.find(op.getIndex());
  if (it == frags.end())
    return fail(op, "its index tile is not in registers");
  Value base = map.lookup(op.getBase());
  llvm::DenseMap<Value, Value> loaded;
  Fragment out;
  for (Value index : it->second.regs) {
    Value &v = loaded[index];
    if (!v) {
      Value ptr = LLVM::GEPOp::create(b, g.ptrGen, g.f32, base,
                                      ArrayRef<LLVM::GEPArg>{g.ext64(index)});
      v = LLVM::LoadOp::create(b, g.f32, ptr);
    }
    out.regs.push_back(v);
  }
  frags[op.getResult()] = std::move(out);
  return success();
}

/// A captured tensor's gradient: each register's value added at its index
/// (the gather's index tile, so the same layout), atomically. Registers
/// that share an index register are summed first; a uniform index (a splat:
/// a per-head slope's gradient) is summed over the warp by shuffles and
/// added by lane 0, one atomic per warp instead of one per element. An i64
/// tile (a fixed-point word of a deterministic gradient) the same way with
/// integer adds and red.global.add.u64, none where the sum is 0.
///
///   tile.scatter_add %g, %dt[%idx]
///       : tensor<64x128xf32>, memref<?xf32>, tensor<64x128xi32>
///
/// becomes, for each distinct register %i of %idx's fragment,
///
///   %sum = arith.addf ... (the registers of %g at %i)
///   red.global.add.f32 [%dt + 4 * sext(%i)], %sum
LogicalResult TileKernelLowering::lowerScatterAdd(tile::ScatterAddOp op) {
  auto idx = frags.find(op.getIndex()), val = frags.find(op.getValue());
  if (idx == frags.end() || val == frags.end())
    return fail(op, "its value and index tiles are not in registers");
  Value base = map.lookup(op.getBase());
  // An i64 tile holds a deterministic gradient's fixed-point words: exact
  // integer sums, so the order of the adds leaves no trace.
  const bool integer = tileType(op.getValue()).getElementType().isInteger(64);
  auto plus = [&](Value x, Value y) -> Value {
    return integer ? Value(arith::AddIOp::create(b, x, y)) : g.fadd(x, y);
  };
  llvm::MapVector<Value, Value> sums;
  for (auto [index, v] : llvm::zip_equal(idx->second.regs, val->second.regs)) {
    Value &sum = sums[index];
    sum = sum ? plus(sum, v) : v;
  }
  Value pred = g.cBool(true);
  if (idx->second.uniform && sums.size() == 1) {
    Value &sum = sums.front().second;
    for (int64_t mask = 16; mask >= 1; mask /= 2)
      sum = plus(sum, g.shuffleXor(sum, mask));
    pred = g.cmp(arith::CmpIPredicate::eq, lane, g.c32(0));
  }
  for (auto [index, sum] : sums) {
    Value ptr = LLVM::GEPOp::create(b, g.ptrGen, integer ? g.i64 : g.f32, base,
                                    ArrayRef<LLVM::GEPArg>{g.ext64(index)});
    // An integer 0 adds nothing: no reduction (the non-finite count of a
    // deterministic gradient is one address every warp would add 0 to).
    // The test is this index's own: a zero sum at one index must not drop
    // the adds at the others.
    Value ok =
        integer ? g.andI(pred, g.cmp(arith::CmpIPredicate::ne, sum, g.c64(0)))
                : pred;
    g.reduceAdd(ok, ptr, sum);
  }
  return success();
}
