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

/// Where a 2-D 16-bit register tile can be stored through shared memory: a
/// slot of a tile.load of the function's body (not the ring's, not the
/// producer's tensor copy) that is read only as the lhs of products (so
/// each warp reads only its own rows of it, as it holds its own rows of
/// the stored tile) and by none after the store, with at least the
/// store's rows and columns. Where the producer copies Q (the dead slot
/// of the other forwards, which it refills for the next tile) the
/// forward's own outputSlot, if the placement gave it one.
std::optional<TileKernelLowering::StagingSlot>
TileKernelLowering::stagingSlotFor(tile::StoreOp op) {
  RankedTensorType ty = tileType(op.getValue());
  if (!place.stagedStores || copyBytes != 16 || place.colParts != 1 ||
      ty.getRank() != 2 || ty.getElementType() != g.halfTy ||
      ty.getDimSize(1) % 8 != 0 || splitsCols(ty) ||
      op->getBlock() != &fn.getBody().front())
    return std::nullopt;
  if (queryLoad) {
    if (!outputSlot.rowChunks || outputSlot.padCols < ty.getDimSize(1) ||
        place.gridRows < ty.getDimSize(0))
      return std::nullopt;
    return StagingSlot{outputSlot, place.gridRows, Value()};
  }
  for (auto &[v, slot] : slots) {
    auto load = v.getDefiningOp<tile::LoadOp>();
    if (!load || load->getBlock() != op->getBlock() ||
        pipelined.contains(load) || isRingPrologueLoad(load) ||
        stageShift.count(v) || slot.splitCols ||
        homes.lookup(v) != TileHome::Shared)
      continue;
    RankedTensorType slotTy = load.getType();
    if (slotTy.getDimSize(0) < ty.getDimSize(0) ||
        slot.padCols < ty.getDimSize(1))
      continue;
    bool dead = llvm::all_of(v.getUses(), [&](OpOperand &use) {
      auto dot = dyn_cast<tile::DotOp>(use.getOwner());
      Operation *at = op->getBlock()->findAncestorOpInBlock(*use.getOwner());
      return dot && use.getOperandNumber() == 0 && !dot.getTransposeLhs() &&
             at && at->isBeforeInBlock(op);
    });
    if (dead)
      return StagingSlot{slot, slotTy.getDimSize(0), v};
  }
  return std::nullopt;
}

