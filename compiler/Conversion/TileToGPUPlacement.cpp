//===- TileToGPUPlacement.cpp - What each role fixes before lowering ------===//
//
/// \file
/// The placements of the tile lowering (TileToGPU.h, KernelPlacement): what
/// the function's role in `#attn.kernel` and its tiling fix before any op
/// is lowered, as kernels/GpuGeometry.h gives the launcher:
///   - "forward": Br rows per program, the warps split them; V-wide tiles
///     split over grid.z past 256 columns;
///   - "main" (the dK/dV kernel): Bc keys per program, the warps split them
///     (warpgroup MMAs for the shapes that allow them on sm_90a; else, with
///     Br = 64 and atomic dQ, the 2-D warp grid of two column parts); dK and
///     dV split over grid.z when both do not fit one program;
///   - "dq" (the separate dQ pass): its own tiles (dqPassTiles);
///   - "preprocess", "dq_convert", "capture_convert": row kernels
///     (TileToGPURows.cpp);
///   - "forward_split": as "forward", over the split ABI with pid_split on
///     grid.z; "combine": a row kernel over it (kernels/KernelABI.h);
///   - "mask_blocks", "mask_blocks_list": a mask_mod's block classes and
///     their lists, row kernels of a warp per KV or Q block (abi::blocks).
/// And the kernel's arguments that follow from it: the ABI's groups, then
/// a score modifier's captured tensors (and, in the backward, their
/// gradient buffers) as pointer parameters after the f32 group.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/KernelEmitters.h"
#include "compiler/Conversion/TileToGPU.h"
#include "kernels/KernelABI.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// The function's tiling (its `#attn.kernel`) with the pass's warps.
static TileConfig tilingOf(attn::KernelAttr attr, int64_t warps) {
  TileConfig config;
  config.blockM = attr.getBlockM();
  config.blockN = attr.getBlockN();
  config.warps = warps;
  return config;
}

/// Sets \p p's numCaptures and numCaptureSizes from the arguments of \p fn
/// after its pids (\p p's ABI groups): a score modifier's captured tensors
/// (TileAttention.cpp puts them last) and, in a backward with deterministic
/// captured gradients, their accumulators, then their sizes (the index
/// arguments at the end), which checkPlacedArguments checks.
static void placeCaptures(func::FuncOp fn, KernelPlacement &p) {
  int all = std::max(0, int(fn.getNumArguments()) - p.firstCaptureArg());
  int sizes = 0;
  while (sizes < all &&
         fn.getArgument(fn.getNumArguments() - 1 - sizes).getType().isIndex())
    ++sizes;
  p.numCaptures = all - sizes;
  p.numCaptureSizes = sizes;
}

/// The forward's placement: gpuGeometry's threads, m-tiles, shared memory
/// and grid.z split of V's columns; the products on warpgroup MMAs where
/// \p wgmma (sm_90a) and the shape allow them (one warpgroup per 64 rows);
/// with the K/V ring, its consumers' turns by \p pingPong.
static KernelPlacement forwardPlacement(const AttentionSpec &spec,
                                        const TileConfig &config, bool wgmma,
                                        bool kvRing, int64_t pingPong,
                                        bool persistent, int64_t tma) {
  GpuGeometry geo = gpuGeometry(spec, config, wgmma && kvRing);
  KernelPlacement p;
  p.threads = 32 * config.warps;
  p.regRows = config.blockM;
  p.gridRows = config.blockM;
  p.mt = geo.mTiles;
  p.maxShared = geo.sharedBytes;
  if (geo.dvChunks > 1)
    p.splits.push_back({spec.headDimV, geo.dvChunk, geo.dvChunks});
  p.numBuffers = abi::NumBuffers;
  p.numIndexArgs = abi::NumIndexArgs;
  p.numF32Args = 1;
  p.reversePidM = spec.mask == MaskKind::Causal;
  p.wgmma = wgmma && geo.wgmmaShape;
  p.ringStages = geo.ringStages;
  if (p.ringStages) {
    p.producerThreads = GpuGeometry::kRingProducerThreads;
    p.treeReductions = true;
    p.pingPong = pingPong;
    p.persistent = persistent;
    p.scheduled = persistent && p.reversePidM;
    p.tma = tma;
    // Q by its tensor map: O gets a staging slot of its own where it fits.
    if (tma >= 2) {
      p.outputStagingBytes = queryMapOutputSlotBytes(geo, config);
      p.maxShared = queryMapSharedBytes(geo, config);
    }
  }
  return p;
}

