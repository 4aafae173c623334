//===- TileToGPUWgmma.cpp - tile.dot on Hopper's warpgroup MMAs -----------===//
//
/// \file
/// The products of a kernel placed on warpgroup MMAs (KernelPlacement::
/// wgmma, sm_90a; Wgmma.h): each warpgroup multiplies the 64 rows of its
/// four warps, with the operands in shared memory read through matrix
/// descriptors, or the lhs from registers. The accumulator layout per warp
/// is mma.sync's, so every other op family lowers as it does there.
///
/// The MMAs run asynchronously, and this file also decides when they are
/// waited for:
///   - a batch is a run of adjacent products that do not read each other:
///     the registers they read are pinned, one wgmma.fence, their MMAs,
///     one commit;
///   - the first op that reads a product in flight (or any branch, loop or
///     block end) waits for every MMA in flight (wait_group 0) and takes
///     their results through a pin, so that no read moves above the wait.
/// With split commits (KernelPlacement::splitCommits, the dK/dV kernel's
/// default) each product of a batch commits a group of its own, so a
/// reader waits only for the groups up to the one it reads (wait_group n).
/// Before the lowering, batchReadyProducts moves each product next to the
/// first one it could be issued with. For the backward's dK/dV kernel this
/// gives per step: S^T with dP^T (with split commits P waits for S^T
/// alone); dV (in flight while dS is computed); and dK, left in flight
/// across the barrier of dQ = dS K, or, with split commits, dQ issued
/// first and dK left in flight under dQ's reductions. Before (the tile
/// IR's order):
///
///   %st  = tile.dot %k, %q {transpose_rhs}      // S^T
///   ... P from %st ...
///   %dv  = tile.dot %pt, %do acc %dv0           // dV += P^T dO
///   %dpt = tile.dot %v, %do {transpose_rhs}     // dP^T: %v, %do exist
///                                               // before S^T
/// After:
///
///   %st  = tile.dot %k, %q {transpose_rhs}
///   %dpt = tile.dot %v, %do {transpose_rhs}     // the same batch
///   ... P from %st ...
///   %dv  = tile.dot %pt, %do acc %dv0
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;
using flashjit::gpu::Major;

void conversion::batchReadyProducts(func::FuncOp fn, bool transposedFirst) {
  fn.walk([&](Block *block) {
    SmallVector<tile::DotOp> dots(block->getOps<tile::DotOp>());
    for (auto [i, dot] : llvm::enumerate(dots)) {
      // Whether every operand exists before \p first (defined outside the
      // block, a block argument, or by an op above it).
      auto readyBefore = [&, dot = dot](tile::DotOp first) {
        return llvm::all_of(dot->getOperands(), [&](Value v) {
          Operation *def = v.getDefiningOp();
          return !def || def->getBlock() != block ||
                 def->isBeforeInBlock(first);
        });
      };
      for (tile::DotOp first : ArrayRef(dots).take_front(i)) {
        if (!readyBefore(first))
          continue;
        if (first->getNextNode() != dot.getOperation())
          dot->moveAfter(first);
        break;
      }
    }
    if (!transposedFirst)
      return;
    for (auto dot : llvm::make_early_inc_range(block->getOps<tile::DotOp>())) {
      if (!dot.getTransposeLhs())
        continue;
      // Above each product right before it that it does not read, while
      // its operands are defined above that product (or outside).
      while (auto prev = dyn_cast_or_null<tile::DotOp>(dot->getPrevNode())) {
        bool ready = !prev.getTransposeLhs() &&
                     llvm::all_of(dot->getOperands(), [&](Value v) {
                       Operation *def = v.getDefiningOp();
                       return def != prev.getOperation() &&
                              (!def || def->getBlock() != block ||
                               def->isBeforeInBlock(prev));
                     });
        if (!ready)
          break;
        dot->moveBefore(prev);
      }
    }
  });
}

void TileKernelLowering::runAfterCommit() {
  if (!afterCommit || b.getInsertionBlock() != afterCommitBlock)
    return;
  auto issue = std::move(afterCommit);
  afterCommit = nullptr;
  afterCommitResult = issue();
}

void TileKernelLowering::settle(bool wait) {
  if (batchOpen) {
    if (batchUncommitted) {
      wg->commit();
      ++commits;
      runAfterCommit(); // the tensor cores are busy: the next copies now
    }
    batchOpen = batchUncommitted = false;
    if (batchTookTurn)
      passTurn();
    batchTookTurn = false;
  }
  if (wait && !inFlight.empty())
    waitUntil(commits - 1);
}

