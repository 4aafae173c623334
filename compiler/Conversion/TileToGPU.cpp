//===- TileToGPU.cpp - The tile IR -> a tensor-core kernel: the driver ----===//
//
/// \file
/// Lowers a tiled forward function (tile dialect, role "forward") into one
/// gpu.func. Before:
///
///   func.func @attention(%q: memref<?xbf16>, ..., %scale_log2e: f32,
///       %pid_m: index, %pid_bh: index) attributes {attn.kernel = ...} {
///     %q = tile.load %Q[...] ...            // feeds only tile.dot: shared
///     scf.for ... iter_args(%o, %m, %l) { ... tile.dot ... }
///     tile.store ...
///   }
///
/// After:
///
///   gpu.func @attention(%q: !llvm.ptr, ..., %scale_log2e: f32) kernel
///       attributes {attn.shared_bytes = ..., known_block_size = ...} {
///     // pid_m = blockIdx.x (reversed for causal: heavy blocks first),
///     // pid_bh = blockIdx.y, the O-column chunk = blockIdx.z
///     // each op of the tile IR, lowered by its family's routine
///   }
///
/// This file holds the walk that hands each op to its lowering and the
/// checks of the result (no tile op and no tensor left); the analysis
/// before it (where each tile lives, the shared-memory slots) is
/// TileToGPUHomes.cpp.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "compiler/Conversion/KernelEmitters.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Interfaces/VectorInterfaces.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

TileKernelLowering::TileKernelLowering(ImplicitLocOpBuilder &b, func::FuncOp fn,
                                       const AttentionSpec &spec,
                                       const TileConfig &config,
                                       int64_t copyBytes,
                                       const KernelPlacement &place)
    : b(b), g(b, spec.dtype == DType::BF16 ? gpu::Elem::BF16 : gpu::Elem::F16),
      fn(fn), spec(spec), config(config), copyBytes(copyBytes), place(place),
      mt(place.mt) {}

InFlightDiagnostic TileKernelLowering::fail(Operation *op, StringRef what) {
  return op->emitOpError() << "cannot be lowered to the GPU: " << what;
}

const KernelPlacement::ColumnSplit *
TileKernelLowering::splitOf(RankedTensorType ty) const {
  for (const KernelPlacement::ColumnSplit &s : place.splits)
    if (ty.getRank() == 2 && s.chunks > 1 && ty.getDimSize(1) == s.width)
      return &s;
  return nullptr;
}

bool TileKernelLowering::splitsCols(RankedTensorType ty) const {
  return activeSplit && activeSplit->chunks > 1 && ty.getRank() == 2 &&
         ty.getDimSize(1) == activeSplit->width;
}

Value TileKernelLowering::colStart(RankedTensorType ty) {
  Value start = chunkStart(ty);
  if (place.colParts > 1 && ty.getRank() == 2)
    start = g.add(start, g.mul(colPart, g.c32(warpCols(ty))));
  return start;
}

int64_t TileKernelLowering::paddedCols(RankedTensorType ty) const {
  if (splitsCols(ty))
    return activeSplit->chunk;
  return roundUp(ty.getDimSize(1), 16);
}

int64_t TileKernelLowering::nTiles(RankedTensorType ty) const {
  return warpCols(ty) / 8;
}

int64_t TileKernelLowering::regCount(RankedTensorType ty) const {
  return ty.getRank() == 2 ? mt * nTiles(ty) * 4 : 2 * mt;
}

Value TileKernelLowering::toI32(Value index) {
  return arith::IndexCastOp::create(b, g.i32, index);
}
Value TileKernelLowering::toI64(Value index) {
  return arith::IndexCastOp::create(b, g.i64, index);
}

TileKernelLowering::LaneIndices TileKernelLowering::laneIndicesOf(Value t) {
  LaneIndices li;
  li.warp = g.divU(t, g.c32(32));
  li.lane = g.remU(t, g.c32(32));
  li.grp = g.divU(li.lane, g.c32(4));
  li.tig = g.remU(li.lane, g.c32(4));
  li.colPart = g.remU(li.warp, g.c32(place.colParts));
  li.warpRow0 = g.mul(
      place.colParts > 1 ? g.divU(li.warp, g.c32(place.colParts)) : li.warp,
      g.c32(mt * 16));
  return li;
}

TileKernelLowering::LaneIndices TileKernelLowering::laneIndices() {
  // Outside loops the same ops as setUpThreads', which CSE merges.
  return laneIndicesOf(copyTid ? copyTid : tid);
}