/// A 16-bit register tile's store through a dead shared slot
/// (stagingTileFor): the warp writes its rows there as element pairs
/// (writeFragment, the slot's swizzled layout: no bank conflicts), then
/// each lane copies 16-byte chunks, consecutive lanes along a row, so that
/// a warp's store covers whole rows. Only the warp's own rows are touched,
/// so a warp-level ordering point separates the two halves. Before:
///
///   tile.store %o, %O[%off] rows %m0 of %nq stride %sn
///       : tensor<128x128xbf16>, memref<?xbf16>
///
/// After (a warp's 16 rows of 16 chunks: 8 rounds of 32 lanes):
///
///   st.shared.b32 [Q's slot + swizzle(row, col) + 4 tig], cvt.rn.bf16x2(..)
///   bar.warp.sync -1
///   // round k: chunk c = (32 k + lane) % 16 of row r = (32 k + lane) / 16
///   %x = ld.shared.v4.b32 [Q's slot + swizzle(warp row + r, 8 c)]
///   @(m0 + warp row + r < nq) st.global.v4.b32 [O + off + (m0 + warp row
///       + r) * sn + 8 c], %x
///
/// where the element-wise store had 64 two-byte stores per thread, each
/// behind its row and column test (T18: the epilogue was 27% of the warps'
/// stall samples at N = 1024).
LogicalResult
TileKernelLowering::storeThroughShared(tile::StoreOp op, const Fragment &f,
                                       const StoreRows &to,
                                       const StagingSlot &through) {
  RankedTensorType ty = tileType(op.getValue());
  const SharedSlot &slot = through.slot;
  const int64_t slotRows = through.rows;
  // The slot's copies are waited for before its first reader. Where every
  // reader is inside a loop, a loop of no trips (a Q block that sees no
  // keys) leaves them in flight, and they spread the tile's rows over all
  // threads: then every thread waits for its own, and a barrier for all
  // (the trip counts are the program's: a uniform branch).
  auto ancestor = [&](Operation *user) {
    return op->getBlock()->findAncestorOpInBlock(*user);
  };
  if (!through.tile) {
    // outputSlot: no copy fills it; in a persistent kernel the warp read
    // its rows out in the last tile, each lane others' too.
    if (place.persistent)
      g.warpSync();
  } else if (llvm::none_of(through.tile.getUsers(), [&](Operation *user) {
               return ancestor(user) == user;
             })) {
    // Every reader is in a loop (or a branch: then always): skipped when
    // every one of those loops has no trips.
    Value skipped = g.cBool(true);
    for (Operation *user : through.tile.getUsers())
      if (auto loop = dyn_cast<scf::ForOp>(ancestor(user)))
        skipped = g.andI(skipped,
                         arith::CmpIOp::create(b, CmpIPredicate::sle,
                                               scalar(loop.getUpperBound()),
                                               scalar(loop.getLowerBound())));
    g.ifThen(skipped, [&] {
      g.waitAll();
      g.barrier();
    });
  }
  writeFragment(slot, slotRows, ty, f);
  g.warpSync();
  const int64_t chunks = ty.getDimSize(1) / 8, warpRows = mt * 16;
  const int64_t total = warpRows * chunks;
  auto v4 = VectorType::get({4}, g.i32);
  // The 16-byte chunk of round k of lane l: chunk (32 k + l) % chunks of
  // the warp's row (32 k + l) / chunks, at sharedAt(row) + its swizzle.
  auto sharedAt = [&](Value r, Value col) {
    Value at = place.wgmma ? g.swizzledBlocked(r, col, blockBytes(slotRows))
                           : g.swizzled(r, col, slot.rowChunks);
    return g.sharedBytePtr(smem, g.add(g.c32(slot.offset), at));
  };
  if (32 % chunks == 0 && total % 32 == 0 && !to.group) {
    // Whole rows per round: each lane keeps its column and moves down
    // 32 / chunks rows a round, so its global address is found once and
    // stepped by a multiple of the row stride; where all the warp's rows
    // exist (every full Q block) no round tests its row. Before (each
    // round, T18): the row, its 64-bit offset and a branch around the
    // store; after, for a full block:
    //
    //   %p0 = O + off + (m0 + warp row + l / chunks) * sn + 8 (l % chunks)
    //   round k: ld.shared.v4 [swizzle(warp row + l / chunks + k step,
    //            8 (l % chunks))]; st.global.v4 [%p0 + k step sn]
    const int64_t step = 32 / chunks;
    Value r0 = g.add(warpRow0, g.divU(lane, g.c32(chunks)));
    Value col = g.mul(g.remU(lane, g.c32(chunks)), g.c32(8));
    Value row0 = g.add(to.row0, r0);
    Value ptr0 = g.elementPtr(to.base, g.add(to.rowAt(g, row0), g.ext64(col)));
    auto rounds = [&](bool checked) {
      for (int64_t k = 0; k < total / 32; ++k) {
        Value x = LLVM::LoadOp::create(
            b, v4, sharedAt(g.add(r0, g.c32(k * step)), col), 16);
        Value rows = g.c64(k * step);
        Value ptr =
            g.elementPtr(ptr0, to.stride ? g.mul(rows, to.stride) : rows);
        auto store = [&] { LLVM::StoreOp::create(b, x, g.toGlobal(ptr), 16); };
        if (checked)
          g.ifThen(
              g.cmp(CmpIPredicate::slt, g.add(row0, g.c32(k * step)), to.rows),
              store);
        else
          store();
      }
    };
    Value lastRow = g.add(to.row0, g.add(warpRow0, g.c32(warpRows - 1)));
    auto full = scf::IfOp::create(
        b, g.cmp(CmpIPredicate::slt, lastRow, to.rows), /*withElse=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(full.thenBlock());
    rounds(false);
    b.setInsertionPointToStart(full.elseBlock());
    rounds(true);
    return success();
  }
  for (int64_t k = 0; k < total; k += 32) {
    auto body = [&] {
      Value i = g.add(lane, g.c32(k));
      Value r = g.add(warpRow0, g.divU(i, g.c32(chunks)));
      Value col = g.mul(g.remU(i, g.c32(chunks)), g.c32(8));
      Value x = LLVM::LoadOp::create(b, v4, sharedAt(r, col), 16);
      Value row = g.add(to.row0, r);
      g.ifThen(g.cmp(CmpIPredicate::slt, row, to.rows), [&] {
        Value index = g.add(to.rowAt(g, row), g.ext64(col));
        LLVM::StoreOp::create(b, x, g.toGlobal(g.elementPtr(to.base, index)),
                              16);
      });
    };
    if (k + 32 <= total)
      body();
    else
      g.ifThen(g.cmp(CmpIPredicate::ult, lane, g.c32(total - k)), body);
  }
  return success();
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
