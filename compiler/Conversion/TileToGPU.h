//===- TileToGPU.h - The tile IR -> a tensor-core kernel --------*- C++ -*-===//
//
/// \file
/// The GPU lowering of the tile dialect (the shared stage: TileOps.td). It
/// decides only where data lives and when things happen:
///   - layouts: a 2-D register tile is spread over the warps as the
///     m16n8k16 accumulator layout (warps split the rows; thread (grp, tig)
///     of a warp holds rows grp and grp + 8 of each 16-row m-tile and
///     columns 2 tig, 2 tig + 1 of each 8-column n-tile), a rank-1 tile as
///     the matching per-row values (replicated over the 4 lanes of a row),
///     and a tile that only feeds tile.dot lives in XOR-swizzled shared
///     memory instead (TileCopy.h), read by ldmatrix;
///   - staging: each shared tile has its own slot; loads become cp.async
///     copies issued as early as their slot is free (the loop's software
///     pipeline: TileKernelLowering::lowerFor);
///   - distribution: dv > 256 splits the columns of V and O over grid.z.
/// What each op computes is the tile IR's: each op family's lowering
/// (lowerLoad, lowerDot, lowerReduce, lowerElementwise, ...) maps one op of
/// the tile IR onto the registers of its operands' fragments. Internal to
/// compiler/Conversion.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_TILETOGPU_H
#define FLASHJIT_COMPILER_CONVERSION_TILETOGPU_H

#include "compiler/Conversion/GpuBuilder.h"
#include "compiler/Conversion/KernelPlacement.h"
#include "compiler/Conversion/TileCopy.h"
#include "compiler/Conversion/TileFragments.h"
#include "compiler/Conversion/Wgmma.h"
#include "dialects/Tile/IR/TileDialect.h"
#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelLaunch.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/IRMapping.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"

#include <optional>

namespace flashjit::conversion {

using mlir::LogicalResult;
using mlir::Operation;
using mlir::Value;

/// Checks \p fn's arguments against the ABI's groups of \p place (a
/// named error on \p fn): buffers, index arguments, f32 arguments, pid_m
/// and pid_bh.
LogicalResult checkPlacedArguments(mlir::func::FuncOp fn,
                                   const KernelPlacement &place);

/// The gpu.func of \p fn for \p place (createKernelFunc), its arguments
/// the ABI's groups without pid_m and pid_bh.
mlir::gpu::GPUFuncOp
createPlacedKernel(mlir::ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                   mlir::gpu::GPUModuleOp gpuModule, mlir::func::FuncOp fn,
                   const KernelPlacement &place, int64_t sharedBytes);

/// Maps \p fn's arguments into \p map: the kernel's (index arguments cast
/// back to index), pid_m = blockIdx.x (reversed with reversePidM) and
/// pid_bh = blockIdx.y.
void mapPlacedArguments(mlir::ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                        mlir::func::FuncOp fn, mlir::gpu::GPUFuncOp kernel,
                        const KernelPlacement &place, mlir::IRMapping &map);

/// Moves each tile.dot up to right after the first product of its block
/// before which all its operands exist, so that the two are adjacent: one
/// batch of warpgroup MMAs, one wait (TileToGPUWgmma.cpp). Products are
/// pure, so the program computes what it did; only the order in which the
/// GPU issues them changes. For the backward's dK/dV kernel, dP^T = V dO^T
/// joins S^T = K Q^T (two waits per step instead of three). With
/// \p transposedFirst (KernelPlacement::splitCommits), a transposed product
/// (dQ = dS K, reduced into memory) then moves above the products right
/// before it whose results it does not read, where its operands exist
/// there: its reduction can then wait for it alone while they run.
void batchReadyProducts(mlir::func::FuncOp fn, bool transposedFirst = false);

/// Lowers a tiled function without products or loops (the backward's
/// preprocess and dq_convert: TileToGPURows.cpp) into a gpu.func.
LogicalResult lowerRowKernel(mlir::func::FuncOp fn,
                             mlir::gpu::GPUModuleOp gpuModule,
                             const AttentionSpec &spec,
                             const KernelPlacement &place);

/// Lowers one tiled function with products (role "forward", "main" or
/// "dq") into a gpu.func, in the placement its role fixes.
class TileKernelLowering {
public:
  TileKernelLowering(mlir::ImplicitLocOpBuilder &b, mlir::func::FuncOp fn,
                     const AttentionSpec &spec, const TileConfig &config,
                     int64_t copyBytes, const KernelPlacement &place);

