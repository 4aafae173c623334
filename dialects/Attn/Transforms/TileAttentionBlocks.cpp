//===- TileAttentionBlocks.cpp - A mask_mod's blocks, classified ----------===//
//
/// \file
/// The block classification of a mask_mod region (issue 14 item 4): beside
/// the forward `@f` of a block-sparse attn.flash_fwd with a mask_mod, the
/// tiling builds two functions (kernels/KernelABI.h abi::blocks) that write
/// the layout the forward and the backward read, evaluating the region on
/// every element of every block pair, never more than a tile at a time:
/// `@f_blocks` classifies kRows KV blocks of one Q block per program (a
/// tile row per KV block, so the work spreads over Q x KV blocks), and
/// `@f_blocks_list` compacts each Q block's classes, in place, into the
/// list of the blocks with a kept element, the ones kept whole marked
/// full. The CPU runs both as loops, the GPU as row kernels (a warp per
/// tile row). Before: the op's mask_mod region. After, beside `@f` (S =
/// sparse_block, C = min(S, 128) keys per tile, list = the (b, h, qb) row
/// of indices):
///
///   func.func @f_blocks(<the forward's arguments>) attributes {
///       attn.kernel = #attn.kernel<role = "mask_blocks", ...>} {
///     %qb = pid_m / ceil(KB / 4);  %kb = (pid_m % ceil(KB / 4)) * 4 + iota
///     %a:2 = scf.for %t = 0 to S iter_args(%any = 0, %miss = 0) {
///       scf.for %u = 0 to ceil(S / C) ... {          // C keys at a time
///         %i = min(%qb * S + %t, nq - 1)             // tensor<4xCxi32>
///         %j = min(%kb * S + min(%u * C + iota dim 1, S - 1), nkv - 1)
///         %keep = <mask_mod on %i, %j>               // tensor<4xCxi1>
///         %any = max(%any, select(%keep, 1, 0))
///         %miss = max(%miss, select(!%keep, 1, 0))
///     } }
///     %class = reduce "max" %a#0 > 0 ? (reduce "max" %a#1 == 0 ? 2 : 1) : 0
///     tile.store %class, %INDICES[list(%qb)] rows %kb0 of KB
///   }
///   func.func @f_blocks_list(...) attributes {role = "mask_blocks_list"} {
///     %qb = pid_m * 4 + iota                         // tensor<4xi32>
///     %n = scf.for %kb = 0 to KB iter_args(%cnt = 0) {
///       %class = tile.gather %INDICES[list(%qb) + %kb]
///       tile.scatter (%class == 2 ? ~%kb : %kb), %INDICES[list(%qb) + %cnt]
///           if %class != 0 & %qb < QB
///       scf.yield %cnt + (%class != 0)
///     }
///     tile.store %n, %COUNTS[b * counts_sb + h * counts_sh] rows pid_m * 4
///         of QB
///   }
///
/// Varlen: batch b is sequence b (its lengths from cu_seqlens_q/kv, its
/// positions its own, as the forward's); the layout spans the longest
/// sequence, and a Q block past a sequence's end gets count 0.
///
/// The compaction is safe in place: a row's count never passes kb, so no
/// class still to be read is overwritten. The positions past Nq, Nkv or
/// the block (the last chunk when C does not divide S) are clamped to the
/// block's last real ones: they repeat an element's verdict, so they
/// neither keep a block nor make it partial, as the forward's padding
/// neither attends nor masks.
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

/// Builds @f_blocks and @f_blocks_list for the op's mask_mod region.
class MaskBlocksBuilder : flashjit::attn::detail::TileIRBuilderBase {
public:
  MaskBlocksBuilder(OpBuilder &at, FlashFwdOp op)
      : TileIRBuilderBase(op), op(op), s(op.getSparseBlock()),
        c(std::min<int64_t>(s, abi::blocks::kMaxColumns)) {
    b.setInsertionPoint(at.getInsertionBlock(), at.getInsertionPoint());
  }

  /// @f_blocks: one program per R KV blocks of one Q block.
  void buildClasses();
  /// @f_blocks_list: one program per R Q blocks.
  void buildLists();

private:
  Value arg(int i) { return func.getArgument(i); }
  Value indexArg(int i) { return arg(abi::NumBuffers + i); }
  Value splatI32(Value index, Tensor ty) { return splat(toI32(index), ty); }
  Value constI32(int64_t v, Tensor ty) {
    return splat(arith::ConstantIntOp::create(b, v, 32), ty);
  }
  /// 1.0 where \p x holds, else 0.0 (an f32 tile the reductions take).
  Value indicator(Value x, Tensor ty) {
    return select(x, constTile(1.0, ty), constTile(0.0, ty));
  }
  /// A function of the forward's arguments named @f<suffix>, its role
  /// \p role, its body's insertion point set; the program's (b, h), the
  /// lengths and block counts.
  void begin(llvm::StringRef suffix, llvm::StringRef role);
  /// The offset of (b, h)'s lists in indices (index).
  Value listBase();
  /// The offset of (b, h, \p qb)'s list in indices (i32, \p qb a tile).
  Value listOf(Value qb, Tensor ty);
  /// Chunk \p u of the keys of each row's KV block \p kb0 (a rank-1 tile)
  /// for query row \p t of Q block \p qb: the running maxima of kept and of
  /// masked elements.
  std::pair<Value, Value> evaluate(Value qb, Value kb0, Value t, Value u,
                                   Value any, Value miss);

