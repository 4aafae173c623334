//===- TileToGPURing.cpp - The forward's K/V ring and its producer --------===//
//
/// \file
/// Warp specialisation of the forward on warpgroup MMAs (KernelPlacement::
/// ringStages, GpuGeometry's ring): the block's last warpgroup only copies,
/// every other one only computes, and they meet at mbarriers. The tile IR
/// is the same; this decides when and by whom its loads run. Before:
///
///   %q = tile.load %Q[...] ...
///   %r:3 = scf.for %t = %lo to %hi step %c1 iter_args(...) {
///     %k = tile.load %K[...] rows %n0 ...   // read by S = Q K^T
///     %v = tile.load %V[...] rows %n0 ...   // read by O += P V
///     ...
///   }
///   tile.store ...
///
/// After (stage s = t % S of S stages, its parity p = (t / S) & 1; per
/// stage the barriers full K, full V, empty K, empty V):
///
///   thread 0: mbarrier.init full (128: the producer's threads), empty
///       (the consumers' threads); bar.sync 0
///   scf.if (warp >= consumer warps) {           // the producer warpgroup
///     scf.for %t = %lo to %hi {
///       mbarrier.wait empty K[s], p ^ 1; cp.async K(t) -> stage s;
///       cp.async.mbarrier.arrive.noinc full K[s]
///       (the same for V)
///     }
///     cp.async.wait_all
///   } else {                                    // the consumers
///     cp.async Q; wait_all; bar.sync 1, consumers
///     scf.for %t = %lo to %hi iter_args(<registers>) {
///       mbarrier.wait full K[s], p; fence.proxy.async
///       S = Q K^T (wgmma); wait_group 0; mbarrier.arrive empty K[s]
///       ... softmax ...
///       mbarrier.wait full V[s], p; fence.proxy.async
///       O += P V (wgmma); wait_group 0; mbarrier.arrive empty V[s]
///     }
///     tile.store ...
///   }
///
/// With tensor maps (KernelPlacement::tma, TileToGPUTma.cpp) the producer's
/// first thread alone runs that loop: per stage `mbarrier.arrive.expect_tx`
/// of the box bytes and `cp.async.bulk.tensor` boxes instead of the
/// cp.async copies and their arrivals (a full barrier then counts that one
/// arrival), no `cp.async.wait_all`, and no proxy fence after the
/// consumers' wait.
///
/// The backward's dK/dV kernel takes the same ring for its Q and dO tiles
/// (opt-in, `bwd-ring-stages`; KernelPlacement::ringConsumerRegisters
/// fixes the consumers' registers, 240): its loop's two shared loads are
/// read only by products, each stage given back after its last one.
///
/// The producer runs S blocks ahead at most: the copies of block t + S wait
/// until every consumer is done with block t's stage. In a persistent
/// kernel each role's program runs inside the loop over the tiles, its
/// positions going on from tile to tile (TileToGPUPersistent.cpp).
///
/// Ping-pong (KernelPlacement::pingPong, W >= 2 consumer warpgroups): the
/// warpgroups take turns at the tensor cores, so that while one runs its
/// softmax the next one's MMAs have the tensor cores to themselves. Each
/// batch of MMAs in the ring loop (or only S = Q K^T's) becomes
///
///   bar.sync 2 + w, 256; wgmma.fence; wgmma ...; commit;
///   bar.arrive 2 + (w + 1) % W, 256
///
/// with `bar.arrive 2, 256` by warpgroup W - 1 before the loop (the first
/// turn) and `bar.sync 2, 256` by warpgroup 0 after it (the last one).
/// Mode 3 takes the turns at the multi-function unit instead: no batch
/// waits, and the body's ops from the first that follows its last product
/// or holds a score's tanh or exp2, to its end (the overlapped loop: the
/// softmax of the block whose S was in flight) run inside the turn,
///
///   S' = Q K^T (issued); O += P V (issued); wgmma.wait_group 1;
///   bar.sync 2 + w, 256; tanh ...; ex2 ...; bar.arrive 2 + (w + 1) % W, 256
///
/// (unitTurnStart; the hand-overs before and after the loop as above).
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

/// Named barriers: 0 the block, 1 the consumers (GpuBuilder::barrier), then
/// one per consumer warpgroup for its turn at the tensor cores.
static constexpr int64_t kFirstTurnBarrier = 2;

