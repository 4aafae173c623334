//===- TileToGPUTma.cpp - The K/V ring's copies by tensor maps ------------===//
//
/// \file
/// The tensor memory accelerator on the K/V ring (KernelPlacement::tma, the
/// `tma` pass option): instead of the producer warpgroup's 128 threads each
/// issuing cp.async copies of 16 bytes, one thread asks the TMA for a whole
/// box of the tile per 64-column block, and the stage's full barrier counts
/// the bytes. The tile IR is the same; a ring load takes this path when its
/// address is a tensor map's, that is when its offset is a sum of indices
/// times stride arguments of the kernel and its rows and row stride are
/// arguments too. Before (a ring load of the producer's loop, d = 128):
///
///   %off = arith.addi (arith.muli %b, %k_sb), (arith.muli %h, %k_sh)
///   %k = tile.load %K[%off] rows %n0 of %seq_kv stride %k_sn
///       : memref<?xbf16> -> tensor<64x128xbf16>
///
/// After (thread 0 of the producer; the kernel takes the tensor map as a
/// `__grid_constant__` parameter after the ABI's, recorded for the launcher
/// as attn.tensor_maps = [{tensor = "k", rows = "seq_kv", row_stride =
/// "k_sn", outer = ["k_sb", "k_sh"], cols = 128, box = [64, 64]}]):
///
///   mbarrier.wait empty K[s], p ^ 1
///   mbarrier.arrive.expect_tx full K[s], 16384     // 64 rows x 128 x 2
///   cp.async.bulk.tensor.4d [stage s + 0], [%kmap, {0, n0, h, b}], [full K[s]]
///   cp.async.bulk.tensor.4d [stage s + 8192], [%kmap, {64, n0, h, b}], ...
///
/// The box is 64 columns (128 bytes: the 128B swizzle's span) by the tile's
/// rows, so each block lands in the blocked layout that wgmma reads
/// (Wgmma.h). Rows past seq_kv and columns past the head dim are zeros (the
/// map's bounds), as cp.async's zero-fill gives. The consumers wait on the
/// same full barriers; the copies and wgmma are both the async proxy, so no
/// proxy fence is needed after the wait.
///
/// Q (KernelPlacement::tma >= 2): the body's one other shared load, read
/// by the ring loop's products alone, takes a map too (its rows seq_q, its
/// boxes Br rows), copied by the same thread before the K/V stages on two
/// barriers of its own. Before and after, consumers' side:
///
///   %q = tile.load %Q[%qoff] rows %m0 of %seq_q stride %q_sn ...
///   %r:3 = scf.for ... { ... tile.dot %q, %k ... }
///
///   producer: mbarrier.wait empty Q, tile parity ^ 1
///             mbarrier.arrive.expect_tx full Q, 32768   // 128 x 128 x 2
///             cp.async.bulk.tensor.4d [Q slot + 0], [%qmap, {0, m0, b, h}]
///             cp.async.bulk.tensor.4d [Q slot + 16384], [%qmap, {64, ...}]
///   consumers: mbarrier.wait full Q, tile parity        // before the loop
///             scf.for ... { ... }
///             mbarrier.arrive empty Q                   // its products done
///
/// O (KernelPlacement::tma == 3, FLASHJIT_TMA=qkvo; opt-in): where Q comes
/// by its map and O stages through a slot of its own (outputSlot), O's
/// store takes a map too, written by each warp's lane 0 from the slot
/// (storeByTensorMap, below).
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Pass/Pass.h"

namespace flashjit::conversion {
#define GEN_PASS_DEF_MARKGRIDCONSTANTS
#include "compiler/Conversion/Passes.h.inc"
} // namespace flashjit::conversion

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// The kernel attribute that records the tensor maps, its last arguments.
static constexpr const char *kTensorMapsAttr = "attn.tensor_maps";

/// Columns per box: 128 bytes of 16-bit elements, the swizzle's span.
static constexpr int64_t kBoxCols = 64;
/// The most rows a box has (the TMA's limit per dimension).
static constexpr int64_t kMaxBoxRows = 256;
/// Bytes of a CUtensorMap (the driver's opaque descriptor) and its
/// alignment.
static constexpr int64_t kTensorMapBytes = 128, kTensorMapAlign = 64;

/// The index argument (abi::IndexArg) that \p v is, or -1.
static int indexArgument(Value v, func::FuncOp fn, const KernelPlacement &p) {
  auto arg = dyn_cast<BlockArgument>(v);
  if (!arg || arg.getOwner() != &fn.getBody().front())
    return -1;
  const int i = int(arg.getArgNumber()) - p.numBuffers;
  return i >= 0 && i < p.numIndexArgs ? i : -1;
}