  /// Builds the kernel in \p gpuModule; errors are emitted on the op at fault.
  LogicalResult run(mlir::gpu::GPUModuleOp gpuModule);

private:
  // Analysis (TileToGPU.cpp).
  LogicalResult assignHomes();
  LogicalResult checkPostconditions(mlir::gpu::GPUFuncOp kernel);
  void setUpThreads();

  /// The dK/dV kernel's branches: the tiles that reach the branch's stores
  /// and reductions (through loops and branches); the rest is not lowered.
  void markLive();
  /// Whether a store or reduction is the other branch's.
  bool otherBranchOutput(Operation *op);

  // The walk: one op at a time, each op family by its lowering.
  LogicalResult lowerBlock(mlir::Block &block);
  LogicalResult lowerOp(Operation *op);
  LogicalResult cloneScalar(Operation *op);

  // Memory (TileToGPUMemory.cpp).
  LogicalResult lowerLoad(tile::LoadOp op);
  LogicalResult lowerStore(tile::StoreOp op);
  /// A tile.store's destination as scalars of the kernel: tile row r is
  /// at base[offset + rowOffset(row0 + r, stride, group, groupStride)],
  /// rows past `rows` not written (stride null for a rank-1 tile, group
  /// and groupStride null without a row group).
  struct StoreRows {
    Value base, offset, stride, row0, rows, group, groupStride;
    /// The element index (i64) of column 0 of global row \p row (i32).
    Value rowAt(gpu::GpuBuilder &g, Value row) const {
      return g.add(offset, g.rowOffset(row, stride, group, groupStride));
    }
  };
  StoreRows storeRowsOf(tile::StoreOp op);
  /// Where a store stages its register tile: a slot of \p rows rows, and
  /// the shared tile it belongs to (null for outputSlot, which no copy fills).
  struct StagingSlot {
    SharedSlot slot;
    int64_t rows = 0;
    Value tile;
  };
  /// The slot that store \p op can stage its register tile through
  /// (KernelPlacement::stagedStores): a dead shared tile's, or the
  /// forward's own outputSlot; none if neither fits.
  std::optional<StagingSlot> stagingSlotFor(tile::StoreOp op);
  /// Stores register tile \p f of \p op (to \p to) through \p through:
  /// the warp's rows in, then out by 16-byte vectors.
  LogicalResult storeThroughShared(tile::StoreOp op, const Fragment &f,
                                   const StoreRows &to,
                                   const StagingSlot &through);
  LogicalResult lowerRowValues(tile::LoadOp op);
  /// A captured tensor's element per register (tile.gather): one global
  /// load per distinct index register.
  LogicalResult lowerGather(tile::GatherOp op);
  /// A captured tensor's gradient (tile.scatter_add): the registers that
  /// share an index summed, then one red.global.add each; a uniform index,
  /// summed over the warp first.
  LogicalResult lowerScatterAdd(tile::ScatterAddOp op);
  /// memref.load of a scalar, its operands and result in \p mapping (the
  /// walk's, or another iteration's: issueCopy).
  LogicalResult lowerScalarLoad(Operation *op, mlir::IRMapping &mapping);
  /// Issues the cp.async copies of the shared loads \p ops (of one block),
  /// their operands evaluated with the enclosing loop's induction variable
  /// replaced by \p iv (null: as mapped now), and commits them as one group.
  /// \p dstShift (i32, optional) moves the destination: the other stage of
  /// a double-buffered slot. Without \p commit the caller commits.
  LogicalResult issueCopy(llvm::ArrayRef<tile::LoadOp> ops, Value iv,
                          Value dstShift = Value(), bool commit = true);
  /// \p another: the walk's mapping, plus the scalar ops of the loop body
  /// that \p ops' operands depend on, evaluated again at iteration \p iv.
  LogicalResult mapIteration(llvm::ArrayRef<tile::LoadOp> ops, Value iv,
                             mlir::IRMapping &another);
  /// Whether SharedVector load \p next can be copied with \p first, \p k
  /// loads after it: the same rows of the same buffer, the slot k slots on.
  bool copiesWith(tile::LoadOp first, tile::LoadOp next, int64_t k);
  /// The cp.async copies of SharedVector slots (\p ops: copiesWith the
  /// first), 4 bytes per element, spread over the threads as one vector.
  void copyVectors(llvm::ArrayRef<tile::LoadOp> ops, mlir::IRMapping &local,
                   Value dstShift);
  /// The byte offset of \p v's slot in the stage being computed (i32).
  Value slotOffset(Value v);
  void findSharedConstants(); ///< constant rhs tiles: TileToGPUConstants.cpp
  void fillSharedConstants();

