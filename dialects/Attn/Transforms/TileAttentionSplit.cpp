//===- TileAttentionSplit.cpp - The split-KV forward's lse merge ----------===//
//
/// \file
/// The second function of a split-KV forward (`flashjit-tile-attention
/// kv-split=true`, kernels/KernelABI.h abi::split): `@f` has written, for
/// each of S runs of the KV blocks, the rows' O normalised by that run's
/// own sum and the run's lse; `@f_combine` merges them, one program per
/// bwd::kRowBlockRows rows of one (batch, head), in the online-softmax
/// form with lse as the running max. Before: `@f` (role "forward_split").
/// After, beside it:
///
///   func.func @f_combine(<the same arguments>) attributes {attn.kernel =
///       #attn.kernel<role = "combine", ...>} {
///     %r:3 = scf.for %s = 0 to %kv_splits iter_args(%acc = 0, %m = -inf,
///         %l = 0) {
///       %x = tile.load %LSE_PART[(s * B * H + bh) * nq] rows %r0 of %nq
///           * log2(e)                                   // tensor<64xf32>
///       %o = tile.load %O_PART[(s * B * H + bh) * nq * dv] rows %r0 of %nq
///           stride %dv                                  // tensor<64xdvxf32>
///       %mn = maxnumf(%m, %x); %mu = select(%mn == -inf, 0, %mn)
///       %a = exp2(%m - %mu); %w = exp2(%x - %mu)
///       scf.yield %acc * bcast(%a) + %o * bcast(%w), %mn, %l * %a + %w
///     }
///     tile.store truncf(%r#0 / bcast(%r#2)), %O[...]     // 0 where l = 0
///     tile.store (%r#1 + log2 %r#2) * ln 2, %LSE[...]   // -inf where l = 0
///   }
///
/// A run that saw no key has lse -inf, so weight 0; a row no run saw keeps
/// l = 0 and gets O = 0 and lse = -inf, as the one-pass forward gives it.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/TileIRBuilder.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <cmath>
#include <tuple>
#include <limits>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;

namespace {

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

  Tensor rowTy = tile({rows}, f32), oTy = tile({rows, dv}, f32);
  const double inf = std::numeric_limits<double>::infinity();
  Value negInf = constTile(-inf, rowTy), zero = constTile(0.0, rowTy);
  SmallVector<Value> init = {constTile(0.0, oTy), negInf, zero};
  auto loop = scf::ForOp::create(b, cIdx(0), indexArg(abi::split::KvSplits),
                                 cIdx(1), init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value acc = loop.getRegionIterArgs()[0], m = loop.getRegionIterArgs()[1],
          l = loop.getRegionIterArgs()[2];
    Value stat = mul(add(mul(loop.getInductionVar(), bhCount), pidBH), nq);
    Value x = fmul(
        loadTile(rowTy, arg(abi::split::LsePart), stat, first, nRows, Value()),
        constTile(1.0 / std::log(2.0), rowTy));
    Value o = loadTile(oTy, arg(abi::split::OPart), mulC(stat, dv), first,
                       nRows, cIdx(dv));
    Value mNew = maxF(m, x);
    Value mUse =
        select(cmpF(arith::CmpFPredicate::OEQ, mNew, negInf), zero, mNew);
    Value a = exp2(fsub(m, mUse)), w = exp2(fsub(x, mUse));
    Value accNew =
        fadd(fmul(acc, broadcast(a, oTy, 1)), fmul(o, broadcast(w, oTy, 1)));
    scf::YieldOp::create(b, ValueRange{accNew, mNew, fadd(fmul(l, a), w)});
  }
  Value acc = loop.getResult(0), m = loop.getResult(1), l = loop.getResult(2);
  Value empty = cmpF(arith::CmpFPredicate::OEQ, l, zero);
  Value inv =
      select(empty, zero, arith::DivFOp::create(b, constTile(1.0, rowTy), l));
  Value oBase = add(op.getVarlen() ? mul(startQ, indexArg(abi::OStrideN))
                                   : mul(bIdx, indexArg(abi::OStrideB)),
                    mul(hIdx, indexArg(abi::OStrideH)));
  storeTile(truncTile(fmul(acc, broadcast(inv, oTy, 1)), op.getElementType()),
            arg(abi::O), oBase, first, nRows, indexArg(abi::OStrideN));
  Value lse = fmul(fadd(m, log2(l)), constTile(std::log(2.0), rowTy));
  storeTile(select(empty, negInf, lse), arg(abi::Lse), mul(pidBH, nq), first,
            nRows, Value());
  func::ReturnOp::create(b);
}

void flashjit::attn::detail::buildSplitCombine(OpBuilder &at, FlashFwdOp op,
                                               func::FuncOp partial) {
  SplitCombineBuilder(at, op, partial).build();
}
