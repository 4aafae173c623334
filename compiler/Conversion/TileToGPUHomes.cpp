//===- TileToGPUHomes.cpp - Where each tile of the kernel lives ----------===//
//
/// \file
/// The analysis at the start of the tile lowering (TileToGPU.h,
/// TileKernelLowering::assignHomes): each tile's home, in a shared-memory
/// slot (a tile.load only tile.dot reads; a per-column vector), in the
/// registers of the warps (every other tile), or staged for a transposed
/// read, and the slots' offsets in program order as kernels/GpuGeometry.h
/// lays them out for the launcher. Split from TileToGPU.cpp, which walks
/// the ops to their lowerings.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "compiler/Conversion/KernelEmitters.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// Whether every user of \p v is a tile.broadcast along dim 0.
static bool onlyColumnBroadcasts(Value v) {
  return !v.use_empty() && llvm::all_of(v.getUsers(), [](Operation *u) {
    auto bc = dyn_cast<tile::BroadcastOp>(u);
    return bc && bc.getDim() == 0;
  });
}

/// A tile.load whose every user is a tile.dot lives in a shared-memory slot,
/// a rank-1 f32 load read only by per-column broadcasts in a SharedVector
/// slot (the slots in program order, as kernels/GpuGeometry.h lays them out
/// for the launcher); every other tile lives in registers, whose rows must
/// be the placement's (a transposed product's excepted: its reduction into
/// global memory distributes it, TileToGPUAtomics.cpp). A loop whose shared
/// tiles have several reader dots, or which reads a SharedVector, has its
/// slots double-buffered (lowerDoubleBufferedFor): the second stage follows
/// the first (and a third the second, KernelPlacement::bufferStages). Register
/// tiles that a product reads transposed get staging slots after every other.
LogicalResult TileKernelLowering::assignHomes() {
  auto addSlot = [&](Value v, SharedSlot slot, int64_t bytes) {
    slot.offset = isTile(v) && tileType(v).getRank() == 2
                      ? alignSlot(sharedBytes)
                      : sharedBytes;
    sharedBytes += roundUp(bytes, 16);
    slots[v] = slot;
  };
  if (place.ringStages)
    for (Operation &op : fn.getBody().front())
      if (auto loop = dyn_cast<scf::ForOp>(&op))
        for (Operation &inner : loop.getBody()->without_terminator())
          if (auto load = dyn_cast<tile::LoadOp>(&inner))
            loopBases.insert(load.getBase());
  findSharedConstants();
  WalkResult walk = fn.walk([&](Operation *op) -> WalkResult {
    if (constantOps.contains(op))
      return WalkResult::advance(); // placeSharedConstants
    if (auto loop = dyn_cast<scf::ForOp>(op)) {
      for (Value v :
           llvm::concat<Value>(loop.getRegionIterArgs(), loop.getResults()))
        if (isTile(v)) // what the loop carries
          homes[v] = TileHome::Registers;
      // Post-order: the loop's own loads have the latest slots.
      int64_t first = -1, readers = 0;
      bool vectors = false;
      for (Operation &inner : loop.getBody()->without_terminator()) {
        auto load = dyn_cast<tile::LoadOp>(&inner);
        if (!load || !slots.count(load.getResult()))
          continue;
        if (first < 0)
          first = slots[load.getResult()].offset;
        vectors |= homes[load.getResult()] == TileHome::SharedVector;
        readers =
            std::max<int64_t>(readers, std::distance(load->getUsers().begin(),
                                                     load->getUsers().end()));
      }
      if (place.ringStages)
        return failed(assignRing(loop)) ? WalkResult::interrupt()
                                        : WalkResult::advance();
      if (first >= 0 && (vectors || readers > 1)) {
        int64_t stage = alignSlot(sharedBytes) - first;
        doubleBuffered[loop] = stage;
        sharedBytes = first + place.bufferStages * stage;
      }
      return WalkResult::advance();
    }
    for (Value v : op->getResults()) {
      if (!isTile(v))
        continue;
      RankedTensorType ty = tileType(v);
      auto load = dyn_cast<tile::LoadOp>(op);
      bool onlyDots = load && !v.use_empty() &&
                      llvm::all_of(v.getUsers(), [](Operation *u) {
                        return isa<tile::DotOp>(u);
                      });
      if (load && ty.getRank() == 1 && ty.getElementType().isF32() &&
          onlyColumnBroadcasts(v)) {
        homes[v] = TileHome::SharedVector;
        addSlot(v, SharedSlot(), ty.getDimSize(0) * 4);
        continue;
      }
      if (load && ty.getRank() == 1 && ty.getElementType().isF32()) {
        homes[v] = TileHome::Registers; // per-row values, read from memory
        continue;
      }
      auto dot = dyn_cast<tile::DotOp>(op);
      if (dot && dot.getTransposeLhs()) {
        homes[v] = TileHome::Registers;
        continue;
      }
      if (!onlyDots) {
        if (load)
          return fail(op, "a tile.load must feed only tile.dot, or (rank 1, "
                          "f32) only per-column broadcasts (register loads "
                          "are not implemented yet)");
        if (ty.getDimSize(0) != place.regRows)
          return fail(op, "register tiles must have ")
                 << place.regRows << " rows here, got " << ty;
        homes[v] = TileHome::Registers;
        continue;
      }
      if (ty.getRank() != 2 || ty.getElementType() != g.halfTy)
        return fail(op, "a shared tile must be 2-D in the element type, got ")
               << ty;
      if (isRingPrologueLoad(load)) {
        homes[v] = TileHome::Shared; // its stream's slot (assignRing)
        continue;
      }
      // Columns that become the product's columns (P V's V) follow the
      // product's split over grid.z; contracted columns are copied whole.
      auto isColumns = [](OpOperand &use) {
        auto dot = cast<tile::DotOp>(use.getOwner());
        return use.getOperandNumber() == 1 && !dot.getTransposeRhs();
      };
      bool feedsColumns = llvm::any_of(v.getUses(), isColumns);
      SharedSlot slot;
      slot.padCols = roundUp(ty.getDimSize(1), 16);
      if (const KernelPlacement::ColumnSplit *s = splitOf(ty);
          s && feedsColumns) {
        // Only product columns: the program's chunk is copied (P V's V);
        // else every chunk's columns (zero past the tile), read at the
        // program's offset.
        slot.splitCols = llvm::all_of(v.getUses(), isColumns);
        slot.padCols = slot.splitCols
                           ? s->chunk
                           : std::max(slot.padCols, s->chunk * s->chunks);
      }
      slot.rowChunks = roundUp(slot.padCols / 8, 8);
      homes[v] = TileHome::Shared;
      addSlot(v, slot, ty.getDimSize(0) * slot.rowChunks * 16);
    }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  // A slot after every one so far for a 2-D 16-bit tile that no copy
  // fills (a staged register tile, a constant tile): its columns padded to
  // 16, its rows whole swizzle groups of 8 chunks.
  auto appendSlot = [&](RankedTensorType ty) {
    SharedSlot slot;
    slot.padCols = roundUp(ty.getDimSize(1), 16);
    slot.rowChunks = roundUp(slot.padCols / 8, 8);
    slot.offset = alignSlot(sharedBytes);
    sharedBytes = slot.offset + ty.getDimSize(0) * slot.rowChunks * 16;
    return slot;
  };
  auto stage = [&](Value lhs) {
    if (!staging.count(lhs))
      staging[lhs] = appendSlot(tileType(lhs));
  };
  walk = fn.walk([&](tile::DotOp dot) -> WalkResult {
    Value lhs = dot.getLhs();
    // With column parts, a register lhs is staged too (each warp holds part
    // of its k-columns).
    const bool partial =
        place.colParts > 1 && homes.lookup(lhs) == TileHome::Registers;
    if (!dot.getTransposeLhs() && !partial)
      return WalkResult::advance();
    if (partial && !dot.getTransposeLhs()) {
      if (!lhs.getDefiningOp<arith::TruncFOp>())
        return fail(dot, "a register lhs must be a tile rounded by "
                         "arith.truncf");
      stage(lhs);
      return WalkResult::advance();
    }
    auto round = lhs.getDefiningOp<arith::TruncFOp>();
    if (!round || homes.lookup(round.getIn()) != TileHome::Registers)
      return fail(dot, "a transposed lhs must be a register tile rounded by "
                       "arith.truncf");
    if (!dot->hasOneUse() || !isa<tile::AtomicAddOp>(*dot->user_begin()) ||
        dot.getAcc())
      return fail(dot, "a product with a transposed lhs must be reduced "
                       "into global memory by one tile.atomic_add, without "
                       "acc");
    stage(lhs);
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  if (place.dqStageCols) {
    dqStageOffset = alignSlot(sharedBytes);
    sharedBytes =
        dqStageOffset + place.warpgroups() * 64 * place.dqStageCols * 4;
  }
  if (place.outputStagingBytes) {
    outputSlot.offset = alignSlot(sharedBytes);
    outputSlot.rowChunks = place.outputStagingBytes / (place.gridRows * 16);
    outputSlot.padCols = outputSlot.rowChunks * 8;
    sharedBytes = outputSlot.offset + place.outputStagingBytes;
    describeOutputMap();
  }
  if (!sharedConstants.empty()) { // (TileToGPUConstants.cpp)
    for (auto &[v, slot] : sharedConstants) {
      slot = appendSlot(tileType(v));
      homes[v] = TileHome::Shared;
      slots[v] = slot;
    }
    // The launcher provides what the kernel records (attn.shared_bytes):
    // the geometry's slots, then these, within the block's shared memory.
    place.maxShared =
        std::max(place.maxShared, std::min(sharedBytes, kSm90MaxSharedBytes));
  }
  if (sharedBytes > place.maxShared)
    return fn.emitError() << "the tiles need " << sharedBytes
                          << " bytes of shared memory, more than the "
                          << place.maxShared << " the launcher provides";
  return success();
}