  // Compute (TileToGPUCompute.cpp).
  /// Waits for every cp.async copy in flight, then (wgmma) the proxy
  /// fence and a barrier: the copied slots are every thread's to read.
  void waitForCopies();
  LogicalResult lowerDot(tile::DotOp op);
  /// A product with a transposed register lhs, reduced into a global
  /// accumulator (TileToGPUAtomics.cpp).
  LogicalResult lowerTransposedProduct(tile::DotOp op);
  ReductionTarget reductionOf(tile::AtomicAddOp atomic);
  /// Stores rounded register tile \p v into its staging slot.
  void stageTransposed(Value v, const Fragment &f);
  /// Writes rounded register tile \p f (of type \p ty) into \p slot, laid
  /// out as a shared tile of \p slotRows rows: the thread's pairs by 4-byte
  /// stores at their swizzled chunks.
  void writeFragment(const SharedSlot &slot, int64_t slotRows,
                     mlir::RankedTensorType ty, const Fragment &f);
  LogicalResult lowerReduce(tile::ReduceOp op);
  LogicalResult lowerBroadcast(tile::BroadcastOp op);
  LogicalResult lowerSplat(tile::SplatOp op);
  LogicalResult lowerIota(tile::IotaOp op);
  LogicalResult lowerConstant(Operation *op);
  LogicalResult lowerElementwise(Operation *op);
  LogicalResult lowerRounding(Operation *op);
  /// `o * bcast(exp2(x - y))` skips the multiply when no row of the warp
  /// has x != y (then the factor is exactly 1): an exact rewrite.
  std::optional<LogicalResult> lowerUnitRescale(Operation *op);
  /// arith.sitofp of a 2-D index tile affine in its row and column
  /// (affineIndexOf): one conversion per column parity, then exact adds of
  /// constants (TileToGPUCompute.cpp).
  std::optional<LogicalResult> lowerAffineConversion(Operation *op);
  /// math.exp2 of a score tile less a broadcast row value: a share of its
  /// registers by arithmetic (KernelPlacement::exp2Emulation;
  /// TileToGPUExp2.cpp).
  std::optional<LogicalResult> lowerEmulatedExp2(Operation *op);
  /// math.tanh of a 2-D tile: a share of its registers by a polynomial on
  /// the FMA pipe where the warp's all lie in [-1, 1]
  /// (KernelPlacement::tanhPolynomial; TileToGPUTanh.cpp).
  std::optional<LogicalResult> lowerPolynomialTanh(Operation *op);

