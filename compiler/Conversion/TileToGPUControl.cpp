//===- TileToGPUControl.cpp - Loops and branches over tiles ---------------===//
//
/// \file
/// The control-flow op family of the tile lowering (TileToGPU.h): scf.for
/// and scf.if carrying tiles carry their registers instead, and the loop
/// over KV blocks gets its software pipeline here.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

SmallVector<Value> TileKernelLowering::flatten(ValueRange values) {
  SmallVector<Value> flat;
  for (Value v : values) {
    if (!isTile(v)) {
      flat.push_back(scalar(v));
      continue;
    }
    const Fragment &f = frags[v];
    if (!f.pendingRound) {
      flat.append(f.regs.begin(), f.regs.end());
      continue;
    }
    // A rounded tile (a loop carries P so): its pairs, as an MMA reads them.
    if (!f.packed.empty()) {
      flat.append(f.packed.begin(), f.packed.end());
      continue;
    }
    for (size_t i = 0; i + 1 < f.regs.size(); i += 2)
      flat.push_back(g.pack2(f.regs[i], f.regs[i + 1]));
  }
  return flat;
}

/// The registers' types of \p values, flattened as flatten() does.
static SmallVector<Type> flatTypes(ValueRange values,
                                   function_ref<int64_t(Value)> count) {
  SmallVector<Type> types;
  for (Value v : values) {
    auto ty = dyn_cast<RankedTensorType>(v.getType());
    if (!ty) {
      types.push_back(v.getType());
      continue;
    }
    types.append(count(v), ty.getElementType());
  }
  return types;
}

/// Splits \p flat back into \p values' registers (tiles) and scalars.
static void unflatten(ValueRange values, ValueRange flat,
                      function_ref<int64_t(Value)> count,
                      function_ref<void(Value, ArrayRef<Value>)> assign) {
  SmallVector<Value> all(flat.begin(), flat.end());
  size_t at = 0;
  for (Value v : values) {
    int64_t n = isa<RankedTensorType>(v.getType()) ? count(v) : 1;
    assign(v, ArrayRef<Value>(all).slice(at, n));
    at += n;
  }
}

/// Whether \p v is a 16-bit register tile: one rounded from f32 (arith.
/// truncf), carried by a loop as its b32 pairs (flatten()).
static bool isRounded(Value v, Type halfTy) {
  auto ty = dyn_cast<RankedTensorType>(v.getType());
  return ty && ty.getRank() == 2 && ty.getElementType() == halfTy;
}

void TileKernelLowering::assignFlat(ValueRange values, ValueRange flat) {
  unflatten(
      values, flat,
      [&](Value v) {
        return regCount(tileType(v)) / (isRounded(v, g.halfTy) ? 2 : 1);
      },
      [&](Value v, ArrayRef<Value> regs) {
        if (!isTile(v)) {
          map.map(v, regs[0]);
          return;
        }
        Fragment &f = frags[v];
        if (!isRounded(v, g.halfTy)) {
          f.regs.assign(regs.begin(), regs.end());
          return;
        }
        f.pendingRound = true;
        f.regs.clear();
        f.packed.assign(regs.begin(), regs.end());
        for (Value pair : regs) {
          auto [lo, hi] = g.unpack2(pair);
          f.regs.append({lo, hi});
        }
      });
}

/// Whether \p v is a constant tile of +0.0.
static bool isPositiveZero(Value v) {
  auto c = v.getDefiningOp<arith::ConstantOp>();
  auto zero = c ? dyn_cast<DenseFPElementsAttr>(c.getValue()) : nullptr;
  return zero && zero.isSplat() && zero.getSplatValue<APFloat>().isPosZero();
}

/// \p v's defining op when it is a sum-reduce that nothing else reads.
static tile::ReduceOp soleSum(Value v) {
  auto sum = v.getDefiningOp<tile::ReduceOp>();
  return sum && sum.getKind() == "sum" && sum->hasOneUse() ? sum : nullptr;
}