  FlashFwdOp op;
  func::FuncOp func;
  const int64_t s, c; ///< the sparse block; keys per tile
  const int64_t rows = abi::blocks::kRows;
  /// The program's lengths and blocks (varlen: its sequence's), and the
  /// layout's Q blocks (the longest sequence's).
  Value pidM, bIdx, hIdx, nq, nkv, qBlocks, kvBlocks, qBlocksMax;
};

} // namespace

void MaskBlocksBuilder::begin(llvm::StringRef suffix, llvm::StringRef role) {
  MLIRContext *ctx = b.getContext();
  auto [argTys, argNames] =
      flashjit::attn::detail::forwardArguments(b, op, /*split=*/false);
  func = func::FuncOp::create(b, (op.getSymName() + suffix).str(),
                              FunctionType::get(ctx, argTys, {}));
  func->setAttr("attn.kernel",
                KernelAttr::get(ctx, role, op.getHeadDimQk(), op.getHeadDimV(),
                                op.getElementType(), op.getMask(), op.getGqa(),
                                s, s, s, /*deterministic=*/false,
                                op.namedScoreMod().value_or("custom"),
                                "custom"));
  func->setAttr("attn.arg_names", b.getArrayAttr(argNames));
  b.setInsertionPointToStart(func.addEntryBlock());
  b.setInsertionPoint(func::ReturnOp::create(b));

  const int pids = abi::NumBuffers + abi::NumIndexArgs + 1;
  pidM = arg(pids);
  Value pidBH = arg(pids + 1), heads = indexArg(abi::Heads);
  bIdx = arith::DivUIOp::create(b, pidBH, heads);
  hIdx = arith::RemUIOp::create(b, pidBH, heads);
  nq = indexArg(abi::SeqQ);
  nkv = indexArg(abi::SeqKV);
  auto blocksOf = [&](Value n) {
    return arith::DivUIOp::create(b, add(n, cIdx(s - 1)), cIdx(s));
  };
  qBlocks = qBlocksMax = blocksOf(nq);
  // Varlen: batch b is sequence b, its lengths from the offsets; the
  // layout spans the longest (the problem's), and its positions are the
  // sequence's own, as the forward's.
  if (op.getVarlen()) {
    nq = sequenceOf(arg(abi::CuSeqQ), bIdx).second;
    nkv = sequenceOf(arg(abi::CuSeqKV), bIdx).second;
    qBlocks = blocksOf(nq);
  }
  kvBlocks = blocksOf(nkv);
}

Value MaskBlocksBuilder::listBase() {
  return add(mul(bIdx, indexArg(abi::IndicesStrideB)),
             mul(hIdx, indexArg(abi::IndicesStrideH)));
}

Value MaskBlocksBuilder::listOf(Value qb, Tensor ty) {
  Value base = listBase();
  return arith::AddIOp::create(
      b, splatI32(base, ty),
      arith::MulIOp::create(b, qb,
                            splatI32(indexArg(abi::IndicesStrideM), ty)));
}

std::pair<Value, Value> MaskBlocksBuilder::evaluate(Value qb, Value kb0,
                                                    Value t, Value u, Value any,
                                                    Value miss) {
  Tensor iTy = tile({rows, c}, b.getI32Type()), fTy = tile({rows, c}, f32);
  // Positions past Nq, Nkv or the block (the last chunk's columns when C
  // does not divide S) repeat the block's last real ones, which change
  // neither whether it keeps an element nor whether it keeps all.
  Region &region = op.getMaskMod();
  ModifierPositions at;
  at.batch = bIdx;
  at.head = hIdx;
  auto q = [&] { return splatI32(add(mulC(qb, s), t), iTy); };
  auto kv = [&]() -> Value {
    Value inBlock = indexTile(iTy, 1, mulC(u, c));
    if (s % c != 0)
      inBlock = arith::MinSIOp::create(b, inBlock, constI32(s - 1, iTy));
    return arith::AddIOp::create(
        b, inBlock,
        arith::MulIOp::create(b, broadcast(kb0, iTy, 1), constI32(s, iTy)));
  };
  at.qIdx = q;
  at.kvIdx = kv;
  at.nq = nq;
  at.nkv = nkv;
  at.clampAlways = true;
  unsigned first = func.getNumArguments() - unsigned(totalCapturedTensors(op)) +
                   unsigned(capturedTensors(op.getScoreMod()));
  SmallVector<Value> captures;
  for (unsigned k = 0; k < unsigned(capturedTensors(region)); ++k)
    captures.push_back(func.getArgument(first + k));
  flashjit::attn::detail::ScoreModIndices indices =
      modifierIndicesAt(region, iTy, at, captures);
  Value keep = flashjit::attn::detail::inlineMaskMod(b, b.getLoc(), region,
                                                     {rows, c}, indices);
  Value no = arith::XOrIOp::create(
      b, keep,
      arith::ConstantOp::create(
          b, DenseElementsAttr::get(tile({rows, c}, b.getI1Type()), true)));
  return {maxF(any, indicator(keep, fTy)), maxF(miss, indicator(no, fTy))};
}