// The kernel's arguments: the ABI's groups and the captured tensors.

LogicalResult conversion::checkPlacedArguments(func::FuncOp fn,
                                               const KernelPlacement &place) {
  const int firstIndex = place.numBuffers;
  const int firstF32 = firstIndex + place.numIndexArgs;
  const int pidArg = firstF32 + place.numF32Args;
  const int firstCapture = place.firstCaptureArg();
  const int firstSize = firstCapture + place.numCaptures;
  const int all = firstSize + place.numCaptureSizes;
  if (fn.getNumArguments() != unsigned(all))
    return fn.emitError() << "this kernel takes " << all
                          << " arguments (kernels/KernelABI.h), got "
                          << fn.getNumArguments();
  Builder b(fn.getContext());
  Type captured = MemRefType::get({ShapedType::kDynamic}, b.getF32Type());
  Type words = MemRefType::get({ShapedType::kDynamic}, b.getI64Type());
  for (int i = 0; i < all; ++i) {
    Type want = i < firstIndex   ? Type()
                : i >= firstSize ? Type(b.getIndexType())
                : i >= firstCapture
                    ? captured
                    : (i < firstF32 || i >= pidArg ? Type(b.getIndexType())
                                                   : Type(b.getF32Type()));
    Type got = fn.getArgument(i).getType();
    // The accumulators of deterministic captured gradients are i64.
    bool ok = want ? got == want || (want == captured && got == words)
                   : isa<MemRefType>(got);
    if (!ok)
      return fn.emitError()
             << "argument " << i << " has type " << got << ", not the ABI's";
  }
  return success();
}

mlir::gpu::GPUFuncOp
conversion::createPlacedKernel(ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                               mlir::gpu::GPUModuleOp gpuModule,
                               func::FuncOp fn, const KernelPlacement &place,
                               int64_t sharedBytes) {
  SmallVector<Type> argTys(place.numBuffers, g.ptrGen);
  argTys.append(place.numIndexArgs, g.i64);
  argTys.append(place.numF32Args, g.f32);
  argTys.append(place.numCaptures, g.ptrGen);
  argTys.append(place.numCaptureSizes, g.i64);
  int64_t programsZ = place.gridZ;
  for (const KernelPlacement::ColumnSplit &s : place.splits)
    programsZ += s.chunks;
  return createKernelFunc(
      b, gpuModule, fn, argTys, place.threads + place.producerThreads,
      sharedBytes,
      gridAttr(b, place.gridRows, place.gridOverKeys, place.gridKvHeads,
               std::max<int64_t>(programsZ, 1), place.gridSplits,
               place.persistent, place.scheduled));
}