void TileKernelLowering::waitFor(Operation *op) {
  int64_t newest = -1;
  op->walk([&](Operation *inner) {
    for (Value v : inner->getOperands())
      if (auto *it = llvm::find(inFlight, v); it != inFlight.end())
        newest = std::max(newest, inFlightGroups[it - inFlight.begin()]);
  });
  if (newest >= 0)
    waitUntil(newest);
}

/// wait_group n for commit group \p group (n: the groups after it), then
/// the results of it and of every older group pinned, their ring stages
/// given back.
void TileKernelLowering::waitUntil(int64_t group) {
  wg->wait(commits - 1 - group);
  SmallVector<Value> done, left;
  SmallVector<int64_t> leftGroups;
  for (auto [v, gr] : llvm::zip(inFlight, inFlightGroups)) {
    if (gr > group) {
      left.push_back(v);
      leftGroups.push_back(gr);
      continue;
    }
    Fragment &f = frags[v];
    SmallVector<Value> pinned = wg->pin(f.regs);
    f.regs.assign(pinned.begin(), pinned.end());
    // The A registers it read stay live to here: ptxas ends their live
    // range at the MMA's issue, so a value written into them before this
    // wait would race with the MMA (T29: the overlapped loop's next P,
    // rounded in a branch before the wait, did).
    if (auto it = lhsInFlight.find(v); it != lhsInFlight.end()) {
      wg->pin(it->second);
      lhsInFlight.erase(it);
    }
    done.push_back(v);
  }
  releaseRing(done);
  inFlight = std::move(left);
  inFlightGroups = std::move(leftGroups);
}

/// The A registers of rounded tile \p f (the warp's 16 rows, mt = 1): four
/// b32 per 16 columns, as m16n8k16 takes them.
static SmallVector<Value> packA(flashjit::gpu::GpuBuilder &g,
                                const Fragment &f) {
  SmallVector<Value> a;
  for (size_t i = 0; i + 7 < f.regs.size(); i += 8)
    for (size_t j = 0; j < 8; j += 2)
      a.push_back(g.pack2(f.regs[i + j], f.regs[i + j + 1]));
  return a;
}

/// Whether \p dot only accumulates onto \p before's result, its one use,
/// issued in the same batch on the same registers (the bias product after
/// Q K^T: dialects/Attn/Transforms/BiasProduct.cpp). Not with split
/// commits, where each product's group is waited for alone.
bool TileKernelLowering::chainsOnto(tile::DotOp dot, tile::DotOp before) {
  Value r = before.getResult();
  return !place.splitCommits && dot.getAcc() == r && dot.getLhs() != r &&
         dot.getRhs() != r && r.hasOneUse();
}

void TileKernelLowering::openBatch(tile::DotOp first) {
  if (takesTurn(first)) {
    waitTurn();
    batchTookTurn = true;
  }
  SmallVector<tile::DotOp> run;
  for (Operation *op = first; op; op = op->getNextNode()) {
    auto dot = dyn_cast<tile::DotOp>(op);
    if (!dot || dot.getTransposeLhs() || llvm::any_of(run, [&](tile::DotOp d) {
          return llvm::is_contained(dot->getOperands(), d.getResult()) &&
                 !chainsOnto(dot, d);
        }))
      break;
    run.push_back(dot);
  }
  // The registers the batch reads and writes, pinned before the fence.
  SmallVector<Value> live;
  SmallVector<std::pair<Value, size_t>> spans; // (value or dot result, size)
  llvm::SmallPtrSet<void *, 4> packing;
  batchRun.clear();
  for (tile::DotOp dot : run) {
    batchRun.insert(dot);
    if (Value acc = dot.getAcc();
        acc && llvm::is_contained(run, acc.getDefiningOp<tile::DotOp>())) {
      // Chained: its accumulator is the registers of the product before.
    } else if (acc) {
      live.append(frags[acc].regs.begin(), frags[acc].regs.end());
      spans.push_back({acc, frags[acc].regs.size()});
    } else {
      // Not read: the product's first MMA has scale-d 0 (lowerWgmmaDot),
      // so no register is zeroed for it.
      int64_t n = regCount(dot.getType());
      live.append(n, LLVM::UndefOp::create(b, g.f32));
      spans.push_back({dot.getResult(), size_t(n)});
    }
    // A rounded lhs's pairs (packed here, or carried so by a loop).
    Value lhs = dot.getLhs();
    if (homes.lookup(lhs) == TileHome::Registers && frags[lhs].pendingRound &&
        packing.insert(lhs.getAsOpaquePointer()).second) {
      SmallVector<Value> a = frags[lhs].packed.empty()
                                 ? packA(g, frags[lhs])
                                 : SmallVector<Value>(frags[lhs].packed);
      live.append(a);
      spans.push_back({lhs, a.size()});
    }
  }
  SmallVector<Value> pinned = wg->pin(live);
  size_t at = 0;
  for (auto [v, n] : spans) {
    ArrayRef<Value> part = ArrayRef<Value>(pinned).slice(at, n);
    at += n;
    if (auto dot = v.getDefiningOp<tile::DotOp>();
        dot && llvm::is_contained(run, dot) && v == dot.getResult())
      pinnedInit[dot].assign(part.begin(), part.end());
    else if (frags[v].pendingRound)
      frags[v].packed.assign(part.begin(), part.end());
    else
      frags[v].regs.assign(part.begin(), part.end());
  }
  for (tile::DotOp dot : run)
    if (homes.lookup(dot.getLhs()) == TileHome::Registers &&
        frags[dot.getLhs()].pendingRound)
      lhsInFlight[dot.getResult()] = frags[dot.getLhs()].packed;
  wg->fence();
  batchOpen = true;
}

