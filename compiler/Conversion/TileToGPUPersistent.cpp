//===- TileToGPUPersistent.cpp - The K/V ring's forward, persistent -------===//
//
/// \file
/// The persistent kernel (KernelPlacement::persistent, the `persistent` pass
/// option): instead of one program per (Q block, batch * head) tile, a grid
/// of the device's SMs, each program looping over the tiles w = blockIdx.x,
/// blockIdx.x + gridDim.x, ... The tile IR is the same; the lowering runs
/// each role's program of the function body (TileToGPURing.cpp) inside that
/// loop, so that the producer goes on copying the next tile's K and V while
/// the consumers finish the last one's softmax and store. Before (a role's
/// lowering, one tile per program):
///
///   pid_m = blockIdx.x (reversed: causal), pid_bh = blockIdx.y
///   <the role's program, ring positions 0, 1, ... per stream>
///
/// After:
///
///   blocks = ceil(seq_q / Br); tiles = blocks * batch * heads
///   scf.for %w = blockIdx.x to tiles step gridDim.x
///       iter_args(%base_k = 0, %base_v = 0) {
///     pid_bh = w / blocks, pid_m = w % blocks (causal: pid_m = blocks - 1
///       - w / (batch * heads), pid_bh = w % (batch * heads))
///     [consumers: bar.sync 1, consumers]     // Q's slot is free again
///     <the role's program, ring positions base_s + 0, base_s + 1, ...>
///     scf.yield base_s + leads_s + trips      // per stream s
///   }
///
/// where trips is the ring loop's trip count in this tile and leads_s the
/// stream's loads before the loop (ringLead): the producer and the
/// consumers count the same positions, so each stage's mbarrier phases go
/// on from tile to tile. Unmasked, the tiles of one batch * head are
/// consecutive (their K and V stay in L2 for the programs beside them);
/// causal, the heaviest Q blocks of all heads come first.
///
/// A scheduled kernel (KernelPlacement::scheduled: causal) takes the tile
/// schedule the launcher made for its grid (kernels/TileSchedule.h: heads
/// in groups that fit L2, each tile to the program the cost model frees
/// first) as a pointer before its tensor maps; null keeps the stride
/// above:
///
///   %has = llvm.icmp "ne" %schedule, null
///   %lo, %hi, %step = scf.if %has -> (i32, i32, i32) {
///     scf.yield words[blockIdx.x], words[blockIdx.x + 1], 1
///   } else { scf.yield blockIdx.x, tiles, gridDim.x }
///   scf.for %n = %lo to %hi step %step iter_args(...) {
///     w = %has ? words[gridDim.x + 1 + n] : n
///     pid_bh = w / blocks, pid_m = w % blocks  (%has; else as above)
///     ...
///   }
///
/// Both roles read the same words, so the producer and the consumers take
/// the same tiles in the same order.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