void conversion::mapPlacedArguments(ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                                    func::FuncOp fn,
                                    mlir::gpu::GPUFuncOp kernel,
                                    const KernelPlacement &place,
                                    IRMapping &map) {
  const int firstIndex = place.numBuffers;
  const int firstF32 = firstIndex + place.numIndexArgs;
  const int pidArg = firstF32 + place.numF32Args;
  for (int i = 0; i < firstIndex; ++i)
    map.map(fn.getArgument(i), kernel.getArgument(i));
  for (int i = firstIndex; i < firstF32; ++i)
    map.map(fn.getArgument(i), arith::IndexCastOp::create(
                                   b, b.getIndexType(), kernel.getArgument(i)));
  for (int i = firstF32; i < pidArg; ++i)
    map.map(fn.getArgument(i), kernel.getArgument(i));
  // The captured tensors: after the pids in fn, after the f32s here.
  for (int c = 0; c < place.numCaptures; ++c)
    map.map(fn.getArgument(place.firstCaptureArg() + c),
            kernel.getArgument(pidArg + c));
  for (int c = 0; c < place.numCaptureSizes; ++c) {
    const int at = place.numCaptures + c;
    map.map(fn.getArgument(place.firstCaptureArg() + at),
            arith::IndexCastOp::create(b, b.getIndexType(),
                                       kernel.getArgument(pidArg + at)));
  }
  // A persistent kernel maps pid_m and pid_bh per tile (forEachTile).
  if (place.persistent)
    return;
  Value pidM = g.blockId(mlir::gpu::Dimension::x);
  if (place.reversePidM) {
    // Heaviest Q blocks (the last rows see the most keys) start first, so
    // the last wave of the grid is made of short blocks.
    Value blocks = arith::IndexCastUIOp::create(
        b, g.i32, mlir::gpu::GridDimOp::create(b, mlir::gpu::Dimension::x));
    pidM = g.sub(g.sub(blocks, g.c32(1)), pidM);
  }
  // pid_m, pid_bh = grid.y and (split-KV) pid_split = grid.z.
  SmallVector<Value, 3> pids = {pidM, g.blockId(mlir::gpu::Dimension::y)};
  if (place.kvSplit)
    pids.push_back(g.blockId(mlir::gpu::Dimension::z));
  for (auto [i, pid] : llvm::enumerate(pids))
    map.map(fn.getArgument(pidArg + i),
            arith::IndexCastUIOp::create(b, b.getIndexType(), pid));
}

LogicalResult flashjit::conversion::lowerTileKernel(
    func::FuncOp fn, mlir::gpu::GPUModuleOp gpuModule, int64_t warps,
    const GpuLoweringConfig &knobs) {
  const int64_t copyBytes = knobs.copyBytes;
  const bool wgmma = knobs.wgmma;
  const int64_t ringStages = knobs.kvRingStages;
  auto attr = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
  AttentionSpec spec = specFromAttr(attr);
  TileConfig config = tilingOf(attr, warps);
  if (attr.getRole() == "combine") {
    // The split-KV merge: a row kernel over the split ABI.
    KernelPlacement p;
    p.numBuffers = abi::split::NumBuffers;
    p.numIndexArgs = abi::split::NumIndexArgs;
    p.numF32Args = 1;
    p.kvSplit = true;
    placeCaptures(fn, p);
    p.threads = GpuBackwardGeometry::kPreprocessThreads;
    p.gridRows = abi::bwd::kRowBlockRows;
    // Its column chunks on grid.z (the program picks its own by pid_split).
    p.gridZ = abi::split::combineChunks(spec.headDimV);
    return lowerRowKernel(fn, gpuModule, spec, p);
  }
  if (attr.getRole() == "mask_blocks" || attr.getRole() == "mask_blocks_list") {
    // A mask_mod's block classification and its lists: row kernels over the
    // forward's arguments, a warp per KV block (the classes) or per sparse
    // Q block (the lists); grid.x is the launch's program count
    // (MaskBlocksLaunch), so the recorded rows are 1.
    KernelPlacement p;
    p.numBuffers = abi::NumBuffers;
    p.numIndexArgs = abi::NumIndexArgs;
    p.numF32Args = 1;
    placeCaptures(fn, p);
    p.threads = 32 * abi::blocks::kRows;
    p.gridRows = 1;
    return lowerRowKernel(fn, gpuModule, spec, p);
  }
  const bool kvRing = wgmma && ringStages >= 2;
  if (kvRing)
    config.stages = ringStages;
  if (failed(checkGpuOptions(fn, spec, config, copyBytes, kvRing)))
    return failure();
  if (knobs.pingPong < 0 || knobs.pingPong > 3)
    return fn.emitError() << "ping-pong must be 0, 1, 2 or 3, got "
                          << knobs.pingPong;
  KernelPlacement p =
      forwardPlacement(spec, config, wgmma, kvRing, knobs.pingPong,
                       knobs.persistent, copyBytes == 16 ? knobs.tma : 0);
  p.stagedStores = knobs.stagedStores;
  p.exp2Emulation = knobs.exp2Emulation;
  p.tanhPolynomial = knobs.tanhPolynomial;
  if (attr.getRole() == "forward_split") {
    // The split partial: the split ABI, pid_split on grid.z (so no
    // column split there), GQA-packed rows over the KV heads.
    if (!p.splits.empty())
      return fn.emitError() << "split-KV takes head_dim_v up to 256 on the "
                               "GPU (grid.z holds the splits), got "
                            << spec.headDimV;
    p.numBuffers = abi::split::NumBuffers;
    p.numIndexArgs = abi::split::NumIndexArgs;
    p.kvSplit = p.gridSplits = true;
    p.gridKvHeads = abi::split::packsGqa(spec);
    p.persistent = false; // its grid.z is the splits'; one pass each
    p.tma = 0;            // its tensor maps would need the split ABI's
  }
  placeCaptures(fn, p);
  ImplicitLocOpBuilder b(fn.getLoc(), fn.getContext());
  return TileKernelLowering(b, fn, spec, config, copyBytes, p).run(gpuModule);
}