/// The sum-reduce that starts a running sum in the select form
/// (deferRunningSums), if any; \p zero: the start is the constant 0.
static tile::ReduceOp firstSum(Value init, bool &zero) {
  zero = isPositiveZero(init);
  auto select = init.getDefiningOp<arith::SelectOp>();
  if (zero || !select || !isPositiveZero(select.getFalseValue()) ||
      !select->hasOneUse())
    return nullptr;
  return soleSum(select.getTrueValue());
}

/// Running row sums, `%l2 = %l * %a + tile.reduce "sum" %p dim 1` with %l
/// an iter_arg starting at 0 and used by that multiply alone, are kept per
/// lane: each of a row's 4 lanes carries the sum of its own columns, and
/// the lanes are combined by two shuffles after the loop, not in every
/// iteration (FlashAttention-2's order). Only the association of the f32
/// sum changes, which a reduction leaves to the implementation.
///
/// The start may also be `select(%c, tile.reduce "sum" %p0 dim 1, 0)` (the
/// overlapped loop's first block, summed before it), its sum kept per lane
/// too: TileKernelLowering::run calls this once for every loop before
/// lowering anything, as that sum comes before the loop; lowerLoopBody
/// reads the loop's results from perLaneSums.
void TileKernelLowering::deferRunningSums(scf::ForOp op) {
  SmallVector<unsigned> &deferred = perLaneSums[op];
  auto yield = cast<scf::YieldOp>(op.getBody()->getTerminator());
  for (unsigned i = 0; i < op.getNumRegionIterArgs(); ++i) {
    Value arg = op.getRegionIterArgs()[i];
    auto add = yield.getOperand(i).getDefiningOp<arith::AddFOp>();
    bool zero = false;
    tile::ReduceOp first = firstSum(op.getInitArgs()[i], zero);
    if (!add || !(zero || first) || !arg.hasOneUse() || !add->hasOneUse() ||
        tileType(arg).getRank() != 1)
      continue;
    auto mul = add.getLhs().getDefiningOp<arith::MulFOp>();
    tile::ReduceOp sum = soleSum(add.getRhs());
    if (!mul || !sum || mul.getLhs() != arg || !mul->hasOneUse())
      continue;
    deferredSums.insert(sum);
    if (first)
      deferredSums.insert(first);
    deferred.push_back(i);
  }
}

/// A loop carrying tiles carries their registers. Before:
///
///   %r:3 = scf.for %t = %lo to %hi step %c1 iter_args(%o = %o0, %m = %m0,
///       %l = %l0) -> (tensor<64x96xf32>, tensor<64xf32>, tensor<64xf32>) {
///     %k = tile.load %K[...] rows %n0 ...   // feeds the first dot
///     %v = tile.load %V[...] rows %n0 ...   // feeds the second
///     ... tile.dot %q, %k ... tile.dot %p, %v ...
///   }
///
/// After (the pipeline of single-buffered shared tiles: each slot is
/// refilled as soon as its reader is done):
///
///   cp.async K(lo); commit                  // prologue, if lo < hi
///   %r:N = scf.for %t = %lo to %hi step %c1 iter_args(<registers>) {
///     wait_all; barrier                     // K(t) landed; V free
///     cp.async V(t); commit
///     ... S = Q K^T ... softmax ...
///     wait_all; barrier                     // V(t) landed; K free
///     scf.if (%t + 1 < %hi) { cp.async K(t + 1); commit }
///     ... O += P V ...
///   }
///
/// In general, with shared loads L_1 .. L_n (n >= 2) ordered by their first
/// dots D_1 .. D_n: before D_i, wait and barrier, then L_{i-1}(t + 1)
/// (i > 1) or L_n(t) (i = 1); L_1(lo) before the loop. A single shared load
/// is copied in place, after a barrier.
TileKernelLowering::LoopLanes TileKernelLowering::enterLoop() {
  LoopLanes outer{slotFrags, copyTid};
  for (auto &[v, f] : slotFrags)
    for (auto *a : {&f.a, &f.b, &f.bTrans})
      if (*a)
        *a = (*a)->inLoop(g);
  copyTid = g.opaque(tid);
  return outer;
}

void TileKernelLowering::leaveLoop(LoopLanes outer) {
  slotFrags = std::move(outer.slotFrags);
  copyTid = outer.copyTid;
}

