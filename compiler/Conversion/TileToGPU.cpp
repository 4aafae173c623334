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
/// This file holds the analysis (where each tile lives, the shared-memory
/// slots), the walk that hands each op to its lowering, and the checks of
/// the result (no tile op and no tensor left).
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
                                       int64_t copyBytes)
    : b(b), g(b, spec.dtype == DType::BF16 ? gpu::Elem::BF16 : gpu::Elem::F16),
      fn(fn), spec(spec), config(config), copyBytes(copyBytes),
      geo(gpuGeometry(spec, config)), mt(geo.mTiles) {}

InFlightDiagnostic TileKernelLowering::fail(Operation *op, StringRef what) {
  return op->emitOpError() << "cannot be lowered to the GPU: " << what;
}

bool TileKernelLowering::splitsCols(RankedTensorType ty) const {
  return ty.getRank() == 2 && geo.dvChunks > 1 &&
         ty.getDimSize(1) == spec.headDimV;
}

int64_t TileKernelLowering::paddedCols(RankedTensorType ty) const {
  if (ty.getDimSize(1) == spec.headDimV)
    return geo.dvChunk;
  return roundUp(ty.getDimSize(1), 16);
}

int64_t TileKernelLowering::nTiles(RankedTensorType ty) const {
  return paddedCols(ty) / 8;
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

/// A tile.load whose every user is a tile.dot lives in a shared-memory slot
/// (the slots in program order, as kernels/GpuGeometry.h lays them out for
/// the launcher); every other tile lives in registers, whose rows must be
/// the program's Br.
LogicalResult TileKernelLowering::assignHomes() {
  WalkResult walk = fn.walk([&](Operation *op) -> WalkResult {
    for (Value v : op->getResults()) {
      if (!isTile(v))
        continue;
      RankedTensorType ty = tileType(v);
      auto load = dyn_cast<tile::LoadOp>(op);
      bool onlyDots = load && !v.use_empty() &&
                      llvm::all_of(v.getUsers(), [](Operation *u) {
                        return isa<tile::DotOp>(u);
                      });
      if (!onlyDots) {
        if (load)
          return fail(op, "a tile.load must feed only tile.dot (register "
                          "loads are not implemented yet)");
        if (ty.getDimSize(0) != config.blockM)
          return fail(op, "register tiles must have Br = ")
                 << config.blockM << " rows, got " << ty;
        homes[v] = TileHome::Registers;
        continue;
      }
      if (ty.getRank() != 2 || ty.getElementType() != g.halfTy)
        return fail(op, "a shared tile must be 2-D in the element type, got ")
               << ty;
      // Columns that become the product's columns (P V's V) follow the
      // product's split over grid.z; contracted columns are copied whole.
      bool feedsColumns = llvm::any_of(v.getUses(), [](OpOperand &use) {
        auto dot = cast<tile::DotOp>(use.getOwner());
        return use.getOperandNumber() == 1 && !dot.getTransposeRhs();
      });
      SharedSlot slot;
      slot.padCols =
          feedsColumns ? paddedCols(ty) : roundUp(ty.getDimSize(1), 16);
      slot.splitCols = feedsColumns && splitsCols(ty);
      slot.rowChunks = roundUp(slot.padCols / 8, 8);
      slot.offset = sharedBytes;
      sharedBytes += ty.getDimSize(0) * slot.rowChunks * 16;
      homes[v] = TileHome::Shared;
      slots[v] = slot;
    }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  if (sharedBytes > geo.sharedBytes)
    return fn.emitError() << "the tiles need " << sharedBytes
                          << " bytes of shared memory, more than the "
                          << geo.sharedBytes << " the launcher provides";
  return success();
}

/// Thread and lane indices, the O-column chunk, and each slot's ldmatrix
/// lane bases for the operand patterns its dots read it with.
void TileKernelLowering::setUpThreads() {
  tid = g.threadIdX();
  Value warp = g.divU(tid, g.c32(32));
  lane = g.remU(tid, g.c32(32));
  grp = g.divU(lane, g.c32(4));
  tig = g.remU(lane, g.c32(4));
  warpRow0 = g.mul(warp, g.c32(mt * 16));
  chunk = g.blockId(mlir::gpu::Dimension::z);
  for (auto &[v, slot] : slots) {
    SlotFrags &f = slotFrags[v];
    for (OpOperand &use : v.getUses()) {
      auto dot = cast<tile::DotOp>(use.getOwner());
      Value off = g.c32(slot.offset);
      if (use.getOperandNumber() == 0 && !f.a)
        f.a = gpu::fragmentAddresses(g, gpu::FragmentPattern::A, lane, warpRow0,
                                     off, slot.rowChunks);
      if (use.getOperandNumber() == 1 && dot.getTransposeRhs() && !f.b)
        f.b = gpu::fragmentAddresses(g, gpu::FragmentPattern::B, lane, g.c32(0),
                                     off, slot.rowChunks);
      if (use.getOperandNumber() == 1 && !dot.getTransposeRhs() && !f.bTrans)
        f.bTrans = gpu::fragmentAddresses(g, gpu::FragmentPattern::BTrans, lane,
                                          g.c32(0), off, slot.rowChunks);
    }
  }
}

LogicalResult TileKernelLowering::lowerBlock(Block &block) {
  for (Operation &op : block.without_terminator())
    if (failed(lowerOp(&op)))
      return failure();
  if (isa<func::ReturnOp>(block.getTerminator()))
    mlir::gpu::ReturnOp::create(b);
  return success();
}

/// Hands \p op to its family's lowering; scalar ops are cloned as they are.
LogicalResult TileKernelLowering::lowerOp(Operation *op) {
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
  if (isa<tile::AtomicAddOp>(op))
    return fail(op, "tile.atomic_add is not implemented on the GPU yet");
  if (isa<memref::LoadOp>(op))
    return lowerScalarLoad(op, map);
  bool touchesTiles =
      llvm::any_of(op->getOperands(), [&](Value v) { return isTile(v); }) ||
      llvm::any_of(op->getResults(), [&](Value v) { return isTile(v); });
  if (!touchesTiles) {
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
  if (failed(tile::verifyWritesOutput(fn)))
    return failure();
  const int64_t numArgs = abi::NumBuffers + abi::NumIndexArgs + 3;
  if (fn.getNumArguments() != unsigned(numArgs))
    return fn.emitError() << "a forward kernel takes " << numArgs
                          << " arguments (kernels/KernelABI.h), got "
                          << fn.getNumArguments();
  if (failed(assignHomes()))
    return failure();

  SmallVector<Type> argTys(abi::NumBuffers, g.ptrGen);
  argTys.append(abi::NumIndexArgs, g.i64);
  argTys.push_back(g.f32);
  for (int i = 0; i < numArgs - 2; ++i) {
    Type want = i < abi::NumBuffers ? Type()
                : i < abi::NumBuffers + abi::NumIndexArgs
                    ? Type(b.getIndexType())
                    : Type(g.f32);
    Type got = fn.getArgument(i).getType();
    if (want ? got != want : !isa<MemRefType>(got))
      return fn.emitError()
             << "argument " << i << " has type " << got << ", not the ABI's";
  }
  // The slots' own size: RecordedResourcesMatchTheLauncher checks that it
  // is the launcher's (GpuGeometry); assignHomes refuses more.
  auto kernel =
      createKernelFunc(b, gpuModule, fn, argTys, geo.threads, sharedBytes);
  b.setInsertionPointToStart(&kernel.getBody().front());
  smem = sharedMemoryBase(b, g);
  setUpThreads();

  for (int i = 0; i < abi::NumBuffers; ++i)
    map.map(fn.getArgument(i), kernel.getArgument(i));
  for (int i = 0; i < abi::NumIndexArgs; ++i)
    map.map(fn.getArgument(abi::NumBuffers + i),
            arith::IndexCastOp::create(
                b, b.getIndexType(), kernel.getArgument(abi::NumBuffers + i)));
  const int scaleArg = abi::NumBuffers + abi::NumIndexArgs;
  map.map(fn.getArgument(scaleArg), kernel.getArgument(scaleArg));
  Value pidM = g.blockId(mlir::gpu::Dimension::x);
  if (spec.mask == MaskKind::Causal) {
    // Heaviest Q blocks (the last rows see the most keys) start first, so
    // the last wave of the grid is made of short blocks.
    Value blocks = arith::IndexCastUIOp::create(
        b, g.i32, mlir::gpu::GridDimOp::create(b, mlir::gpu::Dimension::x));
    pidM = g.sub(g.sub(blocks, g.c32(1)), pidM);
  }
  Value pidBH = g.blockId(mlir::gpu::Dimension::y);
  map.map(fn.getArgument(scaleArg + 1),
          arith::IndexCastUIOp::create(b, b.getIndexType(), pidM));
  map.map(fn.getArgument(scaleArg + 2),
          arith::IndexCastUIOp::create(b, b.getIndexType(), pidBH));

  if (failed(lowerBlock(fn.getBody().front())))
    return failure();
  return checkPostconditions(kernel);
}

LogicalResult
flashjit::conversion::lowerTileKernel(func::FuncOp fn,
                                      mlir::gpu::GPUModuleOp gpuModule,
                                      int64_t warps, int64_t copyBytes) {
  auto attr = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
  AttentionSpec spec = specFromAttr(attr);
  TileConfig config;
  config.blockM = attr.getBlockM();
  config.blockN = attr.getBlockN();
  config.warps = warps;
  if (failed(checkGpuOptions(fn, spec, config, copyBytes)))
    return failure();
  ImplicitLocOpBuilder b(fn.getLoc(), fn.getContext());
  return TileKernelLowering(b, fn, spec, config, copyBytes).run(gpuModule);
}