/// Thread and lane indices, the O-column chunk, and each slot's ldmatrix
/// lane bases for the operand patterns its dots read it with.
void TileKernelLowering::setUpThreads() {
  tid = g.threadIdX();
  LaneIndices li = laneIndicesOf(tid);
  Value warp = li.warp;
  lane = li.lane;
  grp = li.grp;
  tig = li.tig;
  colPart = li.colPart;
  warpRow0 = li.warpRow0;
  // grid.z: the O-column chunk, or (split-KV) the split, which has none.
  chunk = place.gridSplits ? g.c32(0) : g.blockId(mlir::gpu::Dimension::z);
  if (place.wgmma) {
    wg.emplace(g, smem);
    wgIdx = g.fromLane0(g.divU(warp, g.c32(4)));
  }
  for (auto &[v, slot] : slots) {
    if (homes.lookup(v) != TileHome::Shared)
      continue;
    SlotFrags &f = slotFrags[v];
    for (OpOperand &use : v.getUses()) {
      auto dot = cast<tile::DotOp>(use.getOwner());
      if (dot.getTransposeLhs())
        continue; // its own addresses: lowerTransposedProduct
      Value off = g.c32(slot.offset);
      if (use.getOperandNumber() == 0 && !f.a)
        f.a = gpu::fragmentAddresses(g, gpu::FragmentPattern::A, lane, warpRow0,
                                     off, slot.rowChunks);
      // The rows of a transposed rhs are the product's columns: the
      // warp's part of them.
      Value rows0 = place.colParts > 1
                        ? g.mul(colPart, g.c32(tileType(v).getDimSize(0) /
                                               place.colParts))
                        : g.c32(0);
      if (use.getOperandNumber() == 1 && dot.getTransposeRhs() && !f.b)
        f.b = gpu::fragmentAddresses(g, gpu::FragmentPattern::B, lane, rows0,
                                     off, slot.rowChunks);
      if (use.getOperandNumber() == 1 && !dot.getTransposeRhs() && !f.bTrans)
        f.bTrans = gpu::fragmentAddresses(g, gpu::FragmentPattern::BTrans, lane,
                                          g.c32(0), off, slot.rowChunks);
    }
  }
}

LogicalResult TileKernelLowering::lowerBlock(Block &block) {
  const bool outermost = isa<func::ReturnOp>(block.getTerminator());
  Operation *turnAt = unitTurnStart(block);
  for (Operation &op : block.without_terminator()) {
    bool light = false;
    if (wg) {
      // Warpgroup MMAs: a batch ends at the first op outside it; an op
      // that reads a product in flight waits for its commit group (and the
      // older ones), an op with regions for every group, but for a branch
      // of arithmetic alone.
      light = leavesInFlight(&op);
      if (!batchRun.contains(&op)) {
        settle(/*wait=*/op.getNumRegions() > 0 && !light);
        waitFor(&op);
      }
    }
    if (&op == turnAt) // the products issued and the first one's read
      waitTurn();
    bool outerLight = inLightBranch;
    inLightBranch = inLightBranch || light;
    LogicalResult r = lowerOp(&op);
    inLightBranch = outerLight;
    if (failed(r))
      return failure();
  }
  if (turnAt) {
    if (wg)
      settle(/*wait=*/false); // its last batch committed before the hand-over
    passTurn();
  }
  if (wg)
    settle(/*wait=*/!inLightBranch);
  if (outermost && branch < 0 && !inRoleBranch)
    returnFromKernel();
  return success();
}

void TileKernelLowering::returnFromKernel() {
  // Bulk reductions read shared memory and write global memory after their
  // thread moved on: done before the block's memory is released.
  if (bulkReductions)
    g.bulkWait(0, /*read=*/false);
  mlir::gpu::ReturnOp::create(b);
}

/// The K/V ring's consumers (the overlapped loop's P V in flight), and a
/// kernel with split commits (dP^T in flight under P's exponentials), keep
/// their products in flight across an scf.if of arithmetic alone (the
/// mask), waiting only for those it reads (the next block's S).
bool TileKernelLowering::leavesInFlight(Operation *op) {
  if (!(place.ringStages || place.splitCommits) || !isa<scf::IfOp>(op) ||
      inFlight.empty())
    return false;
  WalkResult walk = op->walk([](Operation *inner) {
    return isa<tile::DotOp, tile::LoadOp, tile::StoreOp, tile::AtomicAddOp,
               scf::ForOp>(inner)
               ? WalkResult::interrupt()
               : WalkResult::advance();
  });
  return !walk.wasInterrupted();
}

