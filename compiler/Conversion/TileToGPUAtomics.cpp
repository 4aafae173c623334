//===- TileToGPUAtomics.cpp - Transposed products reduced into memory -----===//
//
/// \file
/// The reduction op family of the tile lowering (TileToGPU.h): a product
/// whose lhs is a register tile read transposed, added into a global f32
/// accumulator by tile.atomic_add (the backward's dQ = dS K from the dK/dV
/// kernel, whose registers hold dS^T with the keys on the rows). The lhs
/// goes through a staging slot of shared memory; the product is spread over
/// the warps by 64-column groups (DqWarps, kernels/GpuGeometry.h), not in
/// the accumulator layout of the kernel's other tiles, and each thread
/// reduces its registers into memory by red.global.add.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"
#include "compiler/Conversion/TileToLoops.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;
using arith::CmpIPredicate;

/// Whether the index \p v is a multiple of \p k on every path: such a
/// constant, a product with such a factor, or a sum of such terms.
static bool knownMultiple(Value v, int64_t k) {
  if (std::optional<int64_t> c = getConstantIntValue(v))
    return *c % k == 0;
  if (auto mul = v.getDefiningOp<arith::MulIOp>())
    return knownMultiple(mul.getLhs(), k) || knownMultiple(mul.getRhs(), k);
  if (auto add = v.getDefiningOp<arith::AddIOp>())
    return knownMultiple(add.getLhs(), k) && knownMultiple(add.getRhs(), k);
  return false;
}

Value ReductionTarget::rowExists(gpu::GpuBuilder &g, Value q) const {
  return g.cmp(CmpIPredicate::slt, g.add(row0, q), bound);
}

Value ReductionTarget::rowOffset(gpu::GpuBuilder &g, Value q) const {
  return g.add(offset, g.mul(g.ext64(g.add(row0, q)), stride));
}

Value ReductionTarget::baseAligned(gpu::GpuBuilder &g) const {
  Value address = LLVM::PtrToIntOp::create(g.b, g.i64, base);
  return g.cmp(CmpIPredicate::eq, g.andI(address, g.c64(15)), g.c64(0));
}

void conversion::reducePair(gpu::GpuBuilder &g, const ReductionTarget &r,
                            Value q, Value col, int64_t colConst, Value v0,
                            Value v1, bool rowChecked) {
  Value rowOk = rowChecked ? Value() : r.rowExists(g, q);
  Value rowAt = r.rowOffset(g, q);
  // The column's constant part as the pointer's own offset (the
  // reduction's immediate): the sign extension of col + colConst would not
  // fold where col comes from the loops' opaque thread index. In quad
  // order the pair's place is a function of the whole column.
  Value physical =
      r.quads ? buildQuadColumn(g.b, g.add(col, g.c32(colConst))) : col;
  Value at = LLVM::GEPOp::create(
      g.b, g.ptrGen, g.f32, r.base,
      ArrayRef<LLVM::GEPArg>{g.add(rowAt, g.ext64(physical))});
  const int64_t atConst = r.quads ? 0 : colConst;
  for (int64_t e = 0; e < 2; e += r.pairs ? 2 : 1) {
    Value colOk = r.checkCols
                      ? g.cmp(CmpIPredicate::slt,
                              g.add(col, g.c32(colConst + e)), g.c32(r.cols))
                      : Value();
    Value ok = rowOk;
    if (colOk)
      ok = ok ? g.andI(ok, colOk) : colOk;
    Value ptr = LLVM::GEPOp::create(
        g.b, g.ptrGen, g.f32, at,
        ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(atConst + e)});
    if (r.pairs)
      g.reduceAdd2(ok, ptr, v0, v1);
    else
      g.reduceAdd(ok, ptr, e ? v1 : v0);
  }
}