/// Two placements, each one MMA per k-step of 16 for the warpgroup's 64
/// rows:
///
///   %st = tile.dot %k, %q {transpose_rhs}   // both shared, K-major
///     -> wgmma.m64n<rows of %q>k16, A = %k's rows of the warpgroup, B = %q
///   %dv = tile.dot %pth, %do acc %dv0       // lhs rounded registers
///     -> wgmma.m64n<cols of %do>k16, A = %pth's pairs, B = %do MN-major
///
/// In a blocked tile, k-step ks sits in 64-column block ks / 4 at byte
/// (ks % 4) * 32 of each 128-byte row.
LogicalResult TileKernelLowering::lowerWgmmaDot(tile::DotOp op) {
  if (!batchOpen)
    openBatch(op);
  Value lhs = op.getLhs(), rhs = op.getRhs();
  if (homes.lookup(rhs) != TileHome::Shared)
    return fail(op, "the rhs of a warpgroup MMA must be a shared tile");
  const int64_t rhsRows = tileType(rhs).getDimSize(0);
  SmallVector<Value> d =
      op.getAcc() ? frags[op.getAcc()].regs : pinnedInit.lookup(op);
  if (homes.lookup(lhs) == TileHome::Shared && op.getTransposeRhs()) {
    const int64_t lhsRows = tileType(lhs).getDimSize(0);
    if (rhsRows % 8 != 0 || rhsRows > 256)
      return fail(op, "a warpgroup MMA's N is a multiple of 8 up to 256");
    Value aTile = g.add(slotOffset(lhs), g.mul(wgIdx, g.c32(64 * 128)));
    Value bTile = slotOffset(rhs);
    for (int64_t ks = 0; ks < slots[lhs].padCols / 16; ++ks) {
      const int64_t inRow = (ks % 4) * 32;
      Value a =
          wg->descriptor(g.add(aTile, g.c32((ks / 4) * lhsRows * 128 + inRow)),
                         Major::K, lhsRows * 128);
      Value bd =
          wg->descriptor(g.add(bTile, g.c32((ks / 4) * rhsRows * 128 + inRow)),
                         Major::K, rhsRows * 128);
      d = wg->mma(rhsRows, d, a, {}, bd, false, false,
                  /*accumulate=*/op.getAcc() || ks > 0);
    }
  } else if (homes.lookup(lhs) == TileHome::Registers &&
             !op.getTransposeRhs() && frags[lhs].pendingRound) {
    const int64_t cols = slots[rhs].padCols;
    if (cols > 256)
      return fail(op, "a warpgroup MMA's N is at most 256");
    ArrayRef<Value> a = frags[lhs].packed;
    Value bTile = slotOffset(rhs);
    for (int64_t kk = 0; kk < int64_t(a.size()) / 4; ++kk) {
      Value bd = wg->descriptor(g.add(bTile, g.c32(kk * 16 * 128)), Major::MN,
                                rhsRows * 128);
      d = wg->mma(cols, d, Value(), a.slice(4 * kk, 4), bd, false, true,
                  /*accumulate=*/op.getAcc() || kk > 0);
    }
  } else {
    return fail(op, "this operand placement is not lowered on warpgroup "
                    "MMAs");
  }
  frags[op.getResult()].regs.assign(d.begin(), d.end());
  if (Value acc = op.getAcc(); acc && batchRun.contains(acc.getDefiningOp())) {
    // Chained onto a product of this batch: its result takes that one's
    // place in flight (one set of registers), and its ring stages with it.
    auto *it = llvm::find(inFlight, acc);
    if (it != inFlight.end()) {
      inFlightGroups.erase(inFlightGroups.begin() + (it - inFlight.begin()));
      inFlight.erase(it);
    }
    if (auto rel = ringReleases.find(acc); rel != ringReleases.end()) {
      auto uses = std::move(rel->second);
      ringReleases.erase(rel);
      ringReleases[op.getResult()] = std::move(uses);
    }
  }
  inFlight.push_back(op.getResult());
  inFlightGroups.push_back(commits); // the open batch's, once committed
  batchUncommitted = true;
  if (place.splitCommits) {
    // A group of its own: a reader of this product waits for it alone.
    // The loop's next copies follow the batch's last product.
    wg->commit();
    ++commits;
    if (!batchRun.contains(op->getNextNode()))
      runAfterCommit();
    batchUncommitted = false;
  }
  return success();
}

