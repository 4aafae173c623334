//===- TileAttentionSplit.cpp - The split-KV forward's lse merge ----------===//
//
/// \file
/// The second function of a split-KV forward (`flashjit-tile-attention
/// kv-split=true`, kernels/KernelABI.h abi::split): `@f` has written, for
/// each of S runs of the KV blocks, the rows' O normalised by that run's
/// own sum and the run's lse; `@f_combine` merges them, one program per
/// bwd::kRowBlockRows rows of one (batch, head) and chunk of W = dv /
/// combineChunks(dv) columns (pid_split; 32 at dv = 128: four programs and
/// four warps per row), in the online-softmax form with lse as the running
/// max. Each step loads U = splitsPerStep(W) runs at once (32 at W = 32)
/// and merges them together, their loads in flight together. The whole
/// steps read their runs unchecked; a last loop over the rest, in steps of
/// V = min(U, 8), clamps them. On the H200 (T25), one warp per whole row
/// merging 16 runs per step took 16.5 us at 132 runs, bound by that warp's
/// instructions (~720 per step), not its loads: a chunk cuts a warp's work
/// per run by its share of the columns, and the whole steps drop the
/// clamps. Before: `@f` (role "forward_split"). After, beside it:
///
///   func.func @f_combine(<the same arguments>) attributes {attn.kernel =
///       #attn.kernel<role = "combine", ...>} {
///     %c0 = %pid_split * W;  %whole = (%kv_splits / U) * U
///     %r:3 = scf.for %s0 = 0 to %whole step U iter_args(%acc = 0,
///         %m = -inf, %l = 0) {
///       // for u in [0, U): run s = s0 + u
///       %x_u = tile.load %LSE_PART[(s * B * H + bh) * nq] rows %r0 of %nq
///           * log2(e)                                   // tensor<64xf32>
///       %o_u = tile.load %O_PART[(s * B * H + bh) * nq * dv + %c0] rows %r0
///           of %nq stride %dv                           // tensor<64xWxf32>
///       %mn = maxnumf(%m, %x_0, .., %x_U-1); %mu = select(%mn == -inf, 0, %mn)
///       %a = exp2(%m - %mu); %w_u = exp2(%x_u - %mu)
///       scf.yield %acc * bcast(%a) + sum_u %o_u * bcast(%w_u), %mn,
///           %l * %a + sum_u %w_u
///     }
///     %t:3 = scf.for %s0 = %whole to %kv_splits step V iter_args(%r#0..2) {
///       // the same for u in [0, V) with s = min(s0 + u, S - 1), + -inf
///       // past S
///     }
///     tile.store truncf(%t#0 / bcast(%t#2)), %O[... + %c0]  // 0 where l = 0
///     tile.store (%t#1 + log2 %t#2) * ln 2, %LSE[...]      // -inf where l = 0
///   }
///
/// A run that saw no key has lse -inf, so weight 0; a row no run saw keeps
/// l = 0 and gets O = 0 and lse = -inf, as the one-pass forward gives it.
/// The runs past S in the last loop's steps read run S - 1 again (in
/// bounds) with weight 0. Every chunk computes and stores the same lse (the
/// same operations on the same values).
//===----------------------------------------------------------------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/TileIRBuilder.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;

namespace {

/// U, the runs one step of the merge loads at once for a chunk of \p width
/// columns: their loaded partials stay at most 64 values per lane on the
/// GPU (a lane holds ceil(width / 32) columns), 4 to 32 runs.
int64_t splitsPerStep(int64_t width) {
  return std::clamp<int64_t>(64 / ((width + 31) / 32), 4, 32);
}

/// Builds @f_combine after the split function @f, with @f's arguments.
class SplitCombineBuilder : flashjit::attn::detail::TileIRBuilderBase {
public:
  SplitCombineBuilder(OpBuilder &at, FlashFwdOp op, func::FuncOp partial)
      : TileIRBuilderBase(op), op(op), partial(partial), dv(op.getHeadDimV()) {
    b.setInsertionPoint(at.getInsertionBlock(), at.getInsertionPoint());
  }

  void build();

private:
  Value arg(int i) { return func.getArgument(i); }
  Value indexArg(int i) { return arg(abi::split::NumBuffers + i); }

  FlashFwdOp op;
  func::FuncOp partial, func;
  const int64_t dv;
};

} // namespace

