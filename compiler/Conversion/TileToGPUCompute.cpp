//===- TileToGPUCompute.cpp - Tile arithmetic on registers ----------------===//
//
/// \file
/// The compute op families of the tile lowering (TileToGPU.h): tile.dot on
/// m16n8k16 tensor-core MMAs, row reductions by warp shuffles, broadcasts,
/// splats, iota, constants, elementwise arith / math, and the rounding
/// points (arith.truncf / arith.extf of a tile).
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

void TileKernelLowering::waitForCopies() {
  g.waitAll();
  if (wg)
    wg->fenceProxyAsync(); // cp.async's writes, read by wgmma
  g.barrier();
  pendingCopies = false;
}

/// Products on the tensor cores (mma.sync; warpgroup MMAs in
/// TileToGPUWgmma.cpp, a transposed lhs in TileToGPUAtomics.cpp). Three
/// placements are lowered here:
///
///   %s = tile.dot %q, %k {transpose_rhs}   // both shared: S = Q K^T
///     -> per warp, mt x nt m16n8k16 MMAs per 16-wide k-step; A by ldmatrix
///        (rows warpRow0 + mi * 16), B ([n][k]) by ldmatrix
///   %o = tile.dot %p, %v acc %a            // P in registers, V shared
///     -> P's f32 registers packed to bf16 pairs (its rounding point: the
///        accumulator layout is the A layout of the next MMA, two n-tiles
///        per k-step), V ([k][n]) by ldmatrix.trans, accumulating into %a
///        (in the dK/dV kernel after bar.warp.sync, an ordering point for
///        ptxas: KernelPlacement::orderRegisterProducts)
///   %dv = tile.dot %pth, %do acc %a        // 2-D warp grid: each warp
///     -> holds part of %pth's k-columns, so A comes back from its staging
///        slot by ldmatrix, B by ldmatrix.trans at the warp's column part
///
/// Before the first dot of a pipeline stage: cp.async.wait_all and a
/// barrier, then the copies whose slots this frees (lowerFor).
LogicalResult TileKernelLowering::lowerDot(tile::DotOp op) {
  if (ringLoop)
    waitForRing(op);
  auto it = beforeDot.find(op);
  if (it != beforeDot.end() || pendingCopies)
    waitForCopies();
  if (it != beforeDot.end())
    for (auto [load, ahead] : it->second.issue) {
      if (!ahead) {
        if (failed(issueCopy(load, loopIv)))
          return failure();
        continue;
      }
      Value next = arith::AddIOp::create(b, loopIv, loopStep);
      Value more =
          arith::CmpIOp::create(b, arith::CmpIPredicate::slt, next, loopUb);
      LogicalResult r = success();
      g.ifThen(more, [&] { r = issueCopy(load, next); });
      if (failed(r))
        return failure();
    }

  Value lhs = op.getLhs(), rhs = op.getRhs();
  RankedTensorType resTy = op.getType();
  if (op.getTransposeLhs())
    // With the tile.atomic_add that reduces it, or issued here on
    // warpgroup MMAs with split commits (reduced there).
    return place.wgmma && place.splitCommits ? issueWgmmaTransposed(op)
                                             : success();
  if (place.wgmma)
    return lowerWgmmaDot(op);
  if (homes.lookup(rhs) != TileHome::Shared)
    return fail(op, "the rhs must be a shared tile");
  const SharedSlot &rs = slots[rhs];
  SlotFrags &rf = slotFrags[rhs];
  Fragment out;
  if (homes.lookup(lhs) == TileHome::Shared && op.getTransposeRhs()) {
    const SharedSlot &ls = slots[lhs];
    // acc, if any, is the MMAs' first accumulator, as on the tensor cores.
    std::vector<gpu::Acc> init;
    if (Value c = op.getAcc())
      for (size_t i = 0; i + 3 < frags[c].regs.size(); i += 4)
        init.push_back({frags[c].regs[i], frags[c].regs[i + 1],
                        frags[c].regs[i + 2], frags[c].regs[i + 3]});
    std::vector<gpu::Acc> acc =
        gpu::mmaProduct(g, smem, *slotFrags[lhs].a, *rf.b, mt, nTiles(resTy),
                        ls.padCols / 16, std::move(init));
    for (const gpu::Acc &a : acc)
      out.regs.append(a.begin(), a.end());
  } else if (homes.lookup(lhs) == TileHome::Registers &&
             !op.getTransposeRhs() && place.colParts > 1) {
    // The 2-D warp grid: the warp's rows of the staged lhs over all its
    // k-columns, the warp's part of the product's columns.
    if (!staging.count(lhs))
      return fail(op, "a register lhs must be staged here");
    if (staged)
      g.barrier(); // every warp's part of the lhs is staged
    staged = false;
    const SharedSlot &ls = staging[lhs];
    auto inLoop = [&](gpu::FragmentAddresses f) {
      return loopIv ? f.inLoop(g) : f;
    };
    gpu::FragmentAddresses a = inLoop(
        gpu::fragmentAddresses(g, gpu::FragmentPattern::A, lane, warpRow0,
                               g.c32(ls.offset), ls.rowChunks));
    // An offset of whole groups of 8 chunks moves the base; else the lane
    // chunk takes it.
    const int64_t partChunks = warpCols(resTy) / 8;
    Value part = g.mul(colPart, g.c32(partChunks));
    Value base = g.add(slotOffset(rhs), g.mul(chunkStart(resTy), g.c32(2)));
    gpu::FragmentAddresses bT = inLoop(
        partChunks % 8 == 0
            ? gpu::fragmentAddresses(
                  g, gpu::FragmentPattern::BTrans, lane, g.c32(0),
                  g.add(base, g.mul(part, g.c32(16))), rs.rowChunks)
            : gpu::fragmentAddresses(g, gpu::FragmentPattern::BTrans, lane,
                                     g.c32(0), base, rs.rowChunks, part));
    if (Value c = op.getAcc())
      out.regs = frags[c].regs;
    else
      out.regs.assign(regCount(resTy), g.cf(0.0));
    gpu::mmaAccumulateShared(g, smem, out.regs, a, bT, mt,
                             tileType(lhs).getDimSize(1) / 16, warpCols(resTy));
  } else if (homes.lookup(lhs) == TileHome::Registers &&
             !op.getTransposeRhs()) {
    const Fragment &p = frags[lhs];
    if (!p.pendingRound)
      return fail(op, "a register lhs must be a tile rounded by arith.truncf");
    if (place.orderRegisterProducts)
      g.warpSync();
    RankedTensorType lTy = tileType(lhs);
    int64_t nt = nTiles(lTy);
    std::vector<gpu::Acc> lhsTiles(mt * nt);
    for (size_t i = 0; i < lhsTiles.size(); ++i)
      lhsTiles[i] = {p.regs[4 * i], p.regs[4 * i + 1], p.regs[4 * i + 2],
                     p.regs[4 * i + 3]};
    if (Value c = op.getAcc())
      out.regs = frags[c].regs;
    else
      out.regs.assign(regCount(resTy), g.cf(0.0));
    // A split product reads its chunk's columns of a slot holding all.
    gpu::FragmentAddresses bT = *rf.bTrans;
    if (splitsCols(resTy) && !rs.splitCols)
      bT = bT.shifted(g, g.mul(splitStart, g.c32(2)));
    gpu::mmaAccumulate(g, smem, out.regs, lhsTiles, bT, mt, nt,
                       warpCols(resTy));
  } else {
    return fail(op, "this operand placement is not lowered on the GPU yet");
  }
  frags[op.getResult()] = std::move(out);
  return success();
}