/// The registers that the launch of a block of \p groups warpgroups (its
/// producer included) allocates, over 128 (per thread of one warpgroup):
/// the pool that setmaxnreg moves registers within, so a producer's and
/// its consumer warpgroups' counts sum to at most this. Each thread gets
/// the SM's 65,536 over the block's threads, rounded down to ptxas's
/// multiple of 8: 168 at 384 threads, a pool of 504, not 512 (T28: a
/// backward ring split as 32 + 2 x 240 = 512 waited forever in
/// setmaxnreg.inc for registers that no warp could give).
static int64_t registerPool(int64_t groups) {
  return 65536 / (128 * groups) / 8 * 8 * groups;
}

/// setmaxnreg's counts (producer, each consumer warpgroup) where the
/// consumers need more registers than the block size leaves them (168 for
/// 384 threads, 128 for 512), each split using 64,512 of the SM's 65,536
/// (producer + consumers, times 128). Measured by ptxas on the ring
/// (bench/NOTES.md, T13): with two consumer warpgroups, the overlapped
/// loop's consumers (S, P rounded and O live) take 240 and its producer
/// 24 (T29: at 232 the causal loop spilled 32 bytes; at 24 the producer,
/// by tensor maps or cp.async, spills nothing); the plain loop's producer
/// spills at 40 at d = 256 (140 bytes at 128 x 64) while its consumers
/// fit 216. Three consumer warpgroups (Br 192, d <= 128) take 160 each and
/// leave the producer 24.
static std::pair<int64_t, int64_t> registerSplit(int64_t consumerGroups,
                                                 bool overlapped) {
  if (consumerGroups == 3)
    return {24, 160};
  return overlapped ? std::pair<int64_t, int64_t>{24, 240}
                    : std::pair<int64_t, int64_t>{64, 216};
}
/// A ring tile wider than this many columns (a head dim past 128) gives
/// the consumers an O accumulator of more than 64 registers a thread.
static constexpr int64_t kNarrowRingColumns = 128;

/// Whether the ring's consumers need more registers than the block size
/// leaves them, so that the producer gives them its own (setmaxnreg): the
/// overlapped loop (\p overlapped) keeps two S tiles live, a tile of
/// \p loads wider than kNarrowRingColumns a wide O, and three consumer
/// warpgroups (\p consumerGroups) have 128 registers a thread without; a
/// \p persistent kernel's tile loop keeps more values live (T14: d = 128,
/// 128 x 128, plain and causal, 0 spills at 216, 28-88 bytes at 168). A
/// producer of tensor copies (\p byTensorMaps) needs few registers itself,
/// and at d = 128, 128 x 128, the consumers spill 60 bytes at 168 once Q
/// comes by its map.
static bool consumersNeedRegisters(ArrayRef<tile::LoadOp> loads,
                                   bool overlapped, int64_t consumerGroups,
                                   bool persistent, bool byTensorMaps) {
  return overlapped || consumerGroups > 2 || persistent || byTensorMaps ||
         llvm::any_of(loads, [](tile::LoadOp load) {
           return cast<RankedTensorType>(load.getResult().getType())
                      .getShape()
                      .back() > kNarrowRingColumns;
         });
}

/// The ring's shared loads of \p loop, in program order: its tile.loads
/// that live in shared slots.
static SmallVector<tile::LoadOp>
ringLoadsOf(scf::ForOp loop, const DenseMap<Value, TileHome> &homes) {
  SmallVector<tile::LoadOp> loads;
  for (Operation &op : loop.getBody()->without_terminator())
    if (auto load = dyn_cast<tile::LoadOp>(&op);
        load && homes.lookup(load.getResult()) == TileHome::Shared)
      loads.push_back(load);
  return loads;
}

Value TileKernelLowering::ringBarrier(int64_t load, bool empty, Value stage) {
  // Per stage: full K, full V, empty K, empty V.
  Value slot = g.add(g.mul(stage, g.c32(GpuGeometry::kRingBarriersPerStage)),
                     g.c32((empty ? 2 : 0) + load));
  return g.sharedBytePtr(smem,
                         g.add(g.c32(ringBarriers), g.mul(slot, g.c32(8))));
}