ReductionTarget TileKernelLowering::reductionOf(tile::AtomicAddOp atomic) {
  ReductionTarget r;
  r.base = scalar(atomic.getBase());
  r.offset = toI64(scalar(atomic.getOffset()));
  r.stride = toI64(scalar(atomic.getStride()));
  r.row0 = toI32(scalar(atomic.getRow0()));
  r.bound = toI32(scalar(atomic.getRows()));
  RankedTensorType ty = tileType(atomic.getValue());
  r.cols = ty.getDimSize(1);
  r.quads = atomic.getQuadOrder();
  r.pairs = place.vectorAtomics && knownMultiple(atomic.getOffset(), 2) &&
            knownMultiple(atomic.getStride(), 2);
  r.quadVectors = r.pairs && r.quads && knownMultiple(atomic.getOffset(), 4) &&
                  knownMultiple(atomic.getStride(), 4);
  // Columns past the tile exist where the 64-column groups or the chunks
  // overhang it.
  const KernelPlacement::ColumnSplit *s =
      splitsCols(ty) ? activeSplit : nullptr;
  r.checkCols = r.cols % 64 != 0 || (s && s->chunk * s->chunks != r.cols);
  return r;
}

/// The rounded tile's registers, as element-type pairs, into its staging
/// slot (swizzled rows of 16-byte chunks, as TileCopy.h lays out a copied
/// tile), right where it is rounded: the MMAs that follow cover the
/// stores' latency. Before:
///
///   %dsh = arith.truncf %ds : tensor<128x64xf32> to tensor<128x64xbf16>
///   %dq = tile.dot %dsh, %k {transpose_lhs} ...
///
/// After, per m-tile mi, half h and n-tile ni of the thread:
///
///   st.shared.b32 [slot + swizzle(warp row + mi * 16 + 8 h + grp, ni * 8)
///       + 4 tig], cvt.rn.bf16x2(ds[mi, ni, 2 h], ds[mi, ni, 2 h + 1])
///
/// The thread's rows are all grp modulo 8 (the warp's first row is a
/// multiple of 16). Where the warp's first column is a multiple of 64 too,
/// n-tile ni sits in chunk 16 ((ni % 8) ^ grp) of its group of 8 chunks:
/// the lane's offset L of chunk 0 holds grp in bits 4..6 alone (rows and
/// groups are multiples of 128 bytes apart, 4 tig < 16), so every store is
/// at L ^ 16 (ni % 8) plus an immediate. Inside the loop that is L (one
/// register across it, from the kernel's thread indices) and seven XORs,
/// rather than a swizzle per store.
void TileKernelLowering::stageTransposed(Value v, const Fragment &f) {
  RankedTensorType ty = tileType(v);
  writeFragment(staging[v], ty.getDimSize(0), ty, f);
  staged = true;
}

void TileKernelLowering::writeFragment(const SharedSlot &slot, int64_t rows,
                                       RankedTensorType ty, const Fragment &f) {
  const int64_t nt = nTiles(ty);
  auto store = [&](int64_t mi, int64_t h, int64_t ni, Value ptr) {
    const Value *r = &f.regs[(mi * nt + ni) * 4 + 2 * h];
    LLVM::StoreOp::create(b, g.pack2(r[0], r[1]), ptr);
  };
  if (place.colParts == 1 || warpCols(ty) % 64 == 0) {
    // Blocked rows are 128 bytes apart, their 64-column blocks blockBytes;
    // plain rows rowChunks * 16 bytes (a multiple of 128), a group of 8
    // chunks 128.
    const int64_t pitch = place.wgmma ? 128 : slot.rowChunks * 16;
    const int64_t group = place.wgmma ? blockBytes(rows) : 128;
    Value col0 = colStart(ty);
    Value colBytes = place.wgmma ? g.mul(g.divU(col0, g.c32(64)), g.c32(group))
                                 : g.mul(col0, g.c32(2));
    Value lane =
        g.add(g.add(g.mul(g.add(warpRow0, grp), g.c32(pitch)), colBytes),
              g.add(g.mul(grp, g.c32(16)), g.mul(tig, g.c32(4))));
    if (copyTid)
      lane = g.opaque(lane);
    // The constant part is the pointer's own offset: the store's immediate.
    SmallVector<Value> lanePtrs;
    for (int64_t j = 0; j < 8; ++j)
      lanePtrs.push_back(
          g.sharedBytePtr(smem, j ? g.xorI(lane, g.c32(16 * j)) : lane));
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t ni = 0; ni < nt; ++ni)
          store(mi, h, ni,
                g.sharedBytePtr(lanePtrs[ni % 8],
                                g.c32(slot.offset + (mi * 16 + 8 * h) * pitch +
                                      ni / 8 * group)));
    return;
  }
  LaneIndices li = laneIndices();
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t h = 0; h < 2; ++h) {
      Value row = g.add(li.warpRow0, g.add(g.c32(mi * 16 + 8 * h), li.grp));
      for (int64_t ni = 0; ni < nt; ++ni) {
        Value col = g.add(colStart(ty), g.c32(ni * 8));
        Value chunkAt = place.wgmma
                            ? g.swizzledBlocked(row, col, blockBytes(rows))
                            : g.swizzled(row, col, slot.rowChunks);
        Value at =
            g.add(g.c32(slot.offset), g.add(chunkAt, g.mul(li.tig, g.c32(4))));
        store(mi, h, ni, g.sharedBytePtr(smem, at));
      }
    }
}