/// combine(...combine(combine(init, v_0), v_1)..., v_n-1).
template <typename Combine>
static Value foldChain(ArrayRef<Value> values, Combine combine, Value init) {
  for (Value v : values)
    init = combine(init, v);
  return init;
}

/// \p values (at least one) combined pairwise, level by level: depth
/// ceil(log2 n) instead of n.
template <typename Combine>
static Value foldTree(ArrayRef<Value> values, Combine combine) {
  SmallVector<Value> level(values.begin(), values.end());
  while (level.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i + 1 < level.size(); i += 2)
      next.push_back(combine(level[i], level[i + 1]));
    if (level.size() % 2)
      next.push_back(level.back());
    level = std::move(next);
  }
  return level.front();
}

/// Row reductions: each thread folds its registers of a row, then the 4
/// lanes of the row combine by shuffles (a running sum's lanes combine
/// after its loop instead: lowerFor). Before:
///
///   %mx = tile.reduce "max" %s dim 1 : tensor<64x32xf32> -> tensor<64xf32>
///
/// After, per row register (mi, half), with r_0 .. r_7 the thread's
/// registers of the row (s[mi, ni, 2 half + e]):
///
///   %a = maxnum(-inf, r_0, r_1, ..., r_7)  // a chain, or with
///       KernelPlacement::treeReductions a pairwise tree (depth 3):
///   %a = maxnum(maxnum(maxnum(r_0, r_1), maxnum(r_2, r_3)), ...), -inf)
///   %b = maxnum(%a, shfl.bfly(%a, 1)) ; %mx = maxnum(%b, shfl.bfly(%b, 2))
LogicalResult TileKernelLowering::lowerReduce(tile::ReduceOp op) {
  if (op.getDim() != 1)
    return fail(op, "column reductions are not lowered on the GPU yet");
  RankedTensorType ty = tileType(op.getValue());
  if (splitsCols(ty))
    return fail(op, "its rows are split over programs");
  bool isMax = op.getKind() == "max";
  auto combine = [&](Value x, Value y) {
    return isMax ? g.fmax(x, y) : g.fadd(x, y);
  };
  const Value identity =
      isMax ? g.cf(-std::numeric_limits<double>::infinity()) : g.cf(0.0);
  const Fragment &in = frags[op.getValue()];
  const int64_t nt = nTiles(ty);
  Fragment out;
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t h = 0; h < 2; ++h) {
      SmallVector<Value> regs;
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t e = 0; e < 2; ++e)
          regs.push_back(in.regs[(mi * nt + ni) * 4 + 2 * h + e]);
      Value acc = place.treeReductions ? foldTree(regs, combine)
                                       : foldChain(regs, combine, identity);
      if (isMax && place.treeReductions)
        acc = combine(acc, identity);
      if (!deferredSums.contains(op)) {
        acc = combine(acc, g.shuffleXor(acc, 1));
        acc = combine(acc, g.shuffleXor(acc, 2));
      }
      out.regs.push_back(acc);
    }
  frags[op.getResult()] = std::move(out);
  return success();
}

