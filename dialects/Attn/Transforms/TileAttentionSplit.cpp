//===- TileAttentionSplit.cpp - The split-KV forward's lse merge ----------===//
//
/// \file
/// The second function of a split-KV forward (`flashjit-tile-attention
/// kv-split=true`, kernels/KernelABI.h abi::split): `@f` has written, for
/// each of S runs of the KV blocks, the rows' O normalised by that run's
/// own sum and the run's lse; `@f_combine` merges them, one program per
/// bwd::kRowBlockRows rows of one (batch, head), in the online-softmax
/// form with lse as the running max. Each step loads U = splitsPerStep(dv)
/// runs at once and merges them together, their loads in flight together
/// (one round trip per U runs). On the H200 that shortened the merge kernel
/// (22 -> 16.5 us at 132 runs) but not the decode: a row is one warp's, and
/// that warp's instructions, not its loads, bound the merge (bench/NOTES.md
/// T25). Before: `@f` (role "forward_split"). After, beside it:
///
///   func.func @f_combine(<the same arguments>) attributes {attn.kernel =
///       #attn.kernel<role = "combine", ...>} {
///     %r:3 = scf.for %s0 = 0 to %kv_splits step U iter_args(%acc = 0,
///         %m = -inf, %l = 0) {
///       // for u in [0, U): run s = min(s0 + u, S - 1), -inf past S
///       %x_u = tile.load %LSE_PART[(s * B * H + bh) * nq] rows %r0 of %nq
///           * log2(e) + splat(s0 + u < S ? 0 : -inf)   // tensor<64xf32>
///       %o_u = tile.load %O_PART[(s * B * H + bh) * nq * dv] rows %r0 of %nq
///           stride %dv                                  // tensor<64xdvxf32>
///       %mn = maxnumf(%m, %x_0, .., %x_U-1); %mu = select(%mn == -inf, 0, %mn)
///       %a = exp2(%m - %mu); %w_u = exp2(%x_u - %mu)
///       scf.yield %acc * bcast(%a) + sum_u %o_u * bcast(%w_u), %mn,
///           %l * %a + sum_u %w_u
///     }
///     tile.store truncf(%r#0 / bcast(%r#2)), %O[...]     // 0 where l = 0
///     tile.store (%r#1 + log2 %r#2) * ln 2, %LSE[...]   // -inf where l = 0
///   }
///
/// A run that saw no key has lse -inf, so weight 0; a row no run saw keeps
/// l = 0 and gets O = 0 and lse = -inf, as the one-pass forward gives it.
/// The runs past S in the last step read run S - 1 again (in bounds) with
/// weight 0.
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

/// U, the runs one step of the merge loads at once: 16 up to dv = 128, 8
/// past it, so that a step's loaded partials stay at most 64 values per 32
/// columns of a row (a lane's registers on the GPU).
int64_t splitsPerStep(int64_t dv) { return dv <= 128 ? 16 : 8; }

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
  Value splits = indexArg(abi::split::KvSplits);
  const int64_t step = splitsPerStep(dv);
  auto loop = scf::ForOp::create(b, cIdx(0), splits, cIdx(step), init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value acc = loop.getRegionIterArgs()[0], m = loop.getRegionIterArgs()[1],
          l = loop.getRegionIterArgs()[2];
    Value last = sub(splits, cIdx(1));
    SmallVector<Value> xs, os;
    Value mNew = m;
    for (int64_t u = 0; u < step; ++u) {
      Value s = add(loop.getInductionVar(), cIdx(u));
      Value inside = cmpI(arith::CmpIPredicate::ult, s, splits);
      Value stat = mul(add(mul(select(inside, s, last), bhCount), pidBH), nq);
      Value x = fmul(loadTile(rowTy, arg(abi::split::LsePart), stat, first,
                              nRows, Value()),
                     constTile(1.0 / std::log(2.0), rowTy));
      xs.push_back(
          fadd(x, splat(select(inside, cF32(0.0), cF32(-inf)), rowTy)));
      os.push_back(loadTile(oTy, arg(abi::split::OPart), mulC(stat, dv), first,
                            nRows, cIdx(dv)));
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