LogicalResult TileKernelLowering::lowerFor(scf::ForOp op) {
  if (op == ringLoop)
    return lowerRingFor(op);
  Block *body = op.getBody();
  SmallVector<tile::LoadOp> loads;
  DenseMap<Operation *, Operation *> firstDot;
  for (Operation &inner : body->without_terminator()) {
    auto load = dyn_cast<tile::LoadOp>(&inner);
    if (!load || !slots.count(load.getResult()))
      continue;
    loads.push_back(load);
    if (homes.lookup(load.getResult()) != TileHome::Shared)
      continue;
    Operation *first = nullptr;
    for (Operation *user : load.getResult().getUsers()) {
      Operation *inBody = body->findAncestorOpInBlock(*user);
      if (inBody && (!first || inBody->isBeforeInBlock(first)))
        first = inBody;
    }
    if (!first || !isa<tile::DotOp>(first))
      return fail(load, "a pipelined shared tile must be read by a tile.dot "
                        "of the loop body itself");
    firstDot[load] = first;
  }
  if (doubleBuffered.count(op))
    return lowerDoubleBufferedFor(op, loads);
  llvm::sort(loads, [&](tile::LoadOp x, tile::LoadOp y) {
    return firstDot[x]->isBeforeInBlock(firstDot[y]);
  });
  const size_t n = loads.size();
  for (tile::LoadOp l : loads) // a body lowered once per branch
    beforeDot.erase(firstDot[l]);
  if (n >= 2)
    for (size_t i = 0; i < n; ++i) {
      beforeDot[firstDot[loads[i]]].issue.push_back(
          i > 0 ? std::make_pair(loads[i - 1], 1)
                : std::make_pair(loads[n - 1], 0));
      pipelined.insert(loads[i]);
    }
  if (n >= 2) {
    Value lb = scalar(op.getLowerBound()), ub = scalar(op.getUpperBound());
    Value any = arith::CmpIOp::create(b, arith::CmpIPredicate::slt, lb, ub);
    LogicalResult r = success();
    g.ifThen(any, [&] { r = issueCopy(loads[0], lb); });
    if (failed(r))
      return failure();
  }
  return lowerLoopBody(op, [] { return success(); });
}