/// A per-row tile over the columns: register (mi, ni, e) takes row
/// register (mi, e / 2). No instruction. A per-column tile over the rows
/// (dim 0) reads the thread's columns from its SharedVector slot:
///
///   %b = tile.broadcast %nl dim 0 : tensor<64xf32> -> tensor<128x64xf32>
///
/// becomes, per n-tile ni and e < 2, `ld.shared.f32 [slot + 4 (ni * 8 +
/// 2 tig + e)]`, register (mi, ni, e') taking value (ni, e' % 2).
LogicalResult TileKernelLowering::lowerBroadcast(tile::BroadcastOp op) {
  const int64_t nt = nTiles(op.getType());
  Fragment out;
  if (op.getDim() == 0) {
    if (homes.lookup(op.getValue()) != TileHome::SharedVector)
      return fail(op, "a per-column broadcast reads a rank-1 tile.load");
    if (splitsCols(op.getType()))
      return fail(op, "its columns are split over programs");
    Value base = slotOffset(op.getValue());
    Value first = colStart(op.getType());
    SmallVector<Value> cols;
    for (int64_t ni = 0; ni < nt; ++ni)
      for (int64_t e = 0; e < 2; ++e) {
        Value c = g.add(first, g.add(g.c32(ni * 8 + e), g.mul(tig, g.c32(2))));
        Value at = g.add(base, g.mul(c, g.c32(4)));
        cols.push_back(
            LLVM::LoadOp::create(b, g.f32, g.sharedBytePtr(smem, at)));
      }
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t e = 0; e < 4; ++e)
          out.regs.push_back(cols[ni * 2 + e % 2]);
    frags[op.getResult()] = std::move(out);
    return success();
  }
  const Fragment &in = frags[op.getValue()];
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t ni = 0; ni < nt; ++ni)
      for (int64_t e = 0; e < 4; ++e)
        out.regs.push_back(in.regs[2 * mi + e / 2]);
  frags[op.getResult()] = std::move(out);
  return success();
}

LogicalResult TileKernelLowering::lowerSplat(tile::SplatOp op) {
  Fragment &f = frags[op.getResult()];
  f.regs.assign(regCount(op.getType()), scalar(op.getValue()));
  f.uniform = true;
  return success();
}