  // Warpgroup MMAs (TileToGPUWgmma.cpp).
  LogicalResult lowerWgmmaDot(tile::DotOp op);
  LogicalResult lowerWgmmaTransposed(tile::DotOp op, tile::AtomicAddOp atomic);
  /// Issues the MMAs of transposed product \p op (dQ = dS K) and commits
  /// them; its reduction (lowerWgmmaTransposed) waits for them.
  LogicalResult issueWgmmaTransposed(tile::DotOp op);
  /// The warpgroup's 64 rows of \p f (dQ, its columns from \p colBase; the
  /// thread's first row \p q0) added into \p r by one bulk reduction of
  /// the staging tile (KernelPlacement::dqStageCols; the warpgroups'
  /// tiles side by side where they \p splitCols; TileToGPUAtomics.cpp).
  void reduceTileInBulk(const ReductionTarget &r, const Fragment &f,
                        Value colBase, Value q0, bool splitCols);
  /// Pins the registers that \p first and the independent dots right after
  /// it read, then wgmma.fence: one batch of MMAs.
  void openBatch(tile::DotOp first);
  bool chainsOnto(tile::DotOp dot, tile::DotOp before); ///< (Wgmma.cpp)
  /// Commits the open batch (if any); with \p wait, also waits for every
  /// MMA in flight and pins their results.
  void settle(bool wait);
  /// Waits for the oldest commit groups up to the newest that \p op reads
  /// (wait_group n leaves the n after it in flight) and pins their results.
  void waitFor(Operation *op);
  void waitUntil(int64_t group);
  /// Whether branch \p op is lowered with the products in flight left so.
  bool leavesInFlight(Operation *op);
  /// Bytes between a blocked tile's 64-column blocks (0: not blocked).
  int64_t blockBytes(int64_t rows) const {
    return place.wgmma ? rows * 128 : 0;
  }
  /// The warp and lane, the lane's (grp, tig), the warp's column part and
  /// first row, from the loop's opaque
  /// thread index inside a loop: addresses made from them are recomputed
  /// per iteration, not hoisted into registers live across the loop.
  struct LaneIndices {
    Value warp, lane, grp, tig, colPart, warpRow0;
  };
  LaneIndices laneIndices();
  /// The same from thread index \p t.
  LaneIndices laneIndicesOf(Value t);
  /// Rounds a slot offset up to the placement's alignment.
  int64_t alignSlot(int64_t offset) const {
    return place.wgmma ? roundUp(offset, 1024) : offset;
  }

  // The K/V ring of a kernel with a producer warpgroup (TileToGPURing.cpp).
  /// Takes \p loop (with shared loads) as the ring's: its stages after the
  /// slots, then the barriers.
  LogicalResult assignRing(mlir::scf::ForOp loop);
  /// The two roles: barrier set-up, then the producer's copies and the
  /// consumers' lowering of \p body.
  LogicalResult lowerRingRoles(mlir::Block &body);
  LogicalResult lowerProducer(mlir::Block &body);
  LogicalResult lowerRingFor(mlir::scf::ForOp op);
  /// The stage (i32) of \p op's iteration \p iv, and its phase parity,
  /// for ring stream \p stream (ringLead of its loads before the loop).
  std::pair<Value, Value> ringPosition(mlir::scf::ForOp op, Value iv,
                                       int64_t stream);
  /// \p offset (i32) from the first position of \p stream in this tile
  /// (ringBase; 0 but in a persistent kernel).
  Value streamPosition(int64_t stream, Value offset);
  struct RingLead;
  /// The stage and parity of ring prologue load \p r (its position in its
  /// stream from the tile's ringBase).
  std::pair<Value, Value> leadPosition(const RingLead &r);
  /// The ring loop's trips (i32, 0 when empty), and the stage and parity
  /// of ring epilogue load \p r (after its stream's lead and the trips).
  Value ringTrips();
  std::pair<Value, Value> tailPosition(const RingLead &r);
  /// A ring load after the loop: its stage, wait and release; false for
  /// any other load.
  bool placeRingEpilogueLoad(tile::LoadOp load);
  /// Ring load \p load of \p stream in (\p stage, \p parity), read by
  /// the products \p readers (firstAndLastDot): its slot shifted to the
  /// stage, the first product waiting for the stage to fill, the last
  /// giving it back once waited for.
  void awaitRingStage(tile::LoadOp load,
                      std::pair<Operation *, tile::DotOp> readers,
                      int64_t stream, Value stage, Value parity);
  /// The stage and parity of a stream's load at \p position (i32 or a
  /// constant).
  std::pair<Value, Value> positionOf(Value position);
  std::pair<Value, Value> positionOf(int64_t position);
  /// The producer's copy of ring load \p load of \p stream (iteration \p iv,
  /// null outside the loop) into \p stage: waits for it to be empty, then
  /// copies and arrives on its full barrier.
  LogicalResult produce(tile::LoadOp load, int64_t stream, Value iv,
                        Value stage, Value parity);