void SplitCombineBuilder::build() {
  MLIRContext *ctx = b.getContext();
  auto attr = partial->getAttrOfType<KernelAttr>("attn.kernel");
  func = func::FuncOp::create(
      b, (op.getSymName() + abi::split::kCombineSuffix).str(),
      partial.getFunctionType());
  func->setAttr(
      "attn.kernel",
      KernelAttr::get(ctx, "combine", attr.getHeadDimQk(), attr.getHeadDimV(),
                      attr.getElementType(), attr.getMask(), attr.getGqa(),
                      attr.getSparseBlock(), attr.getBlockM(), attr.getBlockN(),
                      attr.getDeterministic(), attr.getScoreMod(),
                      attr.getMaskMod()));
  func->setAttr("attn.arg_names", partial->getAttr("attn.arg_names"));
  b.setInsertionPointToStart(func.addEntryBlock());

  const int64_t rows = abi::bwd::kRowBlockRows;
  const int pids = abi::split::NumBuffers + abi::split::NumIndexArgs + 1;
  Value pidM = arg(pids), pidBH = arg(pids + 1);
  // nq: the padded rows per (batch, head) of the workspaces and lse; nRows:
  // the rows every access reads or writes (this sequence's with varlen,
  // whose O starts at its first row; the row kernels' accesses share them).
  Value heads = indexArg(abi::Heads), nq = indexArg(abi::SeqQ);
  Value bIdx = arith::DivUIOp::create(b, pidBH, heads);
  Value hIdx = arith::RemUIOp::create(b, pidBH, heads);
  Value startQ, nRows = nq;
  if (op.getVarlen())
    std::tie(startQ, nRows) = sequenceOf(arg(abi::CuSeqQ), bIdx);
  Value first = mulC(pidM, rows);
  Value bhCount = mul(indexArg(abi::Batch), heads);

  // This program's columns: chunk pid_split of combineChunks(dv).
  const int64_t width = dv / abi::split::combineChunks(dv);
  Value col0 = mulC(arg(pids + 2), width);
  Tensor rowTy = tile({rows}, f32), oTy = tile({rows, width}, f32);
  const double inf = std::numeric_limits<double>::infinity();
  Value negInf = constTile(-inf, rowTy), zero = constTile(0.0, rowTy);
  SmallVector<Value> state = {constTile(0.0, oTy), negInf, zero};
  Value splits = indexArg(abi::split::KvSplits);
  const int64_t wholeStep = splitsPerStep(width);
  // The whole steps with no bound on their runs, then the rest in steps of
  // at most 8 that clamp their runs to the last and weigh those past it 0.
  Value whole =
      mulC(arith::DivUIOp::create(b, splits, cIdx(wholeStep)), wholeStep);
  for (bool clamp : {false, true}) {
    const int64_t step = clamp ? std::min<int64_t>(wholeStep, 8) : wholeStep;
    auto loop = scf::ForOp::create(b, clamp ? whole : cIdx(0),
                                   clamp ? splits : whole, cIdx(step), state);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value acc = loop.getRegionIterArgs()[0], m = loop.getRegionIterArgs()[1],
          l = loop.getRegionIterArgs()[2];
    Value last = clamp ? sub(splits, cIdx(1)) : Value();
    SmallVector<Value> xs, os;
    Value mNew = m;
    for (int64_t u = 0; u < step; ++u) {
      Value s = add(loop.getInductionVar(), cIdx(u)), inside;
      if (clamp) {
        inside = cmpI(arith::CmpIPredicate::ult, s, splits);
        s = select(inside, s, last);
      }
      Value stat = mul(add(mul(s, bhCount), pidBH), nq);
      Value x = fmul(loadTile(rowTy, arg(abi::split::LsePart), stat, first,
                              nRows, Value()),
                     constTile(1.0 / std::log(2.0), rowTy));
      if (clamp)
        x = fadd(x, splat(select(inside, cF32(0.0), cF32(-inf)), rowTy));
      xs.push_back(x);
      os.push_back(loadTile(oTy, arg(abi::split::OPart),
                            add(mulC(stat, dv), col0), first, nRows, cIdx(dv)));
    }
    for (Value x : xs)
      mNew = maxF(mNew, x);
    Value mUse =
        select(cmpF(arith::CmpFPredicate::OEQ, mNew, negInf), zero, mNew);
    Value a = exp2(fsub(m, mUse));
    Value accNew = fmul(acc, broadcast(a, oTy, 1)), lNew = fmul(l, a);
    for (auto [x, o] : llvm::zip(xs, os)) {
      Value w = exp2(fsub(x, mUse));
      accNew = fadd(accNew, fmul(o, broadcast(w, oTy, 1)));
      lNew = fadd(lNew, w);
    }
    scf::YieldOp::create(b, ValueRange{accNew, mNew, lNew});
    state.assign(loop.getResults().begin(), loop.getResults().end());
  }
  Value acc = state[0], m = state[1], l = state[2];
  Value empty = cmpF(arith::CmpFPredicate::OEQ, l, zero);
  Value inv =
      select(empty, zero, arith::DivFOp::create(b, constTile(1.0, rowTy), l));
  Value oBase = add(op.getVarlen() ? mul(startQ, indexArg(abi::OStrideN))
                                   : mul(bIdx, indexArg(abi::OStrideB)),
                    mul(hIdx, indexArg(abi::OStrideH)));
  storeTile(truncTile(fmul(acc, broadcast(inv, oTy, 1)), op.getElementType()),
            arg(abi::O), add(oBase, col0), first, nRows,
            indexArg(abi::OStrideN));
  Value lse = fmul(fadd(m, log2(l)), constTile(std::log(2.0), rowTy));
  storeTile(select(empty, negInf, lse), arg(abi::Lse), mul(pidBH, nq), first,
            nRows, Value());
  func::ReturnOp::create(b);
}

void flashjit::attn::detail::buildSplitCombine(OpBuilder &at, FlashFwdOp op,
                                               func::FuncOp partial) {
  SplitCombineBuilder(at, op, partial).build();
}
