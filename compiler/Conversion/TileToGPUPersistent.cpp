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
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

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
  SmallVector<Value, 2> zeros(ringLead.size(), g.c32(0));
  auto loop = scf::ForOp::create(b, first, toIndex(tiles), programs, zeros);
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
  Value w = toI32(loop.getInductionVar());
  // The program's n-th tile: (w - blockIdx.x) / gridDim.x.
  tileParity =
      g.andI(g.divU(g.sub(w, toI32(first)), toI32(programs)), g.c32(1));
  Value pidM, pidBH;
  if (place.reversePidM) {
    pidM = g.sub(g.sub(blocks, g.c32(1)), g.divU(w, heads));
    pidBH = g.remU(w, heads);
  } else {
    pidM = g.remU(w, blocks);
    pidBH = g.divU(w, blocks);
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