/// `tile.atomic_add (tile.dot %lhs, %rhs {transpose_lhs})` with %lhs a
/// staged register tile and %rhs a shared one. Before:
///
///   %dq = tile.dot %dsh, %k {transpose_lhs}
///       : tensor<128x64xbf16>, tensor<128x96xbf16> -> tensor<64x96xf32>
///   tile.atomic_add %dq, %dq_accum[%off] rows %m0 of %nq stride %c96
///
/// After (every warp's part of dS^T staged; 8 warps: 4 per 64-column
/// group, 16 columns each, the groups taken round robin by 2 phases):
///
///   barrier
///   // per round of column groups (at most 64 accumulators at a time):
///   //   mmaProductTransposed: A = dS by ldmatrix.trans of dS^T, B = K by
///   //   ldmatrix.trans, k-steps over the 128 keys
///   //   red.global.add(.v2).f32 [dq_accum + off + row * 96 + col], ...
///   //     predicated on row < nq (and col < 96 where the columns overhang)
LogicalResult TileKernelLowering::lowerTransposedProduct(tile::DotOp op) {
  Value lhs = op.getLhs(), rhs = op.getRhs();
  if (!staging.count(lhs) || homes.lookup(rhs) != TileHome::Shared ||
      op.getTransposeRhs())
    return fail(op, "a transposed product reads a staged register lhs and a "
                    "shared rhs, not transposed");
  auto atomic = cast<tile::AtomicAddOp>(*op->user_begin());
  if (!cast<MemRefType>(atomic.getBase().getType()).getElementType().isF32())
    return fail(atomic, "reduces into an f32 buffer only");
  if (place.wgmma)
    return lowerWgmmaTransposed(op, atomic);
  const SharedSlot &lhsSlot = staging[lhs], &rhsSlot = slots[rhs];
  RankedTensorType resTy = op.getType();
  const int64_t rows = resTy.getDimSize(0);
  const int64_t keys = tileType(lhs).getDimSize(0);
  const int64_t padCols = paddedCols(resTy);
  // With column parts (the 2-D warp grid) the rows go in as many parts.
  const int64_t rowSplit = place.colParts;
  const DqWarps w = dqWarps(place.threads / 32, rowSplit);
  if (rows % (16 * rowSplit) != 0 || keys % 16 != 0)
    return fail(op, "needs whole 16-row tiles");

  if (staged) // every warp's part of the lhs is staged
    g.barrier();
  staged = false;
  // Inside a loop, from its opaque thread index: recomputed, not hoisted
  // into registers live across the loop.
  Value warpInBlock = g.divU(copyTid ? copyTid : tid, g.c32(32));
  const int64_t perPart = place.threads / 32 / rowSplit;
  Value rowPart = rowSplit > 1 ? g.divU(warpInBlock, g.c32(perPart)) : Value();
  Value warp = rowSplit > 1 ? g.remU(warpInBlock, g.c32(perPart)) : warpInBlock;
  auto inLoop = [&](gpu::FragmentAddresses f) {
    return loopIv ? f.inLoop(g) : f;
  };
  gpu::FragmentAddresses aT = inLoop(gpu::fragmentAddresses(
      g, gpu::FragmentPattern::B, lane, g.c32(0), g.c32(lhsSlot.offset),
      lhsSlot.rowChunks,
      rowPart ? g.mul(rowPart, g.c32(rows / rowSplit / 8)) : Value()));
  gpu::FragmentAddresses bT = inLoop(gpu::fragmentAddresses(
      g, gpu::FragmentPattern::BTrans, lane, g.c32(0),
      g.add(g.add(slotOffset(rhs), g.mul(chunkStart(resTy), g.c32(2))),
            g.mul(g.divU(warp, g.c32(w.cols)), g.c32(128))),
      rhsSlot.rowChunks,
      g.mul(g.remU(warp, g.c32(w.cols)), g.c32(w.colWidth / 8))));

  ReductionTarget red = reductionOf(atomic);
  LaneIndices li = laneIndices();
  Value grp = li.grp, tig = li.tig;
  Value warpCol0 = g.add(
      g.add(chunkStart(resTy), g.mul(g.divU(warp, g.c32(w.cols)), g.c32(64))),
      g.add(g.mul(g.remU(warp, g.c32(w.cols)), g.c32(w.colWidth)),
            g.mul(tig, g.c32(2))));

  // Quad order with 16-byte reductions (ReductionTarget::quadVectors): the
  // n-tiles 2k and 2k + 1 of a row (columns 2 tig, 2 tig + 1 and 8 more of
  // one 16-column group) lie at 4 tig of the group, i.e. at warpCol0 +
  // 2 tig: one red.global.add.v4.f32 where dq_accum's base is 16-byte
  // aligned, else the pairs.
  Value quadCol = g.add(warpCol0, g.mul(tig, g.c32(2)));
  Value aligned = red.quadVectors ? red.baseAligned(g) : Value();
  auto slab = [&](ArrayRef<int64_t> rounds) {
    SmallVector<int64_t> chunks, colConst;
    for (int64_t r : rounds)
      for (int64_t jj = 0; jj < w.colWidth / 16; ++jj) {
        chunks.push_back(8 * r * w.groups + 2 * jj);
        colConst.push_back(64 * r * w.groups + 16 * jj);
      }
    const int64_t mtQ = rows / rowSplit / 16, nt2 = int64_t(chunks.size()) * 2;
    std::vector<gpu::Acc> acc =
        gpu::mmaProductTransposed(g, smem, aT, bT, mtQ, chunks, keys / 16);
    for (int64_t mi = 0; mi < mtQ; ++mi)
      for (int64_t h = 0; h < 2; ++h) {
        Value q = g.add(g.c32(mi * 16 + 8 * h), grp);
        if (rowPart)
          q = g.add(q, g.mul(rowPart, g.c32(rows / rowSplit)));
        auto pairs = [&] {
          for (int64_t n = 0; n < nt2; ++n) {
            const gpu::Acc &v = acc[mi * nt2 + n];
            reducePair(g, red, q, warpCol0, colConst[n / 2] + 8 * (n % 2),
                       v[2 * h], v[2 * h + 1], /*rowChecked=*/true);
          }
        };
        auto quads = [&] {
          Value rowAt = red.rowOffset(g, q);
          for (int64_t n = 0; n < nt2; n += 2) {
            const gpu::Acc &lo = acc[mi * nt2 + n], &hi = acc[mi * nt2 + n + 1];
            Value col = g.add(quadCol, g.c32(colConst[n / 2]));
            Value ok = red.checkCols
                           ? g.cmp(CmpIPredicate::slt,
                                   g.add(warpCol0, g.c32(colConst[n / 2])),
                                   g.c32(red.cols))
                           : Value();
            Value ptr = LLVM::GEPOp::create(
                b, g.ptrGen, g.f32, red.base,
                ArrayRef<LLVM::GEPArg>{g.add(rowAt, g.ext64(col))});
            g.reduceAdd4(ok, ptr,
                         {lo[2 * h], lo[2 * h + 1], hi[2 * h], hi[2 * h + 1]});
          }
        };
        // One branch per row around its reductions (reduceAdd).
        g.ifThen(red.rowExists(g, q), [&] {
          if (!aligned)
            return pairs();
          g.ifThen(aligned, quads);
          g.ifThen(g.xorI(aligned, g.cBool(true)), pairs);
        });
      }
  };
  // Rounds of column groups, as many per slab as keep the slab's
  // accumulators at 64 registers; a last partial round only for the warp
  // phases that have a group.
  const int64_t groups = ceilDiv(padCols, 64);
  const int64_t fullRounds = groups / w.groups;
  const int64_t regsPerRound = rows / rowSplit / 16 * (w.colWidth / 8) * 4;
  const int64_t perSlab = std::max<int64_t>(1, 64 / regsPerRound);
  for (int64_t r0 = 0; r0 < fullRounds; r0 += perSlab) {
    SmallVector<int64_t> rounds;
    for (int64_t r = r0; r < std::min(fullRounds, r0 + perSlab); ++r)
      rounds.push_back(r);
    slab(rounds);
  }
  if (groups % w.groups != 0)
    g.ifThen(g.cmp(CmpIPredicate::ult, g.divU(warp, g.c32(w.cols)),
                   g.c32(groups % w.groups)),
             [&] { slab({fullRounds}); });
  return success();
}