/// Row indices (warpRow0 + mi * 16 + grp + 8 * (e / 2)) or column indices
/// (the chunk's first column + ni * 8 + 2 * tig + e % 2) of the registers.
LogicalResult TileKernelLowering::lowerIota(tile::IotaOp op) {
  RankedTensorType ty = op.getType();
  Fragment out;
  auto rowOf = [&](int64_t mi, int64_t h) {
    return g.add(warpRow0, g.add(grp, g.c32(mi * 16 + 8 * h)));
  };
  if (ty.getRank() == 1) {
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t h = 0; h < 2; ++h)
        out.regs.push_back(rowOf(mi, h));
  } else {
    const int64_t nt = nTiles(ty);
    Value colBase = colStart(ty);
    Value tig2 = g.add(colBase, g.mul(tig, g.c32(2)));
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t e = 0; e < 4; ++e)
          out.regs.push_back(op.getDim() == 0
                                 ? rowOf(mi, e / 2)
                                 : g.add(tig2, g.c32(ni * 8 + e % 2)));
  }
  frags[op.getResult()] = std::move(out);
  return success();
}

LogicalResult TileKernelLowering::lowerConstant(Operation *op) {
  auto dense =
      dyn_cast<DenseElementsAttr>(cast<arith::ConstantOp>(op).getValue());
  if (!dense || !dense.isSplat())
    return fail(op, "only splat constant tiles are lowered");
  auto ty = cast<RankedTensorType>(op->getResult(0).getType());
  Value c = arith::ConstantOp::create(
      b, cast<TypedAttr>(dense.getSplatValue<Attribute>()));
  frags[op->getResult(0)].regs.assign(regCount(ty), c);
  return success();
}

/// The rounding points. arith.truncf of an f32 register tile to the element
/// type marks it: the registers round where they are consumed (packed for
/// an MMA, converted for a store), once; one that a product reads
/// transposed is also stored to its staging slot there (stageTransposed).
/// arith.extf of such a tile rounds
/// each pair through a bf16x2 / f16x2 conversion and back.
LogicalResult TileKernelLowering::lowerRounding(Operation *op) {
  Value in = op->getOperand(0), res = op->getResult(0);
  const Fragment &f = frags[in];
  if (isa<arith::TruncFOp>(op)) {
    if (tileType(res).getElementType() != g.halfTy || f.pendingRound)
      return fail(op, "rounds f32 tiles to the kernel's element type only");
    Fragment out = f;
    out.pendingRound = true;
    if (staging.count(res))
      stageTransposed(res, out);
    frags[res] = std::move(out);
    return success();
  }
  if (!f.pendingRound)
    return fail(op, "widens only tiles rounded by arith.truncf");
  Fragment out;
  for (size_t i = 0; i + 1 < f.regs.size(); i += 2) {
    // The pairs a warpgroup MMA read are taken as it pinned them.
    auto [lo, hi] = g.unpack2(
        f.packed.empty() ? g.pack2(f.regs[i], f.regs[i + 1]) : f.packed[i / 2]);
    out.regs.append({lo, hi});
  }
  frags[res] = std::move(out);
  return success();
}

std::optional<LogicalResult>
TileKernelLowering::lowerUnitRescale(Operation *op) {
  auto mul = dyn_cast<arith::MulFOp>(op);
  if (!mul)
    return std::nullopt;
  auto bcast = mul.getRhs().getDefiningOp<tile::BroadcastOp>();
  auto exp = bcast ? bcast.getValue().getDefiningOp<math::Exp2Op>() : nullptr;
  auto diff = exp ? exp.getOperand().getDefiningOp<arith::SubFOp>() : nullptr;
  if (!diff || !frags.count(diff.getLhs()) || !frags.count(diff.getRhs()))
    return std::nullopt;
  // exp2(x - y) is exactly 1 where x == y, and o * 1 == o: when no row of
  // the warp moved (a warp-uniform vote), the multiplies are skipped.
  const Fragment &x = frags[diff.getLhs()], &y = frags[diff.getRhs()];
  Value moved = g.cBool(false);
  for (size_t i = 0; i < x.regs.size(); ++i)
    moved = g.orI(moved, arith::CmpFOp::create(b, arith::CmpFPredicate::UNE,
                                               x.regs[i], y.regs[i]));
  Value any =
      g.intrinsic("llvm.nvvm.vote.any.sync", {g.i1}, {g.c32(-1), moved});
  const Fragment &o = frags[mul.getLhs()], &s = frags[mul.getRhs()];
  SmallVector<Type> types(o.regs.size(), g.f32);
  auto ifOp = scf::IfOp::create(b, types, any, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    SmallVector<Value> scaled;
    for (size_t i = 0; i < o.regs.size(); ++i)
      scaled.push_back(g.fmul(o.regs[i], s.regs[i]));
    scf::YieldOp::create(b, scaled);
    b.setInsertionPointToStart(ifOp.elseBlock());
    scf::YieldOp::create(b, o.regs);
  }
  frags[mul.getResult()].regs.assign(ifOp.getResults().begin(),
                                     ifOp.getResults().end());
  return success();
}

