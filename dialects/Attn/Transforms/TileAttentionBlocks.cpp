//===- TileAttentionBlocks.cpp - A mask_mod's blocks, classified ----------===//
//
/// \file
/// The block classification of a mask_mod region (issue 14 item 4): beside
/// the forward `@f` of a block-sparse attn.flash_fwd with a mask_mod, the
/// tiling builds `@f_blocks` (role "mask_blocks", kernels/KernelABI.h
/// abi::blocks), which evaluates the region on every element of every
/// block pair, never more than a tile at a time, and writes the layout the
/// forward and the backward read: the KV blocks with a kept element, the
/// ones kept whole marked full. One program owns kRows sparse Q blocks, one
/// per tile row, and walks the KV blocks in order, counting; the CPU runs
/// it as loops, the GPU as a row kernel (a warp per Q block). Before: the
/// op's mask_mod region. After, beside `@f` (S = sparse_block, C = min(S,
/// 128) keys per tile):
///
///   func.func @f_blocks(<the forward's arguments>) attributes {
///       attn.kernel = #attn.kernel<role = "mask_blocks", block_m = 4 * S,
///       block_n = S, ...>} {
///     %qb = pid_m * 4 + iota : tensor<4xi32>         // the rows' Q blocks
///     %n = scf.for %kb = 0 to ceil(nkv / S) iter_args(%cnt = 0) {
///       %a:2 = scf.for %t = 0 to S iter_args(%any = 0, %miss = 0) {
///         scf.for %u = 0 to ceil(S / C) ... {        // C keys at a time
///           %i = min(%qb * S + %t, nq - 1)           // tensor<4xCxi32>
///           %j = min(%kb * S + min(%u * C + iota dim 1, S - 1), nkv - 1)
///           %keep = <mask_mod on %i, %j>             // tensor<4xCxi1>
///           %any = max(%any, select(%keep, 1, 0))
///           %miss = max(%miss, select(!%keep, 1, 0))
///       } }
///       %kept = reduce "max" %a#0 dim 1 > 0 & %qb < ceil(nq / S)
///       %full = reduce "max" %a#1 dim 1 == 0
///       tile.scatter select(%full, ~%kb, %kb), %INDICES[%list + %cnt]
///           if %kept
///       scf.yield %cnt + zext(%kept)
///     }
///     tile.store %n, %COUNTS[b * counts_sb + h * counts_sh]
///         rows pid_m * 4 of ceil(nq / S)
///   }
///
/// The positions past Nq, Nkv or the block (the last chunk when C does not
/// divide S) are clamped to the block's last real ones: they repeat an
/// element's verdict, so they neither keep a block nor make it partial, as
/// the forward's padding neither attends nor masks.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/ScoreMod.h"
#include "dialects/Attn/Transforms/TileIRBuilder.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <algorithm>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;
using arith::CmpFPredicate;
using arith::CmpIPredicate;

namespace {

/// Builds @f_blocks for the op's mask_mod region.
class MaskBlocksBuilder : flashjit::attn::detail::TileIRBuilderBase {
public:
  MaskBlocksBuilder(OpBuilder &at, FlashFwdOp op)
      : TileIRBuilderBase(op), op(op), s(op.getSparseBlock()),
        c(std::min<int64_t>(s, abi::blocks::kMaxColumns)) {
    b.setInsertionPoint(at.getInsertionBlock(), at.getInsertionPoint());
  }

  void build();

private:
  Value arg(int i) { return func.getArgument(i); }
  Value indexArg(int i) { return arg(abi::NumBuffers + i); }
  Value splatI32(Value index, Tensor ty) { return splat(toI32(index), ty); }
  Value zext(Value keep, Tensor ty) {
    return select(keep, splat(arith::ConstantIntOp::create(b, 1, 32), ty),
                  splat(arith::ConstantIntOp::create(b, 0, 32), ty));
  }
  /// 1.0 where \p x holds, else 0.0 (an f32 tile the reductions take).
  Value indicator(Value x, Tensor ty) {
    return select(x, constTile(1.0, ty), constTile(0.0, ty));
  }
  /// The positions of chunk \p u of KV block \p kb for query row \p t of
  /// each tile row's Q block: whether the running maxima of kept and of
  /// masked elements grow.
  std::pair<Value, Value> evaluate(Value kb, Value t, Value u, Value any,
                                   Value miss);

  FlashFwdOp op;
  func::FuncOp func;
  const int64_t s, c; ///< the sparse block; keys per tile
  const int64_t rows = abi::blocks::kRows;
  Value bIdx, hIdx, nq, nkv, q0;
};

} // namespace