/// The step's dQ tile added into dq_accum by the tensor memory accelerator
/// (the `bulk-dq` option, opt-in): the threads store their registers into
/// a staging tile laid out as dq_accum's rows (the warpgroups' column
/// blocks side by side where they split the columns, else a tile each),
/// and one thread adds its rows that exist with one bulk reduction, which
/// the accelerator carries out while the warps go on. Measured slower than
/// the threads' reductions on the H200 (T24: one copy per row 32%, one
/// per step 7% at d = 128); kept as the start of a dq_accum laid out in
/// the staging's order. Before:
///
///   %dq = tile.dot %dsh, %k {transpose_lhs} : ... -> tensor<64x128xf32>
///   tile.atomic_add %dq, %dq_accum[%off] rows %m0 of %nq stride %dqk
///
/// After (two warpgroups, each 64 of the 128 columns):
///
///   cp.async.bulk.wait_group.read 0    // the last step's tile is read
///   bar.sync 2, 256
///   st.shared.v2.f32 [stage + row * 512 + col * 4], {dq pair} (x 16)
///   fence.proxy.async.shared::cta
///   bar.sync 2, 256
///   thread 0: cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32
///                 [dq_accum + 4 (off + m0 dqk)], [stage],
///                 512 * clamp(nq - m0, 0, 64)
///             cp.async.bulk.commit_group
///
/// and cp.async.bulk.wait_group 0 before the kernel returns.
void TileKernelLowering::reduceTileInBulk(const ReductionTarget &r,
                                          const Fragment &f, Value colBase,
                                          Value q0, bool splitCols) {
  const int64_t n = place.dqStageCols;
  const int64_t pitch = 4 * (splitCols ? n * place.warpgroups() : n);
  // Named barrier 2 for the warpgroups together, else 2 + w for each (0 is
  // the block's own).
  Value bar = splitCols ? g.c32(2) : g.add(g.c32(2), wgIdx);
  const int64_t threads = splitCols ? place.threads : 128;
  Value stage =
      splitCols ? g.c32(dqStageOffset)
                : g.add(g.c32(dqStageOffset), g.mul(wgIdx, g.c32(64 * pitch)));
  g.bulkWait(0, /*read=*/true);
  g.namedBarrierSync(bar, threads);
  Value lanePart =
      g.add(g.add(stage, splitCols ? g.mul(colBase, g.c32(4)) : g.c32(0)),
            g.add(g.mul(q0, g.c32(pitch)), g.mul(tig, g.c32(8))));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < n / 8; ++j) {
      Value at = g.add(lanePart, g.c32(8 * h * pitch + 32 * j));
      LLVM::StoreOp::create(
          b, g.pairF32(f.regs[4 * j + 2 * h], f.regs[4 * j + 2 * h + 1]),
          g.sharedBytePtr(smem, at), 8);
    }
  wg->fenceProxyAsync();
  g.namedBarrierSync(bar, threads);
  Value rows = g.minS(g.maxS(g.sub(r.bound, r.row0), g.c32(0)), g.c32(64));
  Value first = g.cmp(CmpIPredicate::eq, g.remU(tid, g.c32(threads)), g.c32(0));
  g.ifThen(first, [&] {
    Value at = g.add(g.add(r.offset, g.mul(g.ext64(r.row0), r.stride)),
                     g.ext64(splitCols ? g.c32(0) : colBase));
    Value dst = LLVM::GEPOp::create(b, g.ptrGen, g.f32, r.base,
                                    ArrayRef<LLVM::GEPArg>{at});
    g.bulkReduceAdd(g.cmp(CmpIPredicate::sgt, rows, g.c32(0)), dst,
                    g.sharedBytePtr(smem, stage), g.mul(rows, g.c32(pitch)));
    g.bulkCommit();
  });
  bulkReductions = true;
}