LogicalResult TileKernelLowering::assignRing(scf::ForOp loop) {
  SmallVector<tile::LoadOp> loads = ringLoadsOf(loop, homes);
  if (loads.empty())
    return success();
  if (ringLoop)
    return fail(loop, "the K/V ring serves one loop of the kernel");
  if (loop->getParentOp() != fn.getOperation() || loads.size() != 2)
    return fail(loop, "the K/V ring takes a loop of the function's body "
                      "with two shared loads (K and V)");
  ringLoop = loop;
  ringLead.assign(loads.size(), 0);
  ringTail.assign(loads.size(), 0);
  describeTensorMaps(loads);
  for (Operation &op : fn.getBody().front()) {
    auto load = dyn_cast<tile::LoadOp>(&op);
    if (!load || !isRingPrologueLoad(load))
      continue;
    auto same = llvm::find_if(loads, [&](tile::LoadOp l) {
      return l.getBase() == load.getBase() &&
             l.getResult().getType() == load.getResult().getType();
    });
    if (same == loads.end())
      return fail(load, "a shared load of a K/V ring stream outside the "
                        "ring loop must have its stream's tile type");
    const int64_t stream = same - loads.begin();
    slots[load.getResult()] = slots[same->getResult()];
    if (load->isBeforeInBlock(loop)) {
      ringPrologue.push_back({load, stream, ringLead[stream]++});
      continue;
    }
    // After the loop (the overlapped loop's last P V): the producer runs
    // only the scalar ops before the loop, so its operands come from there.
    if (llvm::any_of(load->getOperands(), [&](Value v) {
          Operation *def = v.getDefiningOp();
          return def && !def->isBeforeInBlock(loop);
        }))
      return fail(load, "a K/V ring load after the ring loop must take "
                        "its operands from before the loop");
    if (!firstAndLastDot(load).first)
      return fail(load, "a ring tile must be read by tile.dot ops");
    ringEpilogue.push_back({load, stream, ringTail[stream]++});
  }
  ringMovesRegisters =
      place.ringConsumerRegisters > 0 ||
      consumersNeedRegisters(loads, !ringPrologue.empty(), place.warpgroups(),
                             place.persistent, !ringMaps.empty());
  const int64_t first = slots[loads.front().getResult()].offset;
  ringStageBytes = alignSlot(sharedBytes) - first;
  ringBarriers = first + place.ringStages * ringStageBytes;
  sharedBytes =
      ringBarriers + (place.ringStages * GpuGeometry::kRingBarriersPerStage +
                      GpuGeometry::kRingQueryBarriers) *
                         8;
  return success();
}

LogicalResult TileKernelLowering::lowerRingRoles(Block &body) {
  const int64_t consumers = place.threads, producers = place.producerThreads;
  g.ifThen(g.cmp(arith::CmpIPredicate::eq, tid, g.c32(0)), [&] {
    for (int64_t s = 0; s < place.ringStages; ++s)
      for (int64_t l = 0; l < 2; ++l) {
        // By tensor maps, one thread's expect_tx arrives on a full barrier.
        g.mbarrierInit(ringBarrier(l, false, g.c32(s)),
                       ringMaps.empty() ? producers : 1);
        g.mbarrierInit(ringBarrier(l, true, g.c32(s)), consumers);
      }
    if (queryLoad) { // Q by its tensor map: the producer's one arrival
      g.mbarrierInit(queryBarrier(/*empty=*/false), 1);
      g.mbarrierInit(queryBarrier(/*empty=*/true), consumers);
    }
  });
  g.barrier(); // the barriers are initialised before anyone uses them
  auto roles = scf::IfOp::create(
      b, g.cmp(arith::CmpIPredicate::uge, tid, g.c32(consumers)),
      /*withElseRegion=*/true);
  auto [producerRegs, consumerRegs] =
      registerSplit(place.warpgroups(), !ringPrologue.empty());
  if (place.ringConsumerRegisters) {
    consumerRegs = place.ringConsumerRegisters;
    producerRegs = registerPool(place.warpgroups() + 1) -
                   place.warpgroups() * consumerRegs;
  }
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(roles.thenBlock()->getTerminator());
    if (ringMovesRegisters)
      g.setMaxRegisters(producerRegs, /*increase=*/false);
    if (failed(forEachTile([&] { return lowerProducer(body); })))
      return failure();
  }
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(roles.elseBlock()->getTerminator());
    if (ringMovesRegisters)
      g.setMaxRegisters(consumerRegs, /*increase=*/true);
    g.barrierThreads = consumers;
    inRoleBranch = true;
    LogicalResult r = forEachTile([&]() -> LogicalResult {
      // A persistent kernel's next tile writes Q's slot: every consumer is
      // done with the last one's (by its tensor map: Q's empty barrier).
      if (place.persistent && !queryLoad)
        g.barrier();
      // The loads before the loop wait at their first product, as the
      // loop's.
      for (RingLead r : ringPrologue) {
        pipelined.insert(r.load);
        auto [stage, parity] = leadPosition(r);
        auto readers = firstAndLastDot(r.load);
        if (!readers.first)
          return fail(r.load, "a ring tile must be read by tile.dot ops");
        awaitRingStage(r.load, readers, r.stream, stage, parity);
      }
      return lowerBlock(body);
    });
    inRoleBranch = false;
    g.barrierThreads = 0;
    if (failed(r))
      return failure();
  }
  returnFromKernel();
  return success();
}