  // The ring's tensor maps (TileToGPUTma.cpp).
  struct RingTensorMap;
  /// The tensor map of a 16-bit \p ty at \p base[\p offset], \p rows rows
  /// \p stride apart, if that address is a map's (box rows: the caller's).
  std::optional<RingTensorMap> tensorMapAt(Value base, Value offset, Value rows,
                                           Value stride,
                                           mlir::RankedTensorType ty);
  /// \p load's tensor map, if its address is one's.
  std::optional<RingTensorMap> tensorMapOf(tile::LoadOp load);
  /// O's tensor map (outputMap, outputStore) where KernelPlacement::tma
  /// is 3 and the body's O store stages through outputSlot.
  void describeOutputMap();
  /// Stores register tile \p f of \p op through outputSlot and out by
  /// outputMap: each warp's rows in, then one box per 64 columns.
  LogicalResult storeByTensorMap(tile::StoreOp op, const Fragment &f,
                                 const StoreRows &to,
                                 const StagingSlot &through);
  /// Describes every stream of the ring's \p loads by a tensor map
  /// (ringMaps; KernelPlacement::tma), or leaves ringMaps empty; then Q
  /// (queryLoad), if it can be.
  void describeTensorMaps(llvm::ArrayRef<tile::LoadOp> loads);
  /// Expects \p load's bytes on \p full and copies its boxes to \p dst.
  void copyBoxes(const RingTensorMap &m, tile::LoadOp load,
                 mlir::IRMapping &local, Value dst, Value full);
  /// Q's full (or empty) barrier, after the stages'.
  Value queryBarrier(bool empty);
  /// The producer's copy of Q, once the last tile's consumers are done;
  /// the consumers' wait for it, before its first product (queryPending).
  void produceQuery();
  void waitForQuery();
  /// Appends the tensor-map parameters to \p kernel, records them as its
  /// attn.tensor_maps (kernels/KernelLaunch.h), and prefetches them.
  void addTensorMapArguments(mlir::gpu::GPUFuncOp kernel);
  /// The producer's copy of ring load \p load of \p stream (iteration
  /// \p iv; null before the loop) into \p stage by the tensor memory
  /// accelerator, its bytes completing on the stage's full barrier.
  LogicalResult produceByTensorMap(tile::LoadOp load, int64_t stream, Value iv,
                                   Value stage);

  // The persistent kernel (TileToGPUPersistent.cpp).
  /// Runs \p lowerTile (one role's lowering of the body) once; in a
  /// persistent kernel inside the loop over the tiles, whose pid_m and
  /// pid_bh it maps, carrying ringBase from one tile to the next.
  LogicalResult forEachTile(llvm::function_ref<LogicalResult()> lowerTile);
  /// The function-level loads of the ring's streams before its loop
  /// (ringPrologue): no slots of their own (they alias their stream's).
  bool isRingPrologueLoad(tile::LoadOp load);
  /// \p load's first and last reading dots in its block.
  std::pair<Operation *, tile::DotOp> firstAndLastDot(tile::LoadOp load);
  /// The shared pointer of ring load \p load's full (or empty) barrier of
  /// \p stage (i32).
  Value ringBarrier(int64_t load, bool empty, Value stage);
  /// Before product \p op: waits for the stages it reads first.
  void waitForRing(tile::DotOp op);
  /// After the products \p done were waited for: gives back the stages
  /// that they read last.
  void releaseRing(llvm::ArrayRef<Value> done);
  /// Whether the batch that \p first opens takes its turn (pingPong).
  bool takesTurn(tile::DotOp first);
  /// With turns at the multi-function unit (pingPong 3), the op of the
  /// ring loop's body \p block that opens this warpgroup's turn: the first
  /// that follows its last product or is, or holds, a score's tanh or exp2
  /// (a 2-D tile's); null otherwise. The turn is passed at the end of the
  /// body.
  Operation *unitTurnStart(mlir::Block &block);
  /// bar.sync on this warpgroup's turn barrier (before a batch), or
  /// bar.arrive on the next warpgroup's (after its commit).
  void waitTurn();
  void passTurn();