bool TileKernelLowering::otherBranchOutput(Operation *op) {
  if (branch < 0)
    return false;
  if (isa<tile::AtomicAddOp, tile::ScatterAddOp>(op))
    return branch == 1; // dQ and captured gradients: the dK programs'
  auto store = dyn_cast<tile::StoreOp>(op);
  return store && store.getBase() ==
                      fn.getArgument(branch ? abi::bwd::DK : abi::bwd::DV);
}

void TileKernelLowering::markLive() {
  live.clear();
  SmallVector<Value> work;
  fn.walk([&](Operation *op) {
    if (isa<tile::StoreOp, tile::AtomicAddOp, tile::ScatterAddOp>(op) &&
        !otherBranchOutput(op))
      work.append(op->getOperands().begin(), op->getOperands().end());
  });
  while (!work.empty()) {
    Value v = work.pop_back_val();
    if (!live.insert(v).second)
      continue;
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      // A loop's carried value: its start and what each iteration yields.
      if (auto loop = dyn_cast<scf::ForOp>(arg.getOwner()->getParentOp());
          loop && arg.getArgNumber() > 0) {
        unsigned i = arg.getArgNumber() - 1;
        work.push_back(loop.getInitArgs()[i]);
        work.push_back(loop.getBody()->getTerminator()->getOperand(i));
      }
      continue;
    }
    Operation *def = v.getDefiningOp();
    if (auto loop = dyn_cast<scf::ForOp>(def)) {
      unsigned i = cast<OpResult>(v).getResultNumber();
      work.push_back(loop.getRegionIterArgs()[i]);
      continue;
    }
    if (auto ifOp = dyn_cast<scf::IfOp>(def)) {
      unsigned i = cast<OpResult>(v).getResultNumber();
      work.push_back(ifOp.thenYield().getOperand(i));
      work.push_back(ifOp.elseYield().getOperand(i));
      continue;
    }
    work.append(def->getOperands().begin(), def->getOperands().end());
  }
}

/// Hands \p op to its family's lowering; scalar ops are cloned as they are.
LogicalResult TileKernelLowering::lowerOp(Operation *op) {
  if (constantOps.contains(op))
    return success(); // written at the kernel's start (fillSharedConstants)
  if (branch >= 0 && op->getNumRegions() == 0 && op->getNumResults() > 0 &&
      llvm::all_of(op->getResults(),
                   [&](Value v) { return isTile(v) && !live.contains(v); })) {
    // Not needed by this branch's outputs: zeros, which the loops that
    // carry them fold away.
    for (Value v : op->getResults())
      frags[v].regs.assign(regCount(tileType(v)), g.cf(0.0));
    return success();
  }
  if (auto l = dyn_cast<tile::LoadOp>(op))
    return lowerLoad(l);
  if (auto s = dyn_cast<tile::StoreOp>(op))
    return lowerStore(s);
  if (auto d = dyn_cast<tile::DotOp>(op))
    return lowerDot(d);
  if (auto r = dyn_cast<tile::ReduceOp>(op))
    return lowerReduce(r);
  if (auto bc = dyn_cast<tile::BroadcastOp>(op))
    return lowerBroadcast(bc);
  if (auto s = dyn_cast<tile::SplatOp>(op))
    return lowerSplat(s);
  if (auto i = dyn_cast<tile::IotaOp>(op))
    return lowerIota(i);
  if (auto f = dyn_cast<scf::ForOp>(op))
    return lowerFor(f);
  if (auto i = dyn_cast<scf::IfOp>(op))
    return lowerIf(i);
  if (auto atomic = dyn_cast<tile::AtomicAddOp>(op)) {
    auto dot = atomic.getValue().getDefiningOp<tile::DotOp>();
    if (!dot || !dot.getTransposeLhs())
      return fail(op, "a tile.atomic_add is lowered only with the transposed "
                      "product it reduces");
    if (otherBranchOutput(op))
      return success();
    return lowerTransposedProduct(dot);
  }
  if (isa<memref::LoadOp>(op))
    return lowerScalarLoad(op, map);
  if (auto gather = dyn_cast<tile::GatherOp>(op))
    return lowerGather(gather);
  if (auto scatter = dyn_cast<tile::ScatterAddOp>(op))
    return otherBranchOutput(op) ? success() : lowerScatterAdd(scatter);
  if (!touchesTiles(op)) {
    if (op->getNumRegions() ||
        op->getDialect() ==
            g.b.getContext()->getLoadedDialect<tile::TileDialect>())
      return fail(op, "no GPU lowering for this op");
    for (Value v : op->getOperands())
      if (isa<MemRefType>(v.getType()))
        return fail(op, "a buffer may only be read by memref.load or the "
                        "tile ops");
    return cloneScalar(op);
  }
  if (isa<arith::ConstantOp>(op))
    return lowerConstant(op);
  if (isa<arith::TruncFOp, arith::ExtFOp>(op))
    return lowerRounding(op);
  if (op->hasTrait<OpTrait::Elementwise>())
    return lowerElementwise(op);
  return fail(op, "no GPU lowering for this op on tiles");
}