/// The producer's program: the function body's scalar ops (the loop's
/// bounds and the loads' addresses depend on them), then the ring loop's
/// copies; every tile op is the consumers'.
LogicalResult TileKernelLowering::lowerProducer(Block &body) {
  SmallVector<tile::LoadOp> loads = ringLoadsOf(ringLoop, homes);
  for (Operation &op : body.without_terminator()) {
    if (&op == ringLoop.getOperation())
      break;
    if (touchesTiles(&op) || op.getNumRegions())
      continue;
    if (failed(lowerOp(&op)))
      return failure();
  }
  copyThreads = place.producerThreads;
  Value outerTid = copyTid;
  copyTid = g.sub(tid, g.c32(place.threads));
  auto copies = [&]() -> LogicalResult {
    for (const RingTensorMap &m : ringMaps)
      g.prefetchTensorMap(m.param);
    if (queryLoad) // Q, as soon as the last tile's consumers are done
      produceQuery();
    // The loads that lead the loop, each into its position's stage.
    for (const RingLead &r : ringPrologue) {
      auto [stage, parity] = leadPosition(r);
      if (failed(produce(r.load, r.stream, Value(), stage, parity)))
        return failure();
    }
    Value lb = scalar(ringLoop.getLowerBound());
    Value ub = scalar(ringLoop.getUpperBound());
    Value step = scalar(ringLoop.getStep());
    auto loop = scf::ForOp::create(b, lb, ub, step);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(loop.getBody()->getTerminator());
    Value beforeLoop = copyTid;
    copyTid = g.opaque(g.sub(tid, g.c32(place.threads)));
    for (auto [i, load] : llvm::enumerate(loads)) {
      auto [stage, parity] = ringPosition(ringLoop, loop.getInductionVar(), i);
      if (failed(produce(load, i, loop.getInductionVar(), stage, parity)))
        return failure();
    }
    b.setInsertionPointAfter(loop);
    copyTid = beforeLoop;
    // The loads after the loop, at their positions after its trips.
    for (const RingLead &r : ringEpilogue) {
      auto [stage, parity] = tailPosition(r);
      if (failed(produce(r.load, r.stream, Value(), stage, parity)))
        return failure();
    }
    if (ringMaps.empty())
      g.waitAll();
    return success();
  };
  LogicalResult r = success();
  if (ringMaps.empty())
    r = copies();
  else // by tensor maps: the producer's first thread alone
    g.ifThen(g.cmp(arith::CmpIPredicate::eq, tid, g.c32(place.threads)),
             [&] { r = copies(); });
  copyThreads = 0;
  copyTid = outerTid;
  pendingCopies = false;
  return r;
}

/// Copies ring load \p load (of \p stream, at iteration \p iv of the loop;
/// null before it) into \p stage once its readers gave it back.
LogicalResult TileKernelLowering::produce(tile::LoadOp load, int64_t stream,
                                          Value iv, Value stage, Value parity) {
  Value shift = g.mul(stage, g.c32(ringStageBytes));
  // A fresh barrier's phase of parity 1 counts as completed: the first
  // pass over the stages does not wait.
  g.mbarrierWait(ringBarrier(stream, /*empty=*/true, stage),
                 g.xorI(parity, g.c32(1)));
  if (!ringMaps.empty())
    return produceByTensorMap(load, stream, iv, stage);
  if (failed(issueCopy({load}, iv, shift, /*commit=*/false)))
    return failure();
  g.mbarrierArriveOnCopies(ringBarrier(stream, /*empty=*/false, stage));
  return success();
}

std::pair<Value, Value> TileKernelLowering::positionOf(Value position) {
  Value stages = g.c32(place.ringStages);
  return {g.remU(position, stages), g.andI(g.divU(position, stages), g.c32(1))};
}

std::pair<Value, Value> TileKernelLowering::positionOf(int64_t position) {
  return {g.c32(position % place.ringStages),
          g.c32((position / place.ringStages) & 1)};
}