Value conversion::ptxUnaryF32(ImplicitLocOpBuilder &b, Type f32, Value x,
                              StringRef asmText) {
  return LLVM::InlineAsmOp::create(b, f32, ValueRange{x}, asmText, "=f,f",
                                   /*has_side_effects=*/false,
                                   /*is_align_stack=*/false,
                                   LLVM::tailcallkind::TailCallKind::None,
                                   LLVM::AsmDialectAttr(), ArrayAttr())
      .getResult(0);
}

/// f32 x / y by a constant y (softcap's s / C): x times the reciprocal
/// rounded to f32, one multiply (at most about 1 ulp from the quotient)
/// where IEEE division (div.rn.f32) is a subroutine: a softcap forward ran
/// at 44% of the plain kernel's speed with it (T19-C). Null for any other
/// divisor, which keeps the IEEE division (the epilogue's 1 / l).
static Value divideByConstant(flashjit::gpu::GpuBuilder &g, Value x,
                              Value y) {
  auto c = y.getDefiningOp<arith::ConstantOp>();
  auto v = c ? dyn_cast<FloatAttr>(c.getValue()) : FloatAttr();
  if (!v)
    return Value();
  const double inverse = 1.0 / v.getValueAsDouble();
  if (!std::isnormal(inverse) || !std::isnormal(float(inverse)))
    return Value();
  return g.fmul(x, g.cf(inverse));
}

/// \p x - 2 pi k with k = rint(x / (2 pi)), in [-pi, pi] (2 pi as two f32
/// constants, Cody-Waite): the range where sin.approx / cos.approx are
/// accurate (absolute error about 2^-21); for |x| < 2^20 or so.
static Value reduceTwoPi(ImplicitLocOpBuilder &b, flashjit::gpu::GpuBuilder &g,
                         Value x) {
  Value k = ptxUnaryF32(b, g.f32, g.fmul(x, g.cf(0.15915494309189535)),
                        "cvt.rni.f32.f32 $0, $1;");
  Value negK = LLVM::FNegOp::create(b, k);
  Value r = g.fma(negK, g.cf(6.2831854820251465), x);
  return g.fma(negK, g.cf(-1.7484556000744883e-07), r);
}