/// dQ = dS K on warpgroup MMAs, both operands MN-major in shared memory
/// (dS^T staged, K resident): the warpgroups split the columns in 64-wide
/// blocks where they can, else the keys (each adding its keys' share).
/// Before:
///
///   %dq = tile.dot %dsh, %k {transpose_lhs} : ... -> tensor<64x128xf32>
///   tile.atomic_add %dq, %dq_accum[...] ...
///
/// After: commit (the batch before stays in flight); fence.proxy.async;
/// barrier; fence; wgmma.m64n<N>k16 per 16 keys (the first with scale-d 0:
/// no zeroed accumulator registers); commit (issueWgmmaTransposed, at the
/// tile.atomic_add, or at the tile.dot with KernelPlacement::splitCommits);
/// then (lowerWgmmaTransposed) wait_group for its group (0 unless products
/// were issued after it: with split commits, dK = dS^T Q runs on under
/// the reductions), with the older ones; then, with a staging tile
/// (KernelPlacement::dqStageCols) and an aligned dq_accum, the tile added
/// in bulk (reduceTileInBulk), else red.global.add(.v2) of the thread's
/// registers, warp w % 4 holding rows 16 (w % 4) ...
LogicalResult TileKernelLowering::issueWgmmaTransposed(tile::DotOp op) {
  Value lhs = op.getLhs(), rhs = op.getRhs();
  const int64_t keys = tileType(lhs).getDimSize(0);
  const int64_t cols = roundUp(op.getType().getDimSize(1), 16);
  if (op.getType().getDimSize(0) != 64)
    return fail(op, "a transposed warpgroup product has 64 rows");
  const int64_t groups = place.warpgroups();
  const bool byCols = (cols / groups) % 64 == 0;
  const int64_t n = dqWarpgroupCols(cols, groups);
  const int64_t groupKeys = byCols ? keys : keys / groups;
  if (n > 256 || n % 8 != 0)
    return fail(op, "a warpgroup MMA's N is a multiple of 8 up to 256");
  settle(/*wait=*/false);
  wg->fenceProxyAsync(); // the staged lhs, stored above, is read by wgmma
  g.barrier();
  SmallVector<Value> d(n / 2, LLVM::UndefOp::create(b, g.f32));
  wg->fence();
  Value kTile =
      g.add(slotOffset(rhs),
            byCols ? g.mul(wgIdx, g.c32(n / 64 * keys * 128)) : g.c32(0));
  Value keyBytes = byCols ? g.c32(0) : g.mul(wgIdx, g.c32(groupKeys * 128));
  // The k-steps' offsets as one value plus a constant (Wgmma::descriptor).
  Value aKeys = g.add(g.c32(staging[lhs].offset), keyBytes);
  Value bKeys = g.add(kTile, keyBytes);
  for (int64_t ks = 0; ks < groupKeys / 16; ++ks) {
    Value a = wg->descriptor(g.add(aKeys, g.c32(ks * 16 * 128)), Major::MN,
                             keys * 128);
    Value bd = wg->descriptor(g.add(bKeys, g.c32(ks * 16 * 128)), Major::MN,
                              keys * 128);
    d = wg->mma(n, d, a, {}, bd, true, true, /*accumulate=*/ks > 0);
  }
  frags[op.getResult()].regs.assign(d.begin(), d.end());
  inFlight.push_back(op.getResult());
  inFlightGroups.push_back(commits);
  issuedTransposed.insert(op.getResult());
  batchOpen = batchUncommitted = true;
  settle(/*wait=*/false);
  return success();
}