std::pair<Value, Value>
TileKernelLowering::ringPosition(scf::ForOp op, Value iv, int64_t stream) {
  Value k = arith::SubIOp::create(b, iv, scalar(op.getLowerBound()));
  if (getConstantIntValue(op.getStep()) != 1)
    k = arith::DivUIOp::create(b, k, scalar(op.getStep()));
  Value position = toI32(k);
  if (int64_t lead = ringLead[stream])
    position = g.add(position, g.c32(lead));
  return positionOf(streamPosition(stream, position));
}

Value TileKernelLowering::streamPosition(int64_t stream, Value offset) {
  return ringBase.empty() ? offset : g.add(ringBase[stream], offset);
}

Value TileKernelLowering::ringTrips() {
  Value lb = scalar(ringLoop.getLowerBound());
  Value ub = scalar(ringLoop.getUpperBound());
  Value step = scalar(ringLoop.getStep());
  Value span = arith::MaxSIOp::create(b, arith::SubIOp::create(b, ub, lb),
                                      arith::ConstantIndexOp::create(b, 0));
  Value roundUp =
      arith::SubIOp::create(b, step, arith::ConstantIndexOp::create(b, 1));
  return toI32(
      arith::DivUIOp::create(b, arith::AddIOp::create(b, span, roundUp), step));
}

std::pair<Value, Value> TileKernelLowering::tailPosition(const RingLead &r) {
  Value position = g.add(ringTrips(), g.c32(ringLead[r.stream] + r.position));
  return positionOf(streamPosition(r.stream, position));
}

std::pair<Value, Value> TileKernelLowering::leadPosition(const RingLead &r) {
  return ringBase.empty()
             ? positionOf(r.position)
             : positionOf(streamPosition(r.stream, g.c32(r.position)));
}

bool TileKernelLowering::isRingPrologueLoad(tile::LoadOp load) {
  return place.ringStages && load->getParentOp() == fn.getOperation() &&
         loopBases.contains(load.getBase());
}

std::pair<Operation *, tile::DotOp>
TileKernelLowering::firstAndLastDot(tile::LoadOp load) {
  Block *block = load->getBlock();
  Operation *first = nullptr, *last = nullptr;
  for (Operation *user : load.getResult().getUsers()) {
    Operation *inBlock = block->findAncestorOpInBlock(*user);
    if (!inBlock || !isa<tile::DotOp>(inBlock))
      return {nullptr, nullptr};
    if (!first || inBlock->isBeforeInBlock(first))
      first = inBlock;
    if (!last || last->isBeforeInBlock(inBlock))
      last = inBlock;
  }
  return {first, dyn_cast_or_null<tile::DotOp>(last)};
}

/// The consumers' loop: each shared load's first product waits for its
/// stage to be full; the product that reads it last, once waited for,
/// gives the stage back (settle).
LogicalResult TileKernelLowering::lowerRingFor(scf::ForOp op) {
  if (pendingCopies) // Q, copied by every consumer, has landed
    waitForCopies();
  waitForQuery();
  SmallVector<tile::LoadOp> loads = ringLoadsOf(op, homes);
  SmallVector<std::pair<Operation *, tile::DotOp>> readers;
  for (tile::LoadOp load : loads) {
    pipelined.insert(load);
    readers.push_back(firstAndLastDot(load));
    if (!readers.back().first)
      return fail(load, "a ring tile must be read by tile.dot ops of the "
                        "loop body itself");
  }
  // The turns (pingPong): the last warpgroup hands the first one its first
  // turn, and the first one takes the last one's final hand-over after the
  // loop, so that every bar.sync meets exactly one bar.arrive.
  if (place.pingPong)
    g.ifThen(
        g.cmp(arith::CmpIPredicate::eq, wgIdx, g.c32(place.warpgroups() - 1)),
        [&] { g.namedBarrierArrive(g.c32(kFirstTurnBarrier), 256); });
  LogicalResult r = lowerLoopBody(op, [&]() -> LogicalResult {
    for (auto [i, l] : llvm::enumerate(loads)) {
      auto [stage, parity] = ringPosition(op, loopIv, i);
      awaitRingStage(l, readers[i], int64_t(i), stage, parity);
    }
    return success();
  });
  if (place.pingPong)
    g.ifThen(g.cmp(arith::CmpIPredicate::eq, wgIdx, g.c32(0)),
             [&] { g.namedBarrierSync(g.c32(kFirstTurnBarrier), 256); });
  if (queryLoad && succeeded(r)) {
    // The loop read Q last (describeTensorMaps): once its products are
    // done, the producer may copy the next tile's.
    settle(/*wait=*/true);
    g.mbarrierArrive(queryBarrier(/*empty=*/true));
  }
  return r;
}