/// The backward ring's consumers' registers (setmaxnreg): the dK/dV
/// kernel on two warpgroups took 234-241 without a producer (ptxas, T26);
/// 2 x 240 + the producer's 24 fill the launch's 3 x 168 (T27 gave the
/// producer 32, counting the SM's 65,536: setmaxnreg.inc never returned).
static constexpr int64_t kBackwardRingConsumerRegisters = 240;

/// Whether a loop of \p fn holds another (GQA's loop over the group's
/// heads inside the loop over the query blocks): the ring takes a loop of
/// the function's body with no loop inside.
static bool hasNestedLoop(func::FuncOp fn) {
  return fn
      .walk([](scf::ForOp loop) {
        return loop->getParentOfType<scf::ForOp>() ? WalkResult::interrupt()
                                                   : WalkResult::advance();
      })
      .wasInterrupted();
}

LogicalResult flashjit::conversion::lowerTileBackwardKernel(
    func::FuncOp fn, mlir::gpu::GPUModuleOp gpuModule, int64_t warps,
    const GpuLoweringConfig &knobs) {
  const int64_t copyBytes = knobs.copyBytes;
  const int64_t ringStages = knobs.bwdRingStages;
  auto attr = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
  AttentionSpec spec = specFromAttr(attr);
  TileConfig config = tilingOf(attr, warps);
  // The dK/dV kernel's tiles are the description's Br x Bc; the dQ pass
  // has its own (checked below), the row kernels need none.
  if (std::string p = gpuBackwardConfigProblem(spec, config, INT64_MAX);
      attr.getRole() == "main" && !p.empty())
    return fn.emitError() << p;
  KernelPlacement p;
  p.numBuffers = abi::bwd::NumBuffers;
  p.numIndexArgs = abi::bwd::NumIndexArgs;
  p.numF32Args = abi::bwd::NumF32Args;
  placeCaptures(fn, p);
  p.tanhPolynomial = knobs.tanhPolynomial;
  if (attr.getRole() == "preprocess" || attr.getRole() == "dq_convert" ||
      attr.getRole() == "capture_convert") {
    p.threads = GpuBackwardGeometry::kPreprocessThreads;
    // A captured gradient's conversion: grid.x is the launcher's program
    // count (abi::bwd::captureConvertPrograms), so the recorded rows are 1.
    p.gridRows =
        attr.getRole() == "capture_convert" ? 1 : abi::bwd::kRowBlockRows;
    return lowerRowKernel(fn, gpuModule, spec, p);
  }
  GpuBackwardGeometry geo = gpuBackwardGeometry(spec, config);
  p.threads = geo.threads;
  if (attr.getRole() == "dq") {
    // The function's own tiles are the dQ pass's (dqRows x dqKeys, which
    // the pipeline gives the tiling pass): one or two 16-row tiles per warp.
    p.regRows = config.blockM;
    p.gridRows = config.blockM;
    p.mt = config.blockM / (16 * warps);
    p.maxShared = kMaxSharedBytes;
    p.reversePidM = spec.mask == MaskKind::Causal;
    if (geo.dqChunks > 1)
      p.splits.push_back({spec.headDimQK, geo.dqChunk, geo.dqChunks});
    if (p.mt < 1 || config.blockM % (16 * warps) != 0)
      return fn.emitError() << "the dQ pass's warps split its " << config.blockM
                            << " rows in 16-row tiles: block_m must be a "
                               "multiple of 16 * warps = "
                            << 16 * warps;
    ImplicitLocOpBuilder b(fn.getLoc(), fn.getContext());
    return TileKernelLowering(b, fn, spec, config, copyBytes, p).run(gpuModule);
  }
  p.regRows = config.blockN;
  p.gridRows = config.blockN;
  p.gridOverKeys = p.gridKvHeads = true;
  p.mt = geo.keyTiles;
  p.maxShared = geo.kvSmem.total;
  p.vectorAtomics = knobs.vectorAtomics;
  // Warpgroup MMAs: one warpgroup per 64 keys, one 16-key tile per warp.
  p.wgmma = knobs.wgmma && geo.wgmmaShape;
  if (!geo.kvCombined)
    p.splits = {{spec.headDimQK, geo.dkChunk, geo.dkChunks},
                {spec.headDimV, geo.dvChunk, geo.dvChunks}};
  if (p.wgmma && knobs.bulkDq && geo.bulkDq)
    p.dqStageCols = geo.dqStageCols;
  // Two consumer warpgroups only: the split 24 + 2 x 240 is theirs (one
  // would leave its producer 272, past setmaxnreg's 256: ptxas refused
  // the 4-warp tilings, T28).
  if (p.wgmma && ringStages >= 2 && p.warpgroups() == 2 && !p.dqStageCols &&
      !hasNestedLoop(fn)) {
    // The Q/dO ring (TileToGPURing.cpp): a producer warpgroup copies each
    // step's Q and dO tiles; the consumers keep the registers they had
    // (240) and the producer takes what the launch leaves (24).
    p.ringStages = ringStages;
    p.producerThreads = GpuGeometry::kRingProducerThreads;
    p.ringConsumerRegisters = kBackwardRingConsumerRegisters;
    p.maxShared = kMaxSharedBytes;
    // Q and dO by their tensor maps where the forward's K and V would take
    // theirs (16-byte copies, the `tma` option): one producer thread, the
    // full barriers counting bytes (TileToGPUTma.cpp).
    p.tma = copyBytes == 16 && knobs.tma ? 1 : 0;
  }
  p.backwardAbi = true;
  p.splitCommits = p.wgmma && knobs.splitCommits;
  p.stagedStores = knobs.bwdStagedStores;
  // Three stages of the loop's own copies where asked (the default on
  // warpgroup MMAs since T41; the ring has its own stages) and where the
  // third stage fits the kernel's limit: the shared memory is the
  // limit's.
  if (p.wgmma && !p.ringStages && knobs.bwdStages == 3 &&
      geo.kvThreeStageBytes(p.dqStageCols > 0) <= kMaxSharedBytes) {
    p.bufferStages = 3;
    p.maxShared = kMaxSharedBytes;
  }
  if (p.wgmma) {
    p.mt = 1;
    batchReadyProducts(fn, /*transposedFirst=*/p.splitCommits);
  } else {
    p.colParts = geo.kvQuerySplit;
  }
  // One program for dK and dV on mma.sync, P and dS in registers (the
  // 2-D grid stages them behind a barrier anyway).
  p.orderRegisterProducts = !p.wgmma && p.colParts == 1 && geo.kvCombined;
  ImplicitLocOpBuilder b(fn.getLoc(), fn.getContext());
  return TileKernelLowering(b, fn, spec, config, copyBytes, p).run(gpuModule);
}