  // Control flow (TileToGPUControl.cpp).
  LogicalResult lowerFor(mlir::scf::ForOp op);
  /// The double-buffered pipeline of \p op's shared loads (\p loads):
  /// block t + 1 copies into one stage while block t computes on the other.
  LogicalResult lowerDoubleBufferedFor(mlir::scf::ForOp op,
                                       llvm::ArrayRef<tile::LoadOp> loads);
  /// Makes the loop that carries \p op's registers and lowers its body
  /// there, after \p atTop (the pipeline's code at the top of an
  /// iteration), with the walk's loop state saved and restored around it.
  LogicalResult lowerLoopBody(mlir::scf::ForOp op,
                              llvm::function_ref<LogicalResult()> atTop);
  /// Runs afterCommit once where the walk is in its block (settle()).
  void runAfterCommit();
  /// Finds each loop's running row sums kept per lane (perLaneSums).
  void deferRunningSums(mlir::scf::ForOp op);
  LogicalResult lowerIf(mlir::scf::IfOp op);
  llvm::SmallVector<Value> flatten(mlir::ValueRange tiles);
  /// flatten()'s inverse: \p values' registers (tiles) and scalars taken
  /// from \p flat in order.
  void assignFlat(mlir::ValueRange values, mlir::ValueRange flat);

  // Helpers.
  bool isTile(Value v) const {
    return mlir::isa<mlir::RankedTensorType>(v.getType());
  }
  /// Whether \p op reads or makes a tile.
  bool touchesTiles(Operation *op) const {
    return llvm::any_of(op->getOperands(),
                        [&](Value v) { return isTile(v); }) ||
           llvm::any_of(op->getResults(), [&](Value v) { return isTile(v); });
  }
  mlir::RankedTensorType tileType(Value v) const {
    return mlir::cast<mlir::RankedTensorType>(v.getType());
  }
  /// Registers per thread of a register tile of \p ty.
  int64_t regCount(mlir::RankedTensorType ty) const;
  /// n-tiles (8 columns each) per thread of a 2-D register tile.
  int64_t nTiles(mlir::RankedTensorType ty) const;
  /// Columns of a 2-D register tile as the registers hold them: the grid.z
  /// chunk for tiles the active split divides, else padded to 16.
  int64_t paddedCols(mlir::RankedTensorType ty) const;
  bool splitsCols(mlir::RankedTensorType ty) const;
  /// Columns of a 2-D register tile one warp holds (paddedCols / colParts).
  int64_t warpCols(mlir::RankedTensorType ty) const {
    return paddedCols(ty) / place.colParts;
  }
  /// The first column of the warp's columns of \p ty: the program's chunk
  /// and the warp's part of it (i32).
  Value colStart(mlir::RankedTensorType ty);
  /// The first column of the program's chunk of \p ty alone (i32).
  Value chunkStart(mlir::RankedTensorType ty) {
    return splitsCols(ty) ? splitStart : g.c32(0);
  }
  /// The split of the placement that divides tiles as wide as \p ty.
  const KernelPlacement::ColumnSplit *splitOf(mlir::RankedTensorType ty) const;
  Value scalar(Value v) const { return map.lookup(v); }
  Value toI32(Value index);
  Value toI64(Value index);
  mlir::InFlightDiagnostic fail(Operation *op, llvm::StringRef what);

  mlir::ImplicitLocOpBuilder &b;
  gpu::GpuBuilder g;
  mlir::func::FuncOp fn;
  AttentionSpec spec;
  TileConfig config;
  int64_t copyBytes;
  KernelPlacement place;
  int64_t mt = 0; ///< 16-row m-tiles per warp