LogicalResult
TileKernelLowering::forEachTile(function_ref<LogicalResult()> lowerTile) {
  if (!place.persistent) {
    tileParity = g.c32(0);
    return lowerTile();
  }
  // The problem's tiles, from the index arguments (kernels/KernelABI.h).
  auto indexArg = [&](int i) {
    return toI32(scalar(fn.getArgument(place.numBuffers + i)));
  };
  const int64_t rows = place.gridRows;
  Value blocks = g.divU(g.add(indexArg(abi::SeqQ), g.c32(rows - 1)),
                        g.c32(rows));
  Value heads = g.mul(indexArg(abi::Batch), indexArg(abi::Heads));
  Value tiles = g.mul(blocks, heads);
  auto toIndex = [&](Value v) {
    return arith::IndexCastUIOp::create(b, b.getIndexType(), v);
  };
  Value first = toIndex(g.blockId(mlir::gpu::Dimension::x));
  Value programs = mlir::gpu::GridDimOp::create(b, mlir::gpu::Dimension::x);
  Value lo = first, hi = toIndex(tiles), step = programs, hasTable;
  // Word \p i (i32) of the schedule.
  auto word = [&](Value i) -> Value {
    Value at = LLVM::GEPOp::create(b, g.ptrGen, g.i32, scheduleArg,
                                   ArrayRef<LLVM::GEPArg>{i});
    return LLVM::LoadOp::create(b, g.i32, at);
  };
  if (place.scheduled) {
    hasTable = LLVM::ICmpOp::create(b, LLVM::ICmpPredicate::ne, scheduleArg,
                                    LLVM::ZeroOp::create(b, g.ptrGen));
    auto bounds = scf::IfOp::create(b, TypeRange{g.i32, g.i32, g.i32}, hasTable,
                                    /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(bounds.thenBlock());
      Value pid = toI32(first);
      scf::YieldOp::create(
          b, ValueRange{word(pid), word(g.add(pid, g.c32(1))), g.c32(1)});
      b.setInsertionPointToStart(bounds.elseBlock());
      scf::YieldOp::create(b, ValueRange{toI32(first), tiles, toI32(programs)});
    }
    lo = toIndex(bounds.getResult(0));
    hi = toIndex(bounds.getResult(1));
    step = toIndex(bounds.getResult(2));
  }
  SmallVector<Value, 2> zeros(ringLead.size(), g.c32(0));
  auto loop = scf::ForOp::create(b, lo, hi, step, zeros);
  Block *tileBody = loop.getBody();
  if (!tileBody->empty() && isa<scf::YieldOp>(tileBody->back()))
    tileBody->back().erase();
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(tileBody);
  ringBase.assign(loop.getRegionIterArgs().begin(),
                  loop.getRegionIterArgs().end());

  // Unmasked: pid_bh = w / blocks, pid_m = w % blocks (the programs side
  // by side share K and V). Causal: the heaviest Q blocks of every head
  // first, pid_m = blocks - 1 - w / (batch * heads), pid_bh = w % that: a
  // program's n-th tile is then about as heavy as any other's (with
  // pid_m fastest, gridDim.x near a multiple of blocks gives some
  // programs only heavy tiles: T14, causal 536 -> 340 TFLOP/s).
  Value n = toI32(loop.getInductionVar());
  // The program's n-th tile: (n - lo) / step.
  tileParity = g.andI(g.divU(g.sub(n, toI32(lo)), toI32(step)), g.c32(1));
  Value w = n;
  if (place.scheduled) {
    auto pick = scf::IfOp::create(b, TypeRange{g.i32}, hasTable,
                                  /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(pick.thenBlock());
      scf::YieldOp::create(
          b, ValueRange{word(g.add(g.add(toI32(programs), g.c32(1)), n))});
      b.setInsertionPointToStart(pick.elseBlock());
      scf::YieldOp::create(b, ValueRange{n});
    }
    w = pick.getResult(0);
  }
  Value pidM, pidBH;
  if (place.reversePidM) {
    pidM = g.sub(g.sub(blocks, g.c32(1)), g.divU(w, heads));
    pidBH = g.remU(w, heads);
  } else {
    pidM = g.remU(w, blocks);
    pidBH = g.divU(w, blocks);
  }
  if (place.scheduled) { // a schedule's tiles: w = pid_bh * blocks + pid_m
    pidM = g.select(hasTable, g.remU(w, blocks), pidM);
    pidBH = g.select(hasTable, g.divU(w, blocks), pidBH);
  }
  const int pidArg = place.numBuffers + place.numIndexArgs + place.numF32Args;
  map.map(fn.getArgument(pidArg), toIndex(pidM));
  map.map(fn.getArgument(pidArg + 1), toIndex(pidBH));

  // Loop-variant lane bases and thread index, as every lowered loop's.
  LoopLanes outer = enterLoop();
  LogicalResult lowered = lowerTile();
  leaveLoop(std::move(outer));
  if (failed(lowered))
    return failure();

  // Each stream's positions go on after this tile's: its loads before
  // and after the ring loop and the loop's trips (0 when it is empty).
  Value trips = ringTrips();
  SmallVector<Value, 2> next;
  for (auto [stream, base] : llvm::enumerate(ringBase))
    next.push_back(
        g.add(base, g.add(trips, g.c32(ringLead[stream] + ringTail[stream]))));
  scf::YieldOp::create(b, next);
  ringBase.clear();
  return success();
}