LogicalResult TileKernelLowering::cloneScalar(Operation *op) {
  b.clone(*op, map);
  return success();
}

/// After lowering: the kernel holds no tile op and no tensor.
LogicalResult
TileKernelLowering::checkPostconditions(mlir::gpu::GPUFuncOp kernel) {
  auto *tileDialect = b.getContext()->getLoadedDialect<tile::TileDialect>();
  WalkResult walk = kernel.walk([&](Operation *op) {
    bool tensors = llvm::any_of(op->getResultTypes(),
                                [](Type t) { return isa<TensorType>(t); }) ||
                   llvm::any_of(op->getOperandTypes(),
                                [](Type t) { return isa<TensorType>(t); });
    if (op->getDialect() == tileDialect || tensors) {
      op->emitOpError() << "left in the GPU kernel by the tile lowering";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

LogicalResult TileKernelLowering::run(mlir::gpu::GPUModuleOp gpuModule) {
  if (failed(tile::verifyWritesOutput(fn)) ||
      failed(checkPlacedArguments(fn, place)) || failed(assignHomes()))
    return failure();
  // Running sums that start before their loop are per lane from the start.
  fn.walk([&](scf::ForOp loop) { deferRunningSums(loop); });
  // The slots' own size: RecordedResourcesMatchTheLauncher checks that it
  // is the launcher's (GpuGeometry); assignHomes refuses more.
  mlir::gpu::GPUFuncOp kernel =
      createPlacedKernel(b, g, gpuModule, fn, place, sharedBytes);
  if (place.scheduled) { // the tile schedule, before the tensor maps
    const unsigned at = kernel.getNumArguments();
    (void)kernel.insertArgument(at, g.ptrGen, DictionaryAttr(),
                                kernel.getLoc());
    scheduleArg = kernel.getArgument(at);
  }
  if (!ringMaps.empty() || outputMap) // the last (MarkGridConstants)
    addTensorMapArguments(kernel);
  b.setInsertionPointToStart(&kernel.getBody().front());
  smem = sharedMemoryBase(b, g);
  setUpThreads();
  mapPlacedArguments(b, g, fn, kernel, place, map);
  fillSharedConstants();

  Block &body = fn.getBody().front();
  if (place.splits.size() == 2) {
    // The dK/dV kernel's programs: grid.z < dK's chunks take a chunk of dK
    // (and dQ), the others one of dV; each branch lowers the whole body,
    // and what does not reach its outputs is dead code.
    const KernelPlacement::ColumnSplit &k = place.splits[0],
                                       &v = place.splits[1];
    auto ifOp = scf::IfOp::create(
        b, g.cmp(arith::CmpIPredicate::ult, chunk, g.c32(k.chunks)),
        /*withElseRegion=*/true);
    for (int which = 0; which < 2; ++which) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(
          (which ? ifOp.elseBlock() : ifOp.thenBlock())->getTerminator());
      branch = which;
      activeSplit = &place.splits[which];
      splitStart = which ? g.mul(g.sub(chunk, g.c32(k.chunks)), g.c32(v.chunk))
                         : g.mul(chunk, g.c32(k.chunk));
      markLive();
      if (failed(lowerBlock(body)))
        return failure();
    }
    branch = -1;
    returnFromKernel();
    return checkPostconditions(kernel);
  }
  if (!place.splits.empty()) {
    activeSplit = &place.splits[0];
    splitStart = g.mul(chunk, g.c32(activeSplit->chunk));
  }
  if (place.ringStages) {
    if (!ringLoop)
      return fn.emitError() << "the K/V ring needs a loop with shared loads";
    // setmaxnreg (lowerRingRoles) needs the count at entry fixed: with the
    // block size, one block per SM (.minnctapersm 1), else ptxas ignores it.
    if (ringMovesRegisters)
      kernel->setAttr("nvvm.minctasm", b.getI32IntegerAttr(1));
    if (failed(lowerRingRoles(body)))
      return failure();
    return checkPostconditions(kernel);
  }
  if (failed(lowerBlock(body)))
    return failure();
  return checkPostconditions(kernel);
}