  llvm::DenseMap<Value, TileHome> homes;
  /// In program order (a MapVector: the kernel's code is deterministic).
  llvm::MapVector<Value, SharedSlot> slots;
  llvm::DenseMap<Value, Fragment> frags;
  /// Row sums whose 4 lanes are combined after their loop (lowerFor), and
  /// per loop the results that are such sums (deferRunningSums).
  llvm::DenseSet<Operation *> deferredSums;
  llvm::DenseMap<Operation *, llvm::SmallVector<unsigned>> perLaneSums;
  /// Shared loads whose copies a loop's pipeline issues (skipped in place).
  llvm::DenseSet<Operation *> pipelined;
  /// The first dot of each pipeline stage: before it, wait and barrier,
  /// then these copies: (load, 0) for this iteration's, (load, 1) for the
  /// next one's (guarded by t + 1 < ub).
  struct BeforeDot {
    llvm::SmallVector<std::pair<tile::LoadOp, int>> issue;
  };
  llvm::DenseMap<Operation *, BeforeDot> beforeDot;
  /// Loops whose shared loads are double-buffered, with the bytes of one
  /// stage (the second stage follows the first).
  llvm::DenseMap<Operation *, int64_t> doubleBuffered;
  /// The current stage's byte offset of each slot of the double-buffered
  /// loops being lowered (i32).
  llvm::DenseMap<Value, Value> stageShift;
  /// Register tiles that a product reads transposed: their staging slots,
  /// written where they are rounded (stageTransposed).
  llvm::MapVector<Value, SharedSlot> staging;
  llvm::MapVector<Value, SharedSlot> sharedConstants; ///< and their ops:
  llvm::DenseSet<Operation *> constantOps;
  /// Warpgroup MMAs: the builder, the warpgroup index, the products whose
  /// registers are still being written and their commit groups (numbered
  /// by `commits`, the groups committed so far), whether a batch is open
  /// (fenced, not committed), and the open batch's products without acc.
  std::optional<gpu::Wgmma> wg;
  Value wgIdx;
  llvm::SmallVector<Value> inFlight;
  llvm::SmallVector<int64_t> inFlightGroups;
  int64_t commits = 0;
  /// The A registers (b32 pairs) of each product in flight that reads them.
  llvm::DenseMap<Value, llvm::SmallVector<Value>> lhsInFlight;
  bool batchOpen = false;
  /// Products of the open batch issued and not committed (with
  /// KernelPlacement::splitCommits each commits as it is issued).
  bool batchUncommitted = false;
  /// Transposed products issued where they stand (split commits), reduced
  /// later by their tile.atomic_add.
  llvm::DenseSet<Value> issuedTransposed;
  llvm::DenseSet<Operation *> batchRun; ///< the open batch's products
  llvm::DenseMap<Operation *, llvm::SmallVector<Value>> pinnedInit;
  mlir::IRMapping map; ///< scalars of the tiled function -> the kernel's
  int64_t sharedBytes = 0;
  /// gpu.return, after waiting for the kernel's bulk reductions (if any).
  void returnFromKernel();
  /// The warpgroups' dQ staging tile (KernelPlacement::dqStageCols), and
  /// whether bulk reductions were issued (waited for before returning).
  int64_t dqStageOffset = 0;
  bool bulkReductions = false;
  /// The forward's own O staging slot (KernelPlacement::
  /// outputStagingBytes), after every other; rowChunks 0 where it has none.
  SharedSlot outputSlot;
  /// Copies issued and not yet waited for (straight-line code).
  bool pendingCopies = false;
  /// On warpgroup MMAs, the double-buffered loop's next copies, issued once
  /// its first batch is committed in afterCommitBlock (runAfterCommit).
  std::function<LogicalResult()> afterCommit;
  mlir::Block *afterCommitBlock = nullptr;
  LogicalResult afterCommitResult = mlir::success();
  /// The loop being lowered: its new induction variable, bound and step.
  Value loopIv, loopUb, loopStep;
  /// The thread index the copies use (an opaque copy inside loops), and
  /// how many threads copy (0: the placement's).
  Value copyTid;
  int64_t copyThreads = 0;
  /// The K/V ring: its loop, the bytes of a stage, the barriers' offset;
  /// the products that wait for ring loads and the results that give them
  /// back, each use a load's stream (its barriers' index: the loop's load
  /// order) at a stage with its phase parity (i32).
  mlir::scf::ForOp ringLoop;
  int64_t ringStageBytes = 0, ringBarriers = 0;
  struct RingUse {
    int64_t stream;
    Value stage, parity;
  };
  llvm::DenseMap<Operation *, llvm::SmallVector<RingUse, 2>> ringWaits;
  llvm::DenseMap<Value, llvm::SmallVector<RingUse, 2>> ringReleases;
  /// The bases read by the function's top-level loops (the ring's candidate
  /// streams), the loads of those streams before the ring loop, in order,
  /// with their stream and position (the overlapped loop's first K:
  /// stream 0, position 0), and per stream how many such loads lead the loop's.
  llvm::DenseSet<Value> loopBases;
  struct RingLead {
    tile::LoadOp load;
    int64_t stream, position;
  };
  llvm::SmallVector<RingLead, 1> ringPrologue, ringEpilogue;
  llvm::SmallVector<int64_t, 2> ringLead, ringTail;
  /// Per stream, its first ring position in the tile being lowered (i32;
  /// empty: 0, one tile per program). A persistent kernel's tiles go on
  /// from the positions the last one left.
  llvm::SmallVector<Value, 2> ringBase;
  /// Per ring stream (empty: cp.async by the producer warpgroup), then Q,
  /// its tensor map: the record the launcher encodes it from, the tile IR's
  /// indices of its outer dimensions, and the kernel's parameter.
  struct RingTensorMap {
    TensorMapRecord record;
    llvm::SmallVector<Value, 3> outerIndices;
    Value param;
  };
  llvm::SmallVector<RingTensorMap, 3> ringMaps;
  /// O's tensor map (KernelPlacement::tma 3; the last parameter) and store.
  std::optional<RingTensorMap> outputMap;
  tile::StoreOp outputStore;
  /// Q when the producer copies it by its tensor map (ringMaps' last), and
  /// the parity of the program's tile (i32; forEachTile).
  tile::LoadOp queryLoad;
  Value tileParity;
  /// A scheduled persistent kernel's tile schedule (a pointer before its
  /// tensor maps, possibly null; TileToGPUPersistent.cpp).
  Value scheduleArg;
  bool queryPending = false;
  /// The ring's consumers take the registers the producer does not need
  /// (setmaxnreg; consumersNeedRegisters in TileToGPURing.cpp).
  bool ringMovesRegisters = false;
  /// The open batch took its turn: its commit passes the turn on.
  bool batchTookTurn = false;
  /// Lowering a branch that leaves the products in flight (leavesInFlight).
  bool inLightBranch = false;
  /// Lowering one role's branch of the kernel: no gpu.return of its own.
  bool inRoleBranch = false;