LogicalResult
TileKernelLowering::lowerWgmmaTransposed(tile::DotOp op,
                                         tile::AtomicAddOp atomic) {
  // (The comment above issueWgmmaTransposed shows both parts.) Issued here,
  // after the batch before it, unless already issued where it stands
  // (KernelPlacement::splitCommits); then waited for (with the older groups;
  // the newer stay in flight).
  if (!issuedTransposed.contains(op.getResult()) &&
      failed(issueWgmmaTransposed(op)))
    return failure();
  waitFor(atomic);
  const int64_t cols = roundUp(op.getType().getDimSize(1), 16);
  const int64_t groups = place.warpgroups();
  const bool byCols = (cols / groups) % 64 == 0;
  const int64_t n = dqWarpgroupCols(cols, groups);

  ReductionTarget red = reductionOf(atomic);
  const Fragment &f = frags[op.getResult()];
  Value warp = g.divU(tid, g.c32(32));
  Value colBase = byCols ? g.mul(wgIdx, g.c32(n)) : g.c32(0);
  Value q0 = g.add(g.mul(g.remU(warp, g.c32(4)), g.c32(16)), grp);
  auto byThreads = [&] {
    Value col0 = g.add(colBase, g.mul(tig, g.c32(2)));
    for (int64_t h = 0; h < 2; ++h) {
      // One branch per row around its reductions (reduceAdd).
      Value q = g.add(q0, g.c32(8 * h));
      g.ifThen(red.rowExists(g, q), [&] {
        for (int64_t j = 0; j < n / 8; ++j)
          reducePair(g, red, q, col0, 8 * j, f.regs[4 * j + 2 * h],
                     f.regs[4 * j + 2 * h + 1], /*rowChecked=*/true);
      });
    }
  };
  // Quad order (tile.atomic_add's `quad_order`): per row and 16-column
  // group, the thread's columns 2 tig, 2 tig + 1 (n-tile 2k) and 2 tig + 8,
  // 2 tig + 9 (n-tile 2k + 1) lie at 4 tig .. 4 tig + 3 of the group: one
  // 16-byte reduction of four registers, where the base is 16-byte aligned
  // (dq_accum's rows are, their columns a multiple of 16).
  auto byQuads = [&] {
    Value col0 = g.add(colBase, g.mul(tig, g.c32(4)));
    for (int64_t h = 0; h < 2; ++h) {
      Value q = g.add(q0, g.c32(8 * h));
      g.ifThen(red.rowExists(g, q), [&] {
        Value rowAt = red.rowOffset(g, q);
        Value at = LLVM::GEPOp::create(
            b, g.ptrGen, g.f32, red.base,
            ArrayRef<LLVM::GEPArg>{g.add(rowAt, g.ext64(col0))});
        for (int64_t k = 0; k < n / 16; ++k) {
          Value ok = red.checkCols
                         ? g.cmp(arith::CmpIPredicate::slt,
                                 g.add(colBase, g.c32(16 * k)), g.c32(red.cols))
                         : Value();
          Value ptr = LLVM::GEPOp::create(
              b, g.ptrGen, g.f32, at,
              ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(16 * k)});
          const int64_t lo = 4 * (2 * k) + 2 * h, hi = 4 * (2 * k + 1) + 2 * h;
          g.reduceAdd4(
              ok, ptr,
              {f.regs[lo], f.regs[lo + 1], f.regs[hi], f.regs[hi + 1]});
        }
      });
    }
  };
  if (red.quads && place.dqStageCols)
    return fail(op, "dQ's bulk reductions stage rows in column order: "
                    "quad_order takes the threads' reductions");
  Value aligned = red.baseAligned(g);
  if (red.quadVectors && n % 16 == 0) {
    g.ifThen(aligned, byQuads);
    g.ifThen(g.xorI(aligned, g.cBool(true)), byThreads);
    return success();
  }
  if (!place.dqStageCols) {
    byThreads();
    return success();
  }
  if (place.dqStageCols != n)
    return fail(op, "the dQ staging tile does not match the warpgroup's "
                    "columns");
  // Bulk reductions want 16-byte aligned rows: dq_accum's are where its
  // base is (its rows hold a multiple of 16 floats, and it starts 16-byte
  // aligned in the workspace); a caller's workspace that is not keeps the
  // threads' reductions.
  g.ifThen(aligned, [&] {
    reduceTileInBulk(red, f, colBase, q0, byCols && groups > 1);
  });
  g.ifThen(g.xorI(aligned, g.cBool(true)), byThreads);
  return success();
}