/// The pipeline of a loop whose shared tiles are read by several dots (or
/// which reads per-column statistics): two stages of every slot of the
/// body, the second stageBytes after the first. On warpgroup MMAs one
/// barrier per iteration (the next copies go after it), and the copies are
/// issued after the iteration's first batch of MMAs, while the tensor cores
/// run it (afterCommit): their address arithmetic is off the path between
/// the MMAs. Before:
///
///   scf.for %t = %lo to %hi step %c1 iter_args(...) {
///     %q = tile.load %Q[...] rows %m0 ...     // read by two dots
///     %nl = tile.load %Delta[...] rows %m0 ... // per-column broadcasts
///     ...
///   }
///
/// After:
///
///   barrier                          // both stages free (outer loops)
///   scf.if (%lo < %hi) { cp.async <every slot>(lo) -> stage 0 }; commit
///   scf.for %t ... {
///     %off = ((t - lo) & 1) * stageBytes
///     barrier                        // the other stage is free
///     scf.if (%t + 1 < %hi) { cp.async <every slot>(t + 1) -> the other
///         stage }; commit
///     cp.async.wait_group 1; barrier // stage t landed
///     ... the body, reading each slot at its offset + %off ...
///   }
///
/// On warpgroup MMAs, the iteration instead:
///
///     cp.async.wait_all; fence.proxy.async; barrier // stage t landed, and
///                                    // every warp is done with the other
///     ... the first batch of MMAs; commit ...
///     scf.if (%t + 1 < %hi) { cp.async <every slot>(t + 1) -> the other
///         stage }; commit
///     ... the rest of the body ...
LogicalResult
TileKernelLowering::lowerDoubleBufferedFor(scf::ForOp op,
                                           ArrayRef<tile::LoadOp> loads) {
  const int64_t stageBytes = doubleBuffered[op];
  for (tile::LoadOp l : loads)
    pipelined.insert(l);
  Value lb = scalar(op.getLowerBound()), ub = scalar(op.getUpperBound());
  Value step = scalar(op.getStep());
  auto issueAll = [&](Value iv, Value shift) {
    return issueCopy(loads, iv, shift, /*commit=*/false);
  };
  const int64_t stages = place.bufferStages;
  g.barrier(); // every warp is done with every stage
  LogicalResult r = success();
  // Step lo + s * step, s in [0, S).
  auto stepAhead = [&](Value t, int64_t s) -> Value {
    if (s == 0)
      return t;
    if (s == 1)
      return arith::AddIOp::create(b, t, step);
    return arith::AddIOp::create(
        b, t,
        arith::MulIOp::create(b, step, arith::ConstantIndexOp::create(b, s)));
  };
  // The first S - 1 steps' copies, a group each (empty past the loop).
  for (int64_t s = 0; s + 1 < stages; ++s) {
    Value t = stepAhead(lb, s);
    Value shift = s ? g.c32(s * stageBytes) : Value();
    g.ifThen(arith::CmpIOp::create(b, arith::CmpIPredicate::slt, t, ub),
             [&] { r = issueAll(t, shift); });
    g.commitGroup();
    if (failed(r))
      return failure();
  }
  return lowerLoopBody(op, [&]() -> LogicalResult {
    Value k = arith::SubIOp::create(b, loopIv, lb);
    if (getConstantIntValue(op.getStep()) != 1)
      k = arith::DivUIOp::create(b, k, step);
    // Step k reads stage k % S and fills stage (k + S - 1) % S (the one
    // step k - 1 read) with step k + S - 1's copies.
    // (Two stages keep the and / subtraction form the measured kernels
    // were built with: LLVM does not fold rem into it.)
    Value stage = stages == 2 ? g.andI(toI32(k), g.c32(1))
                              : g.remU(toI32(k), g.c32(stages));
    Value here = g.mul(stage, g.c32(stageBytes));
    Value other =
        stages == 2
            ? g.mul(g.sub(g.c32(1), stage), g.c32(stageBytes))
            : g.mul(g.remU(g.add(stage, g.c32(stages - 1)), g.c32(stages)),
                    g.c32(stageBytes));
    Value next = stepAhead(loopIv, stages - 1);
    Value more = arith::CmpIOp::create(b, arith::CmpIPredicate::slt, next, ub);
    auto issueNext = [this, more, next, other, issueAll]() -> LogicalResult {
      LogicalResult issued = success();
      g.ifThen(more, [&] { issued = issueAll(next, other); });
      g.commitGroup();
      pendingCopies = false; // nothing in this iteration reads that stage
      return issued;
    };
    LogicalResult issued = success();
    if (wg) {
      // This stage (two stages: the only copies in flight; three: the next
      // step's group stays in flight).
      if (stages == 2)
        g.waitAll();
      else
        g.waitGroup(stages - 2);
      wg->fenceProxyAsync(); // cp.async's writes, read by wgmma
      g.barrier();           // ... landed for all; the other stage is free
      afterCommit = issueNext;
      afterCommitBlock = b.getInsertionBlock();
    } else {
      g.barrier(); // every warp is done with the other stage
      issued = issueNext();
      g.waitGroup(stages - 1); // this stage (and anything before it) landed
      g.barrier();
    }
    pendingCopies = false;
    for (tile::LoadOp l : loads) {
      stageShift[l.getResult()] = here;
      if (auto it = slotFrags.find(l.getResult()); it != slotFrags.end())
        for (auto *a : {&it->second.a, &it->second.b, &it->second.bTrans})
          if (*a)
            *a = (*a)->shifted(g, here);
    }
    return issued;
  });
}