  // Thread geometry (i32) and the ldmatrix lane bases of each slot.
  Value smem, tid, lane, grp, tig, warpRow0, chunk;
  Value colPart; ///< the warp's column part (KernelPlacement::colParts)
  /// Staging slots written since the last barrier (stageTransposed).
  bool staged = false;
  /// The split of the program (branch) being lowered, its first column, and
  /// the dK/dV kernel's branch (0: dK and dQ, 1: dV; -1: no branches).
  const KernelPlacement::ColumnSplit *activeSplit = nullptr;
  llvm::DenseSet<Value> live; ///< markLive's, for the branch being lowered
  Value splitStart;
  int branch = -1;
  struct SlotFrags {
    std::optional<gpu::FragmentAddresses> a, b, bTrans;
  };
  llvm::MapVector<Value, SlotFrags> slotFrags;
  /// The state a lowered loop's body makes loop-variant: the slots' lane
  /// bases and the copies' thread index.
  struct LoopLanes {
    llvm::MapVector<Value, SlotFrags> slotFrags;
    Value copyTid;
  };
  /// Inside a loop being lowered: loop-variant copies of the lane bases and
  /// an opaque thread index, so that addresses are recomputed (one add
  /// each), not held across the loop. Returns the outer state for leaveLoop.
  LoopLanes enterLoop();
  void leaveLoop(LoopLanes outer);
};

} // namespace flashjit::conversion

#endif // FLASHJIT_COMPILER_CONVERSION_TILETOGPU_H