/// Splits \p offset into terms (index, stride argument) whose products add
/// up to it; false if it is not such a sum.
static bool offsetTerms(Value offset, func::FuncOp fn, const KernelPlacement &p,
                        SmallVector<std::pair<Value, int>> &terms) {
  if (matchPattern(offset, m_Zero()))
    return true;
  if (auto add = offset.getDefiningOp<arith::AddIOp>())
    return offsetTerms(add.getLhs(), fn, p, terms) &&
           offsetTerms(add.getRhs(), fn, p, terms);
  if (auto mul = offset.getDefiningOp<arith::MulIOp>()) {
    for (auto [index, stride] : {std::pair(mul.getLhs(), mul.getRhs()),
                                 std::pair(mul.getRhs(), mul.getLhs())})
      if (int s = indexArgument(stride, fn, p); s >= 0) {
        terms.push_back({index, s});
        return true;
      }
  }
  return false;
}

std::optional<TileKernelLowering::RingTensorMap>
TileKernelLowering::tensorMapAt(Value baseValue, Value offset, Value rows,
                                Value stride, RankedTensorType ty) {
  auto base = dyn_cast<BlockArgument>(baseValue);
  SmallVector<std::pair<Value, int>> terms;
  RingTensorMap m;
  m.record.rows = indexArgument(rows, fn, place);
  m.record.rowStride = stride ? indexArgument(stride, fn, place) : -1;
  if (!base || base.getOwner() != &fn.getBody().front() ||
      base.getArgNumber() >= unsigned(place.numBuffers) || ty.getRank() != 2 ||
      ty.getElementTypeBitWidth() != 16 || m.record.rows < 0 ||
      m.record.rowStride < 0 || !offsetTerms(offset, fn, place, terms) ||
      terms.size() > 3)
    return std::nullopt;
  m.record.buffer = int(base.getArgNumber());
  m.record.cols = ty.getDimSize(1);
  m.record.boxCols = kBoxCols;
  for (auto [index, stride] : terms) {
    m.outerIndices.push_back(index);
    m.record.outer.push_back(stride);
  }
  return m;
}

std::optional<TileKernelLowering::RingTensorMap>
TileKernelLowering::tensorMapOf(tile::LoadOp load) {
  auto slot = slots.find(load.getResult());
  RankedTensorType ty = load.getType();
  if (load.getGroup() || slot == slots.end() || ty.getRank() != 2 ||
      ty.getDimSize(0) > kMaxBoxRows || slot->second.splitCols ||
      (slot->second.rowChunks * 8) % kBoxCols != 0)
    return std::nullopt;
  std::optional<RingTensorMap> m = tensorMapAt(
      load.getBase(), load.getOffset(), load.getRows(), load.getStride(), ty);
  if (m)
    m->record.boxRows = ty.getDimSize(0);
  return m;
}

void TileKernelLowering::describeTensorMaps(ArrayRef<tile::LoadOp> loads) {
  ringMaps.clear();
  queryLoad = nullptr;
  // An ABI whose names the launchers know (the forward's; the backward's
  // for its Q/dO ring), blocked tiles.
  TensorMapRecord abiOf;
  abiOf.backward = place.backwardAbi;
  if (!place.tma || place.kvSplit || !place.wgmma ||
      place.numBuffers != abiOf.numBuffers() ||
      place.numIndexArgs != abiOf.numIndexArgs())
    return;
  for (tile::LoadOp load : loads) {
    std::optional<RingTensorMap> m = tensorMapOf(load);
    if (!m) {
      ringMaps.clear();
      return;
    }
    ringMaps.push_back(std::move(*m));
  }
  // Q: the one other shared load of the body, before the ring loop and
  // read only by products there or in the loop.
  if (place.tma < 2)
    return;
  Block &body = fn.getBody().front();
  for (Operation &op : body) {
    if (&op == ringLoop.getOperation())
      break;
    auto load = dyn_cast<tile::LoadOp>(&op);
    if (!load || homes.lookup(load.getResult()) != TileHome::Shared ||
        isRingPrologueLoad(load))
      continue;
    bool readInRing = llvm::all_of(load->getUsers(), [&](Operation *user) {
      Operation *top = body.findAncestorOpInBlock(*user);
      return top == ringLoop.getOperation() ||
             (isa<tile::DotOp>(user) && top == user);
    });
    std::optional<RingTensorMap> m = tensorMapOf(load);
    if (queryLoad || !readInRing || !m) {
      queryLoad = nullptr; // not (only) Q: the consumers copy it
      if (ringMaps.size() > loads.size())
        ringMaps.pop_back();
      return;
    }
    queryLoad = load;
    ringMaps.push_back(std::move(*m));
  }
}