/// ex2 / lg2 / tanh / sin / cos .approx (sin and cos after reduceTwoPi),
/// rsqrt.approx, sqrt.rn, abs, cvt's roundings for floor, ceil and
/// roundeven (the GPU conversion sends LLVM's intrinsics for those to
/// libdevice), and LLVM's for fma, min and max.
Value conversion::lowerScalarMath(ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                                  Operation *op, ValueRange x) {
  Type f32 = g.f32;
  if (isa<math::SinOp>(op))
    return ptxUnaryF32(b, f32, reduceTwoPi(b, g, x[0]),
                       "sin.approx.f32 $0, $1;");
  if (isa<math::CosOp>(op))
    return ptxUnaryF32(b, f32, reduceTwoPi(b, g, x[0]),
                       "cos.approx.f32 $0, $1;");
  if (isa<math::FloorOp>(op))
    return ptxUnaryF32(b, f32, x[0], "cvt.rmi.f32.f32 $0, $1;");
  if (isa<math::CeilOp>(op))
    return ptxUnaryF32(b, f32, x[0], "cvt.rpi.f32.f32 $0, $1;");
  if (isa<math::RoundEvenOp>(op))
    return ptxUnaryF32(b, f32, x[0], "cvt.rni.f32.f32 $0, $1;");
  if (isa<math::RsqrtOp>(op))
    return ptxUnaryF32(b, f32, x[0], "rsqrt.approx.f32 $0, $1;");
  if (isa<math::Exp2Op>(op))
    return g.exp2(x[0]);
  if (isa<math::Log2Op>(op))
    return g.log2(x[0]);
  if (isa<math::ExpOp>(op))
    return g.exp2(g.fmul(x[0], g.cf(1.4426950408889634)));
  if (isa<math::LogOp>(op))
    return g.fmul(g.log2(x[0]), g.cf(0.6931471805599453));
  if (isa<math::TanhOp>(op))
    return ptxUnaryF32(b, f32, x[0], "tanh.approx.f32 $0, $1;");
  if (isa<math::FmaOp>(op))
    return g.fma(x[0], x[1], x[2]);
  if (isa<arith::DivFOp>(op) && x[0].getType() == f32)
    if (Value q = divideByConstant(g, x[0], x[1]))
      return q;
  if (isa<arith::MaxNumFOp>(op))
    return g.fmax(x[0], x[1]);
  if (isa<arith::MinNumFOp>(op))
    return LLVM::MinNumOp::create(b, x[0], x[1]);
  if (isa<math::AbsFOp>(op))
    return ptxUnaryF32(b, f32, x[0], "abs.f32 $0, $1;");
  if (isa<math::SqrtOp>(op))
    return ptxUnaryF32(b, f32, x[0], "sqrt.rn.f32 $0, $1;");
  return Value();
}

FailureOr<SmallVector<Value>>
conversion::lowerScalarElement(ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                               Operation *op, ValueRange operands,
                               TypeRange types) {
  if (Value v = lowerScalarMath(b, g, op, operands))
    return SmallVector<Value>{v};
  if (isa<math::MathDialect>(op->getDialect()))
    return op->emitOpError() << "cannot be lowered to the GPU: this math op "
                                "has no GPU lowering (flashjit links no "
                                "libdevice)";
  OperationState state(op->getLoc(), op->getName().getStringRef(), operands,
                       types, op->getAttrs());
  return SmallVector<Value>(b.create(state)->getResults());
}

/// Elementwise arith / math on tiles: the same op on each register. Before:
///
///   %p = math.exp2 %x : tensor<64x32xf32>
///
/// After, per register i: `%p_i = ex2.approx.ftz %x_i` (math by
/// lowerMathScalar; every arith op is cloned on scalars).
LogicalResult TileKernelLowering::lowerElementwise(Operation *op) {
  if (std::optional<LogicalResult> r = lowerUnitRescale(op))
    return *r;
  if (std::optional<LogicalResult> r = lowerAffineConversion(op))
    return *r;
  if (std::optional<LogicalResult> r = lowerEmulatedExp2(op))
    return *r;
  if (std::optional<LogicalResult> r = lowerPolynomialTanh(op))
    return *r;
  int64_t count = -1;
  for (Value v : op->getOperands()) {
    if (!isTile(v))
      continue;
    auto it = frags.find(v);
    if (it == frags.end())
      return fail(op, "an operand has no registers");
    if (it->second.pendingRound)
      return fail(op, "a rounded tile is consumed only by tile.dot, "
                      "tile.store or arith.extf");
    if (count >= 0 && int64_t(it->second.regs.size()) != count)
      return fail(op, "operands of different layouts");
    count = it->second.regs.size();
  }
  if (count < 0)
    return fail(op, "no tile operand");
  SmallVector<Type> resultTypes;
  for (Value r : op->getResults())
    resultTypes.push_back(tileType(r).getElementType());
  SmallVector<Fragment> outs(op->getNumResults());
  for (int64_t i = 0; i < count; ++i) {
    SmallVector<Value> operands;
    for (Value v : op->getOperands())
      operands.push_back(isTile(v) ? frags[v].regs[i] : scalar(v));
    FailureOr<SmallVector<Value>> res =
        lowerScalarElement(b, g, op, operands, resultTypes);
    if (failed(res))
      return failure();
    for (unsigned r = 0; r < op->getNumResults(); ++r)
      outs[r].regs.push_back((*res)[r]);
  }
  for (unsigned r = 0; r < op->getNumResults(); ++r)
    frags[op->getResult(r)] = std::move(outs[r]);
  return success();
}
