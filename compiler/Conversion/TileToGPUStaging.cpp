//===- TileToGPUStaging.cpp - Register tiles out through shared memory ---===//
//
/// \file
/// The staged store of the tile lowering (KernelPlacement::stagedStores;
/// the memory op family's, TileToGPUMemory.cpp): a 16-bit register tile
/// goes to global memory through a shared slot, each warp writing its own
/// rows there and copying them out 16 bytes at a time, so that the
/// forward's O leaves in whole-row vector stores instead of 2-byte ones.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;
using arith::CmpIPredicate;

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
  if (outputMap && op == outputStore)
    return storeByTensorMap(op, f, to, through);
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
  // A slot that an earlier store of the block went through (the backward's
  // dK, then dV): the warp's lanes read each other's chunks there, so all
  // of them are done before any writes over them.
  for (Operation *prev = op->getPrevNode(); through.tile && prev;
       prev = prev->getPrevNode())
    if (auto store = dyn_cast<tile::StoreOp>(prev)) {
      std::optional<StagingSlot> earlier = stagingSlotFor(store);
      if (earlier && earlier->tile == through.tile) {
        g.warpSync();
        break;
      }
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