bool TileKernelLowering::takesTurn(tile::DotOp first) {
  if (!place.pingPong || !inRoleBranch || !ringLoop ||
      first->getParentOp() != ringLoop.getOperation())
    return false;
  if (place.pingPong == 3)
    return false; // turns at the unit, not at the tensor cores
  if (place.pingPong == 2)
    return true;
  for (Operation &op : ringLoop.getBody()->without_terminator())
    if (auto dot = dyn_cast<tile::DotOp>(&op))
      return dot == first;
  return false;
}

/// Whether \p op takes the multi-function unit a score: an exp2 or a tanh
/// of a 2-D tile (a row's rescale factor, 1-D, does not count).
static bool isScoreTranscendental(Operation *op) {
  if (!isa<math::Exp2Op, math::TanhOp>(op))
    return false;
  auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  return type && type.getRank() == 2;
}

Operation *TileKernelLowering::unitTurnStart(Block &block) {
  if (place.pingPong != 3 || !inRoleBranch || !ringLoop ||
      &block != ringLoop.getBody())
    return nullptr;
  // The first op of the body that follows its last product or is, or
  // holds, a score's tanh or exp2: the overlapped loop's softmax once both
  // its products are issued (T42-2 measured this one), the plain loop's
  // between S and P V (whose product then issues inside the turn).
  Operation *lastDot = nullptr;
  for (Operation &op : block.without_terminator())
    if (isa<tile::DotOp>(op))
      lastDot = &op;
  bool afterLastDot = !lastDot;
  for (Operation &op : block.without_terminator()) {
    WalkResult found = op.walk([](Operation *inner) {
      return isScoreTranscendental(inner) ? WalkResult::interrupt()
                                          : WalkResult::advance();
    });
    if (afterLastDot || found.wasInterrupted())
      return &op;
    afterLastDot = &op == lastDot;
  }
  return nullptr;
}

void TileKernelLowering::waitTurn() {
  g.namedBarrierSync(g.add(wgIdx, g.c32(kFirstTurnBarrier)), 256);
}

void TileKernelLowering::passTurn() {
  Value next = g.remU(g.add(wgIdx, g.c32(1)), g.c32(place.warpgroups()));
  g.namedBarrierArrive(g.add(next, g.c32(kFirstTurnBarrier)), 256);
}

void TileKernelLowering::waitForQuery() {
  if (!queryPending)
    return;
  g.mbarrierWait(queryBarrier(/*empty=*/false), tileParity);
  queryPending = false;
}

bool TileKernelLowering::placeRingEpilogueLoad(tile::LoadOp load) {
  auto r = llvm::find_if(ringEpilogue,
                         [&](const RingLead &e) { return e.load == load; });
  if (r == ringEpilogue.end())
    return false;
  auto [stage, parity] = tailPosition(*r);
  awaitRingStage(load, firstAndLastDot(load), r->stream, stage, parity);
  return true;
}

void TileKernelLowering::awaitRingStage(
    tile::LoadOp load, std::pair<Operation *, tile::DotOp> readers,
    int64_t stream, Value stage, Value parity) {
  stageShift[load.getResult()] = g.mul(stage, g.c32(ringStageBytes));
  ringWaits[readers.first].push_back({stream, stage, parity});
  ringReleases[readers.second.getResult()].push_back({stream, stage, parity});
}

void TileKernelLowering::waitForRing(tile::DotOp op) {
  if (!ringLoop->isAncestor(op))
    waitForQuery(); // a product before the loop (the overlapped loop's)
  auto it = ringWaits.find(op);
  if (it == ringWaits.end())
    return;
  for (const RingUse &u : it->second)
    g.mbarrierWait(ringBarrier(u.stream, /*empty=*/false, u.stage), u.parity);
  ringWaits.erase(it);
  if (ringMaps.empty())    // (tensor copies are the async proxy, as wgmma)
    wg->fenceProxyAsync(); // cp.async's writes, read by wgmma
}

void TileKernelLowering::releaseRing(ArrayRef<Value> done) {
  for (Value v : done)
    if (auto it = ringReleases.find(v); it != ringReleases.end()) {
      for (const RingUse &u : it->second)
        g.mbarrierArrive(ringBarrier(u.stream, /*empty=*/true, u.stage));
      ringReleases.erase(it);
    }
}