void TileKernelLowering::addTensorMapArguments(mlir::gpu::GPUFuncOp kernel) {
  SmallVector<Attribute> records;
  TensorMapRecord abiOf; // names in the kernel's ABI
  abiOf.backward = place.backwardAbi;
  auto names = [&](ArrayRef<int> args) {
    SmallVector<Attribute> out;
    for (int a : args)
      out.push_back(b.getStringAttr(abiOf.indexName(a)));
    return b.getArrayAttr(out);
  };
  // The ring's maps, then O's.
  auto add = [&](RingTensorMap &m) {
    // A __grid_constant__ parameter once the kernel is an llvm.func
    // (MarkGridConstants: the NVVM dialect admits it only there).
    const unsigned at = kernel.getNumArguments();
    (void)kernel.insertArgument(at, g.ptrGen, DictionaryAttr(),
                                kernel.getLoc());
    m.param = kernel.getArgument(at);
    const TensorMapRecord &r = m.record;
    SmallVector<NamedAttribute> fields = {
        b.getNamedAttr("tensor", b.getStringAttr(abiOf.bufferName(r.buffer))),
        b.getNamedAttr("rows", b.getStringAttr(abiOf.indexName(r.rows))),
        b.getNamedAttr("row_stride",
                       b.getStringAttr(abiOf.indexName(r.rowStride))),
        b.getNamedAttr("outer", names(r.outer)),
        b.getNamedAttr("cols", b.getI64IntegerAttr(r.cols)),
        b.getNamedAttr("box", b.getDenseI64ArrayAttr({r.boxCols, r.boxRows}))};
    if (place.backwardAbi)
      fields.push_back(b.getNamedAttr("abi", b.getStringAttr("bwd")));
    records.push_back(b.getDictionaryAttr(fields));
  };
  for (RingTensorMap &m : ringMaps)
    add(m);
  if (outputMap)
    add(*outputMap);
  kernel->setAttr(kTensorMapsAttr, b.getArrayAttr(records));
}

void TileKernelLowering::copyBoxes(const RingTensorMap &m, tile::LoadOp load,
                                   IRMapping &local, Value dst, Value full) {
  const int64_t rows = load.getType().getDimSize(0);
  // The slot's whole 64-column blocks (rowChunks of 16 bytes a row: at
  // d = 96 the second block's last 32 columns are zeros).
  const int64_t cols = slots[load.getResult()].rowChunks * 8;
  // Whole boxes count, the zeros past the bounds too.
  g.mbarrierExpectBytes(full, rows * cols * 2);
  SmallVector<Value> coords = {g.c32(0), toI32(local.lookup(load.getRow0()))};
  for (Value index : m.outerIndices)
    coords.push_back(toI32(local.lookup(index)));
  for (int64_t c = 0; c < cols; c += kBoxCols) {
    coords[0] = g.c32(c);
    g.tensorCopy(g.sharedBytePtr(smem, g.add(dst, g.c32((c / kBoxCols) *
                                                        blockBytes(rows)))),
                 m.param, coords, full);
  }
}

LogicalResult TileKernelLowering::produceByTensorMap(tile::LoadOp load,
                                                     int64_t stream, Value iv,
                                                     Value stage) {
  IRMapping another;
  IRMapping &local = iv ? another : map;
  if (iv && failed(mapIteration({load}, iv, another)))
    return failure();
  Value dst = g.add(g.c32(slots[load.getResult()].offset),
                    g.mul(stage, g.c32(ringStageBytes)));
  copyBoxes(ringMaps[stream], load, local, dst,
            ringBarrier(stream, /*empty=*/false, stage));
  return success();
}

Value TileKernelLowering::queryBarrier(bool empty) {
  const int64_t at =
      ringBarriers +
      (place.ringStages * GpuGeometry::kRingBarriersPerStage + empty) * 8;
  return g.sharedBytePtr(smem, g.c32(at));
}

void TileKernelLowering::produceQuery() {
  // A fresh barrier's phase of parity 1 counts as completed: the first
  // tile's copy does not wait.
  g.mbarrierWait(queryBarrier(/*empty=*/true), g.xorI(tileParity, g.c32(1)));
  copyBoxes(ringMaps.back(), queryLoad, map,
            g.c32(slots[queryLoad.getResult()].offset),
            queryBarrier(/*empty=*/false));
}