void MaskBlocksBuilder::buildClasses() {
  begin(abi::blocks::kSuffix, "mask_blocks");
  // pid_m = qb * ceil(KB / R) + chunk: rows are KV blocks chunk * R + r.
  Value chunks =
      arith::DivUIOp::create(b, add(kvBlocks, cIdx(rows - 1)), cIdx(rows));
  Value qb = arith::DivUIOp::create(b, pidM, chunks);
  Value firstKv = mulC(arith::RemUIOp::create(b, pidM, chunks), rows);
  Tensor rowTy = tile({rows}, b.getI32Type()), fTy = tile({rows, c}, f32);
  Value kb0 = indexTile(rowTy, 0, firstKv);
  // Varlen: a Q block past its sequence evaluates and writes nothing (the
  // grid spans the longest sequence).
  Value rowsEnd = cIdx(s), kvEnd = kvBlocks;
  if (op.getVarlen()) {
    Value inside = cmpI(CmpIPredicate::slt, qb, qBlocks);
    rowsEnd = select(inside, rowsEnd, cIdx(0));
    kvEnd = select(inside, kvEnd, cIdx(0));
  }
  SmallVector<Value> seen = forCarrying(
      cIdx(0), rowsEnd, ValueRange{constTile(0.0, fTy), constTile(0.0, fTy)},
      [&](Value t, ValueRange acc) {
        return forCarrying(cIdx(0), cIdx((s + c - 1) / c), acc,
                           [&](Value u, ValueRange acc) -> SmallVector<Value> {
                             auto [any, miss] =
                                 evaluate(qb, kb0, t, u, acc[0], acc[1]);
                             return {any, miss};
                           });
      });
  Tensor fRow = tile({rows}, f32);
  Value kept =
      cmpF(CmpFPredicate::OGT, reduce("max", seen[0], 1), constTile(0.0, fRow));
  Value full =
      cmpF(CmpFPredicate::OEQ, reduce("max", seen[1], 1), constTile(0.0, fRow));
  // 0: skipped, 1: partial, 2: full; at (b, h, qb)'s list, position kb.
  Value cls = select(kept, select(full, constI32(2, rowTy), constI32(1, rowTy)),
                     constI32(0, rowTy));
  Value list = add(listBase(), mul(qb, indexArg(abi::IndicesStrideM)));
  storeTile(cls, arg(abi::Indices), list, firstKv, kvEnd, Value());
}

void MaskBlocksBuilder::buildLists() {
  begin(abi::blocks::kListSuffix, "mask_blocks_list");
  Tensor rowTy = tile({rows}, b.getI32Type());
  Value first = mulC(pidM, rows);
  Value qb = indexTile(rowTy, 0, first);
  // A tile row past the last Q block (the CPU runs all of them; the GPU
  // skips them) reads the last block's list and writes nothing; varlen: one
  // past its sequence's (but inside the layout) counts 0.
  Value exists = cmpI(CmpIPredicate::slt, qb, splatI32(qBlocks, rowTy));
  Value list = listOf(
      arith::MinSIOp::create(b, qb, splatI32(sub(qBlocksMax, cIdx(1)), rowTy)),
      rowTy);
  SmallVector<Value> counted = forCarrying(
      cIdx(0), kvBlocks, ValueRange{constI32(0, rowTy)},
      [&](Value kb, ValueRange carried) {
        Value k32 = splatI32(kb, rowTy);
        Value cls = tile::GatherOp::create(b, rowTy, arg(abi::Indices),
                                           arith::AddIOp::create(b, list, k32));
        Value kept =
            andI(exists, cmpI(CmpIPredicate::ne, cls, constI32(0, rowTy)));
        Value entry =
            select(cmpI(CmpIPredicate::eq, cls, constI32(2, rowTy)),
                   arith::XOrIOp::create(b, k32, constI32(-1, rowTy)), k32);
        // In place: the count never passes kb, so no class still to be
        // read is overwritten.
        tile::ScatterOp::create(b, entry, arg(abi::Indices),
                                arith::AddIOp::create(b, list, carried[0]),
                                kept);
        return SmallVector<Value>{arith::AddIOp::create(
            b, carried[0],
            select(kept, constI32(1, rowTy), constI32(0, rowTy)))};
      });
  storeTile(counted[0], arg(abi::Counts),
            add(mul(bIdx, indexArg(abi::CountsStrideB)),
                mul(hIdx, indexArg(abi::CountsStrideH))),
            first, qBlocksMax, Value());
}

void flashjit::attn::detail::buildMaskBlocks(OpBuilder &at, FlashFwdOp op) {
  MaskBlocksBuilder(at, op).buildClasses();
  MaskBlocksBuilder(at, op).buildLists();
}