LogicalResult
TileKernelLowering::lowerLoopBody(scf::ForOp op,
                                  function_ref<LogicalResult()> atTop) {
  // The counter stays an index (i64 after convert-gpu-to-nvvm): narrowing
  // it to i32 was measured to add spills (d = 256 windowed: 0 -> 88 bytes).
  Value lb = scalar(op.getLowerBound()), ub = scalar(op.getUpperBound());
  Value step = scalar(op.getStep());
  Block *body = op.getBody();
  SmallVector<unsigned> perLane = perLaneSums.lookup(op);
  SmallVector<Value> init = flatten(op.getInitArgs());
  for (Value v : op.getInitArgs())
    if (isTile(v) && frags[v].pendingRound != isRounded(v, g.halfTy))
      return fail(op, "a loop carries 16-bit tiles rounded from f32 only");
  auto loop = scf::ForOp::create(b, lb, ub, step, init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    map.map(op.getInductionVar(), loop.getInductionVar());
    assignFlat(op.getRegionIterArgs(), loop.getRegionIterArgs());
    LoopLanes outer = enterLoop();
    DenseMap<Value, Value> outerShift = stageShift;
    Value outerIv = loopIv, outerUb = loopUb, outerStep = loopStep;
    loopIv = loop.getInductionVar();
    loopUb = ub;
    loopStep = step;
    bool outerPending = pendingCopies;
    pendingCopies = false;
    auto outerAfterCommit = std::exchange(afterCommit, nullptr);
    Block *outerAfterCommitBlock = afterCommitBlock;

    if (failed(atTop()) || failed(lowerBlock(*body)))
      return failure();
    runAfterCommit(); // no batch in this block committed it
    afterCommit = std::move(outerAfterCommit);
    afterCommitBlock = outerAfterCommitBlock;
    if (failed(std::exchange(afterCommitResult, success())))
      return failure();
    auto yield = cast<scf::YieldOp>(body->getTerminator());
    for (Value v : yield.getOperands())
      if (isTile(v) && frags[v].pendingRound != isRounded(v, g.halfTy))
        return fail(op, "a loop carries 16-bit tiles rounded from f32 only");
    scf::YieldOp::create(b, flatten(yield.getOperands()));

    leaveLoop(std::move(outer));
    stageShift = std::move(outerShift);
    loopIv = outerIv;
    loopUb = outerUb;
    loopStep = outerStep;
    pendingCopies = outerPending || pendingCopies;
  }
  assignFlat(op.getResults(), loop.getResults());
  for (unsigned i : perLane)
    for (Value &r : frags[op.getResult(i)].regs) {
      r = g.fadd(r, g.shuffleXor(r, 1));
      r = g.fadd(r, g.shuffleXor(r, 2));
    }
  return success();
}

/// A branch yielding tiles yields their registers. Before:
///
///   %s2 = scf.if %straddles -> (tensor<64x32xf32>) {
///     ... scf.yield %masked ...
///   } else { scf.yield %s }
///
/// After: `scf.if %straddles -> (f32, ..., f32)` over the registers of
/// each branch's yield.
LogicalResult TileKernelLowering::lowerIf(scf::IfOp op) {
  auto count = [&](Value v) { return regCount(tileType(v)); };
  SmallVector<Type> types = flatTypes(op.getResults(), count);
  auto ifOp = scf::IfOp::create(b, types, scalar(op.getCondition()),
                                /*withElseRegion=*/true);
  for (auto [from, to] :
       {std::make_pair(&op.getThenRegion(), &ifOp.getThenRegion()),
        std::make_pair(&op.getElseRegion(), &ifOp.getElseRegion())}) {
    OpBuilder::InsertionGuard guard(b);
    Block *dest = &to->front();
    // An scf.if without results gets an implicit yield: lower before it.
    Operation *implicitYield = dest->empty() ? nullptr : dest->getTerminator();
    if (implicitYield)
      b.setInsertionPoint(implicitYield);
    else
      b.setInsertionPointToStart(dest);
    if (from->empty())
      continue;
    Block &src = from->front();
    if (failed(lowerBlock(src)))
      return failure();
    auto yield = cast<scf::YieldOp>(src.getTerminator());
    for (Value v : yield.getOperands())
      if (isTile(v) && frags[v].pendingRound)
        return fail(op, "a branch cannot yield a rounded tile");
    SmallVector<Value> flat = flatten(yield.getOperands());
    if (implicitYield)
      implicitYield->setOperands(flat);
    else
      scf::YieldOp::create(b, flat);
  }
  assignFlat(op.getResults(), ifOp.getResults());
  return success();
}