std::pair<Value, Value> MaskBlocksBuilder::evaluate(Value kb, Value t, Value u,
                                                    Value any, Value miss) {
  Tensor iTy = tile({rows, c}, b.getI32Type()), fTy = tile({rows, c}, f32);
  // Positions past Nq, Nkv or the block (the last chunk's columns when C
  // does not divide S) repeat the block's last real ones, which change
  // neither whether it keeps an element nor whether it keeps all.
  Value i = insideProblem(
      arith::AddIOp::create(b, broadcast(q0, iTy, 1), splatI32(t, iTy)), nq);
  Value inBlock = indexTile(iTy, 1, mulC(u, c));
  if (s % c != 0)
    inBlock = arith::MinSIOp::create(b, inBlock, splatI32(cIdx(s - 1), iTy));
  Value j = insideProblem(
      arith::AddIOp::create(b, inBlock, splatI32(mulC(kb, s), iTy)), nkv);

  Region &region = op.getMaskMod();
  flashjit::attn::detail::ScoreModIndices at;
  if (flashjit::attn::detail::scoreModUses(region, 1))
    at.batch = splatI32(bIdx, iTy);
  if (flashjit::attn::detail::scoreModUses(region, 2))
    at.head = splatI32(hIdx, iTy);
  if (flashjit::attn::detail::scoreModUses(region, 3))
    at.qIdx = i;
  if (flashjit::attn::detail::scoreModUses(region, 4))
    at.kvIdx = j;
  unsigned first = func.getNumArguments() - unsigned(totalCapturedTensors(op)) +
                   unsigned(capturedTensors(op.getScoreMod()));
  for (unsigned k = 0; k < unsigned(capturedTensors(region)); ++k)
    at.captures.push_back(func.getArgument(first + k));
  Value keep = flashjit::attn::detail::inlineMaskMod(b, b.getLoc(), region,
                                                     {rows, c}, at);

  Value no = arith::XOrIOp::create(
      b, keep,
      arith::ConstantOp::create(
          b, DenseElementsAttr::get(tile({rows, c}, b.getI1Type()), true)));
  return {maxF(any, indicator(keep, fTy)), maxF(miss, indicator(no, fTy))};
}

void MaskBlocksBuilder::build() {
  MLIRContext *ctx = b.getContext();
  auto [argTys, argNames] =
      flashjit::attn::detail::forwardArguments(b, op, /*split=*/false);
  func = func::FuncOp::create(b, (op.getSymName() + abi::blocks::kSuffix).str(),
                              FunctionType::get(ctx, argTys, {}));
  func->setAttr("attn.kernel",
                KernelAttr::get(ctx, "mask_blocks", op.getHeadDimQk(),
                                op.getHeadDimV(), op.getElementType(),
                                op.getMask(), op.getGqa(), s, rows * s, s,
                                /*deterministic=*/false,
                                op.namedScoreMod().value_or("custom"),
                                "custom"));
  func->setAttr("attn.arg_names", b.getArrayAttr(argNames));
  b.setInsertionPointToStart(func.addEntryBlock());

  const int pids = abi::NumBuffers + abi::NumIndexArgs + 1;
  Value pidM = arg(pids), pidBH = arg(pids + 1);
  Value heads = indexArg(abi::Heads);
  bIdx = arith::DivUIOp::create(b, pidBH, heads);
  hIdx = arith::RemUIOp::create(b, pidBH, heads);
  nq = indexArg(abi::SeqQ);
  nkv = indexArg(abi::SeqKV);
  auto blocksOf = [&](Value n) {
    return arith::DivUIOp::create(b, add(n, cIdx(s - 1)), cIdx(s));
  };
  Value qBlocks = blocksOf(nq), kvBlocks = blocksOf(nkv);
  Value first = mulC(pidM, rows);

  Tensor rowTy = tile({rows}, b.getI32Type()), fTy = tile({rows, c}, f32);
  Value qb = indexTile(rowTy, 0, first);
  q0 = arith::MulIOp::create(b, qb, splatI32(cIdx(s), rowTy));
  Value listAt = arith::AddIOp::create(
      b,
      splatI32(add(mul(bIdx, indexArg(abi::IndicesStrideB)),
                   mul(hIdx, indexArg(abi::IndicesStrideH))),
               rowTy),
      arith::MulIOp::create(b, qb,
                            splatI32(indexArg(abi::IndicesStrideM), rowTy)));

  Value rowExists = cmpI(CmpIPredicate::slt, qb, splatI32(qBlocks, rowTy));
  Value zero = splatI32(cIdx(0), rowTy);
  SmallVector<Value> counted = forCarrying(
      cIdx(0), kvBlocks, ValueRange{zero}, [&](Value kb, ValueRange carried) {
        SmallVector<Value> seen = forCarrying(
            cIdx(0), cIdx(s),
            ValueRange{constTile(0.0, fTy), constTile(0.0, fTy)},
            [&](Value t, ValueRange acc) {
              return forCarrying(
                  cIdx(0), cIdx((s + c - 1) / c), acc,
                  [&](Value u, ValueRange acc) -> SmallVector<Value> {
                    auto [any, miss] = evaluate(kb, t, u, acc[0], acc[1]);
                    return {any, miss};
                  });
            });
        Tensor fRow = tile({rows}, f32);
        // A tile row past the last Q block (the CPU runs all of them; the
        // GPU skips them) lists nothing: its writes would leave the layout.
        Value kept = andI(cmpF(CmpFPredicate::OGT, reduce("max", seen[0], 1),
                               constTile(0.0, fRow)),
                          rowExists);
        Value full = cmpF(CmpFPredicate::OEQ, reduce("max", seen[1], 1),
                          constTile(0.0, fRow));
        Value k32 = toI32(kb);
        Value entry =
            select(full,
                   splat(arith::XOrIOp::create(
                             b, k32, arith::ConstantIntOp::create(b, -1, 32)),
                         rowTy),
                   splat(k32, rowTy));
        tile::ScatterOp::create(b, entry, arg(abi::Indices),
                                arith::AddIOp::create(b, listAt, carried[0]),
                                kept);
        return SmallVector<Value>{
            arith::AddIOp::create(b, carried[0], zext(kept, rowTy))};
      });
  storeTile(counted[0], arg(abi::Counts),
            add(mul(bIdx, indexArg(abi::CountsStrideB)),
                mul(hIdx, indexArg(abi::CountsStrideH))),
            first, qBlocks, Value());
  func::ReturnOp::create(b);
}

void flashjit::attn::detail::buildMaskBlocks(OpBuilder &at, FlashFwdOp op) {
  MaskBlocksBuilder(at, op).build();
}