void TileKernelLowering::describeOutputMap() {
  outputMap.reset();
  outputStore = nullptr;
  if (place.tma < 3 || !queryLoad || !outputSlot.rowChunks ||
      (outputSlot.rowChunks * 8) % kBoxCols != 0 || mt * 16 > kMaxBoxRows)
    return;
  for (auto store : fn.getBody().front().getOps<tile::StoreOp>()) {
    std::optional<StagingSlot> through = stagingSlotFor(store);
    if (!through || through->tile || store.getGroup())
      continue;
    outputMap = tensorMapAt(store.getBase(), store.getOffset(), store.getRows(),
                            store.getStride(), tileType(store.getValue()));
    if (!outputMap)
      return;
    outputMap->record.boxRows = mt * 16; // a warp's rows
    outputStore = store;
    return;
  }
}

/// O out by its tensor map (KernelPlacement::tma 3): each warp writes its
/// rows into outputSlot in the blocked, 128-byte-swizzled layout that the
/// map's boxes have (writeFragment), makes them visible to the async proxy,
/// and its lane 0 stores one box of the warp's rows per 64 columns; rows
/// past seq_q and columns past dv are the map's bounds, so no thread tests
/// a row. Lane 0 waits until the boxes are read before the warp goes on
/// (a persistent kernel's next tile writes the slot again). Before:
///
///   tile.store %o, %O[%off] rows %m0 of %nq stride %sn
///       : tensor<128x128xbf16>, memref<?xbf16>
///
/// After (a warp's 16 rows, d = 128; %omap the last kernel parameter,
/// recorded as {tensor = "o", rows = "seq_q", row_stride = "o_sn", ...,
/// box = [64, 16]}):
///
///   st.shared.b32 [O's slot + swizzle(row, col) + 4 tig], cvt.rn.bf16x2(..)
///   fence.proxy.async.shared::cta
///   bar.warp.sync -1
///   lane 0: cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group
///               [%omap, {0, m0 + warp row, h, b}], [O's slot + warp row 128]
///           cp.async.bulk.tensor.4d ... [%omap, {64, ...}], [... + block]
///           cp.async.bulk.commit_group; cp.async.bulk.wait_group.read 0
///   bar.warp.sync -1
LogicalResult TileKernelLowering::storeByTensorMap(tile::StoreOp op,
                                                   const Fragment &f,
                                                   const StoreRows &to,
                                                   const StagingSlot &through) {
  RankedTensorType ty = tileType(op.getValue());
  const SharedSlot &slot = through.slot;
  // In a persistent kernel the warp's boxes of the last tile were read
  // before its lane 0 passed the warp sync: the slot is free.
  writeFragment(slot, through.rows, ty, f);
  wg->fenceProxyAsync();
  g.warpSync();
  g.ifThen(g.cmp(arith::CmpIPredicate::eq, lane, g.c32(0)), [&] {
    SmallVector<Value> coords = {g.c32(0), g.add(to.row0, warpRow0)};
    for (Value index : outputMap->outerIndices)
      coords.push_back(toI32(scalar(index)));
    const int64_t cols = slot.rowChunks * 8;
    for (int64_t c = 0; c < cols && c < ty.getDimSize(1); c += kBoxCols) {
      coords[0] = g.c32(c);
      Value at =
          g.add(g.c32(slot.offset + (c / kBoxCols) * blockBytes(through.rows)),
                g.mul(warpRow0, g.c32(128)));
      g.tensorStore(outputMap->param, coords, g.sharedBytePtr(smem, at));
    }
    g.bulkCommit();
    g.bulkWait(0, /*read=*/true);
  });
  g.warpSync();
  return success();
}

namespace {
/// The byval tensor maps of a kernel that records attn.tensor_maps: its
/// last arguments, one per record.
struct MarkGridConstantsPass
    : public conversion::impl::MarkGridConstantsBase<MarkGridConstantsPass> {
  void runOnOperation() override {
    LLVM::LLVMFuncOp fn = getOperation();
    auto maps = fn->getAttrOfType<ArrayAttr>(kTensorMapsAttr);
    if (!maps)
      return;
    if (maps.size() > fn.getNumArguments()) {
      fn.emitError() << "records " << maps.size()
                     << " tensor maps but has fewer arguments";
      return signalPassFailure();
    }
    Builder b(&getContext());
    auto mapTy = LLVM::LLVMArrayType::get(b.getI8Type(), kTensorMapBytes);
    for (unsigned i = fn.getNumArguments() - maps.size();
         i < fn.getNumArguments(); ++i) {
      fn.setArgAttr(i, LLVM::LLVMDialect::getByValAttrName(),
                    TypeAttr::get(mapTy));
      fn.setArgAttr(i, LLVM::LLVMDialect::getAlignAttrName(),
                    b.getI64IntegerAttr(kTensorMapAlign));
      fn.setArgAttr(i, NVVM::NVVMDialect::getGridConstantAttrName(),
                    b.getUnitAttr());
    }
  }
};
} // namespace
