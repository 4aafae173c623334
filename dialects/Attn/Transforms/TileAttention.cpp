//===- TileAttention.cpp - attn.flash_fwd -> the tiled FA-2 loop ----------===//
//
/// \file
/// `flashjit-tile-attention` turns a kernel description into the body of one
/// program of the FlashAttention-2 forward. Before:
///
///   attn.flash_fwd @attention {element_type = bf16, head_dim_qk = 96 : i64,
///       head_dim_v = 96 : i64, mask = "causal", gqa = 1 : i64,
///       sparse_block = 0 : i64}
///
/// After (abridged; Br = 64, Bc = 64):
///
///   func.func @attention(%q: memref<?xbf16>, ..., %pid_m: index,
///                        %pid_bh: index) attributes {attn.kernel = {...}} {
///     %qt  = memref.alloca() : memref<64x96xf32>   // the Q tile
///     %acc = memref.alloca() : memref<64x96xf32>   // running O
///     %m   = memref.alloca() : memref<64xf32>      // running max (log2 units)
///     %l   = memref.alloca() : memref<64xf32>      // running sum
///     %s   = memref.alloca() : memref<64x64xf32>   // S, then P, of one block
///     scf.for %kb = %lo to %hi step %c1 {          // KV blocks in the band
///       ... S = Q K^T * scale * log2(e); masked only if the block straddles
///       ... m_new = max(m, rowmax(S)); alpha = exp2(m - m_new)
///       ... P = exp2(S - m_new); l = l * alpha + rowsum(P); O = O * alpha
///       ... O += P V
///     }
///     ... o = O / l;  lse = (m + log2(l)) * ln(2)
///   }
///
/// Everything is scf/arith/math/memref, so the same IR runs on the CPU
/// (interpreter mode) and is the input of the GPU lowering.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/IR/AttnDialect.h"
#include "dialects/Attn/Transforms/Passes.h"
#include "dialects/Attn/Transforms/TiledBuilder.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

#include <cmath>
#include <limits>

namespace flashjit::attn {
#define GEN_PASS_DEF_TILEATTENTION
#include "dialects/Attn/Transforms/Passes.h.inc"
} // namespace flashjit::attn

using namespace mlir;
using namespace flashjit;
using namespace flashjit::attn;

namespace {

/// Builds the tiled function for one attn.flash_fwd op.
class TiledForwardBuilder : flashjit::attn::detail::TiledBuilderBase {
public:
  TiledForwardBuilder(FlashFwdOp op, int64_t br, int64_t bc)
      : TiledBuilderBase(op), op(op), br(br), bc(bc), dqk(op.getHeadDimQk()),
        dv(op.getHeadDimV()), sparseBlock(op.getSparseBlock()),
        hasBand(op.getMask() != "none"), elemTy(op.getElementType()) {}

  func::FuncOp build();

private:
  Value arg(int i) { return func.getArgument(i); }
  Value indexArg(abi::IndexArg i) { return arg(abi::NumBuffers + i); }

  void loadQTile();
  void initState();
  void denseKVLoop();
  void sparseKVLoop();
  void processBlock(Value n0);
  void computeScores(Value n0);
  void maskScores(Value n0);
  void onlineSoftmax();
  void accumulatePV(Value n0);
  void writeOutput();

  FlashFwdOp op;
  const int64_t br, bc, dqk, dv, sparseBlock;
  const bool hasBand;
  Type elemTy;
  func::FuncOp func;

  // Values of the program, set up in build().
  Value nq, nkv, scaleLog2, m0, rowsValid, bIdx, hIdx;
  Value qBase, kBase, vBase, oBase, lseBase;
  Value offset, winL, winR, jLo, jHi, fullLo, fullHi;
  Value qTile, acc, rowMax, rowSum, sTile;
  Value zeroF, negInf;
};

} // namespace

func::FuncOp TiledForwardBuilder::build() {
  MLIRContext *ctx = b.getContext();
  auto bufTy = MemRefType::get({ShapedType::kDynamic}, elemTy);
  auto f32BufTy = MemRefType::get({ShapedType::kDynamic}, f32);
  auto i32BufTy = MemRefType::get({ShapedType::kDynamic}, b.getI32Type());
  SmallVector<Type> argTys = {bufTy,    bufTy,    bufTy,   bufTy,
                              f32BufTy, i32BufTy, i32BufTy};
  SmallVector<Attribute> argNames;
  for (int i = 0; i < abi::NumBuffers; ++i)
    argNames.push_back(b.getStringAttr(abi::bufferName(i)));
  for (int i = 0; i < abi::NumIndexArgs; ++i) {
    argTys.push_back(idxTy);
    argNames.push_back(b.getStringAttr(abi::indexArgName(i)));
  }
  argTys.append({f32, idxTy, idxTy});
  for (const char *n : {"scale_log2e", "pid_m", "pid_bh"})
    argNames.push_back(b.getStringAttr(n));

  func = func::FuncOp::create(b, op.getSymName(),
                              FunctionType::get(ctx, argTys, {}));
  // Record the description and the tiling for the later stages.
  SmallVector<NamedAttribute> kernelAttrs(op->getAttrs().begin(),
                                          op->getAttrs().end());
  kernelAttrs.push_back(b.getNamedAttr("block_m", b.getI64IntegerAttr(br)));
  kernelAttrs.push_back(b.getNamedAttr("block_n", b.getI64IntegerAttr(bc)));
  llvm::erase_if(kernelAttrs,
                 [](NamedAttribute a) { return a.getName() == "sym_name"; });
  func->setAttr("attn.kernel", b.getDictionaryAttr(kernelAttrs));
  func->setAttr("attn.arg_names", b.getArrayAttr(argNames));

  Block *entry = func.addEntryBlock();
  b.setInsertionPointToStart(entry);

  zeroF = cF32(0.0);
  negInf = cF32(-std::numeric_limits<double>::infinity());
  nq = indexArg(abi::SeqQ);
  nkv = indexArg(abi::SeqKV);
  scaleLog2 = arg(abi::NumBuffers + abi::NumIndexArgs);
  Value pidM = arg(abi::NumBuffers + abi::NumIndexArgs + 1);
  Value pidBH = arg(abi::NumBuffers + abi::NumIndexArgs + 2);

  // Which (batch, head, Q block) this program owns; GQA maps query head h to
  // KV head h / gqa.
  Value heads = indexArg(abi::Heads);
  bIdx = arith::DivUIOp::create(b, pidBH, heads);
  hIdx = arith::RemUIOp::create(b, pidBH, heads);
  Value hkIdx = arith::DivUIOp::create(b, hIdx, cIdx(op.getGqa()));
  m0 = mulC(pidM, br);
  rowsValid = minI(cIdx(br), sub(nq, m0));
  auto base = [&](abi::IndexArg sb, abi::IndexArg sh, Value head) {
    return add(mul(bIdx, indexArg(sb)), mul(head, indexArg(sh)));
  };
  qBase = add(base(abi::QStrideB, abi::QStrideH, hIdx),
              mul(m0, indexArg(abi::QStrideN)));
  kBase = base(abi::KStrideB, abi::KStrideH, hkIdx);
  vBase = base(abi::VStrideB, abi::VStrideH, hkIdx);
  oBase = add(base(abi::OStrideB, abi::OStrideH, hIdx),
              mul(m0, indexArg(abi::OStrideN)));
  lseBase = add(mul(pidBH, nq), m0);

  // The band of visible keys (bottom-right aligned): row i sees
  // [i + off - L, i + off + R], off = Nkv - Nq. [jLo, jHi] covers the rows
  // of this block; columns in [fullLo, fullHi] are visible from all of them.
  offset = sub(nkv, nq);
  Value lastRow = add(m0, sub(rowsValid, cIdx(1)));
  if (hasBand) {
    winL = indexArg(abi::WindowLeft);
    winR = indexArg(abi::WindowRight);
    jLo = maxI(cIdx(0), sub(add(m0, offset), winL));
    jHi = minI(sub(nkv, cIdx(1)), add(add(lastRow, offset), winR));
    fullLo = sub(add(lastRow, offset), winL);
    fullHi = add(add(m0, offset), winR);
  } else {
    jLo = cIdx(0);
    jHi = sub(nkv, cIdx(1));
  }

  qTile = memref::AllocaOp::create(b, MemRefType::get({br, dqk}, f32));
  acc = memref::AllocaOp::create(b, MemRefType::get({br, dv}, f32));
  rowMax = memref::AllocaOp::create(b, MemRefType::get({br}, f32));
  rowSum = memref::AllocaOp::create(b, MemRefType::get({br}, f32));
  sTile = memref::AllocaOp::create(b, MemRefType::get({br, bc}, f32));

  loadQTile();
  initState();
  if (sparseBlock > 0)
    sparseKVLoop();
  else
    denseKVLoop();
  writeOutput();
  func::ReturnOp::create(b);
  return func;
}

/// Q rows past Nq are zero-filled (their loads are clamped to row 0).
void TiledForwardBuilder::loadQTile() {
  Value q = arg(abi::Q);
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    Value valid = cmpI(arith::CmpIPredicate::slt, r, rowsValid);
    Value row = select(valid, r, cIdx(0));
    Value rowBase = add(qBase, mul(row, indexArg(abi::QStrideN)));
    forLoop(cIdx(0), cIdx(dqk), [&](Value d) {
      Value x = select(valid, loadF32(q, add(rowBase, d)), zeroF);
      store(x, qTile, {r, d});
    });
  });
}

void TiledForwardBuilder::initState() {
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    store(negInf, rowMax, {r});
    store(zeroF, rowSum, {r});
    forLoop(cIdx(0), cIdx(dv), [&](Value d) { store(zeroF, acc, {r, d}); });
  });
}

/// The FA-2 KV loop: an scf.for over the blocks of Bc keys in [jLo, jHi].
void TiledForwardBuilder::denseKVLoop() {
  forBlocksInRange(jLo, jHi, bc, [&](Value n0) { processBlock(n0); });
}

/// Block-sparse: visit only the sparse KV blocks the layout lists for this
/// Q block, each as sparse_block / Bc blocks of Bc keys, skipping those that
/// lie past Nkv or outside the band.
void TiledForwardBuilder::sparseKVLoop() {
  Value qsb = arith::DivUIOp::create(b, m0, cIdx(sparseBlock));
  forListedBlocks(arg(abi::Counts), arg(abi::Indices),
                  {indexArg(abi::CountsStrideB), indexArg(abi::CountsStrideH),
                   indexArg(abi::IndicesStrideB), indexArg(abi::IndicesStrideH),
                   indexArg(abi::IndicesStrideM)},
                  bIdx, hIdx, qsb, sparseBlock, bc, jLo, jHi,
                  [&](Value n0) { processBlock(n0); });
}

/// One iteration of the KV loop over keys [n0, n0 + Bc).
void TiledForwardBuilder::processBlock(Value n0) {
  computeScores(n0);
  // Only blocks that cross Nkv or the band's edge pay for the element mask.
  Value n1 = add(n0, cIdx(bc - 1));
  Value needsMask = cmpI(arith::CmpIPredicate::sge, n1, nkv);
  if (hasBand) {
    needsMask = arith::OrIOp::create(
        b, needsMask, cmpI(arith::CmpIPredicate::slt, n0, fullLo));
    needsMask = arith::OrIOp::create(
        b, needsMask, cmpI(arith::CmpIPredicate::sgt, n1, fullHi));
  }
  ifThen(needsMask, [&] { maskScores(n0); });
  onlineSoftmax();
  accumulatePV(n0);
}

/// S[r, c] = (Q[r] . K[n0 + c]) * scale * log2(e). Key rows past Nkv are
/// clamped to the last one (their scores are masked afterwards).
void TiledForwardBuilder::computeScores(Value n0) {
  Value k = arg(abi::K);
  Value lastKey = sub(nkv, cIdx(1));
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    forLoop(cIdx(0), cIdx(bc), [&](Value c) {
      Value j = minI(add(n0, c), lastKey);
      Value kRow = add(kBase, mul(j, indexArg(abi::KStrideN)));
      Value dot = forReduce(cIdx(0), cIdx(dqk), zeroF, [&](Value d, Value a) {
        Value qv = load(qTile, {r, d});
        Value kv = loadF32(k, add(kRow, d));
        return fadd(a, fmul(qv, kv));
      });
      store(fmul(dot, scaleLog2), sTile, {r, c});
    });
  });
}

/// S[r, c] = -inf where key n0 + c is past Nkv or outside row m0 + r's band.
void TiledForwardBuilder::maskScores(Value n0) {
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    Value diag = add(add(m0, r), offset);
    forLoop(cIdx(0), cIdx(bc), [&](Value c) {
      Value j = add(n0, c);
      Value visible = cmpI(arith::CmpIPredicate::slt, j, nkv);
      if (hasBand) {
        visible = arith::AndIOp::create(
            b, visible, cmpI(arith::CmpIPredicate::sge, j, sub(diag, winL)));
        visible = arith::AndIOp::create(
            b, visible, cmpI(arith::CmpIPredicate::sle, j, add(diag, winR)));
      }
      store(select(visible, load(sTile, {r, c}), negInf), sTile, {r, c});
    });
  });
}

/// The online-softmax update of each row: new max, rescale factor
/// alpha = exp2(m_old - m_new), P = exp2(S - m_new) (rounded to the element
/// type, as the second matmul consumes it), l = l * alpha + rowsum(P),
/// O = O * alpha. A row that has seen no key yet keeps m = -inf; it uses 0 as
/// the subtrahend so that no inf - inf NaN appears.
void TiledForwardBuilder::onlineSoftmax() {
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    Value blockMax =
        forReduce(cIdx(0), cIdx(bc), negInf, [&](Value c, Value a) {
          return arith::MaxNumFOp::create(b, a, load(sTile, {r, c}));
        });
    Value mOld = load(rowMax, {r});
    Value mNew = arith::MaxNumFOp::create(b, mOld, blockMax);
    Value isEmpty =
        arith::CmpFOp::create(b, arith::CmpFPredicate::OEQ, mNew, negInf);
    Value mUse = select(isEmpty, zeroF, mNew);
    Value alpha = math::Exp2Op::create(b, fsub(mOld, mUse));
    Value pSum = forReduce(cIdx(0), cIdx(bc), zeroF, [&](Value c, Value a) {
      Value p = math::Exp2Op::create(b, fsub(load(sTile, {r, c}), mUse));
      Value pLow = arith::TruncFOp::create(b, elemTy, p);
      store(arith::ExtFOp::create(b, f32, pLow), sTile, {r, c});
      return fadd(a, p);
    });
    store(fadd(fmul(load(rowSum, {r}), alpha), pSum), rowSum, {r});
    store(mNew, rowMax, {r});
    forLoop(cIdx(0), cIdx(dv), [&](Value d) {
      store(fmul(load(acc, {r, d}), alpha), acc, {r, d});
    });
  });
}

/// O[r] += sum_c P[r, c] * V[n0 + c] (masked keys have P = 0).
void TiledForwardBuilder::accumulatePV(Value n0) {
  Value v = arg(abi::V);
  Value lastKey = sub(nkv, cIdx(1));
  forLoop(cIdx(0), cIdx(br), [&](Value r) {
    forLoop(cIdx(0), cIdx(bc), [&](Value c) {
      Value p = load(sTile, {r, c});
      Value j = minI(add(n0, c), lastKey);
      Value vRow = add(vBase, mul(j, indexArg(abi::VStrideN)));
      forLoop(cIdx(0), cIdx(dv), [&](Value d) {
        Value o = fadd(load(acc, {r, d}), fmul(p, loadF32(v, add(vRow, d))));
        store(o, acc, {r, d});
      });
    });
  });
}

/// O = acc / l and lse = (m + log2 l) * ln 2; a row that saw no key (l = 0)
/// gets O = 0 and lse = -inf.
void TiledForwardBuilder::writeOutput() {
  Value o = arg(abi::O), lse = arg(abi::Lse);
  forLoop(cIdx(0), rowsValid, [&](Value r) {
    Value l = load(rowSum, {r});
    Value empty = arith::CmpFOp::create(b, arith::CmpFPredicate::OEQ, l, zeroF);
    Value inv = select(empty, zeroF, arith::DivFOp::create(b, cF32(1.0), l));
    Value oRow = add(oBase, mul(r, indexArg(abi::OStrideN)));
    forLoop(cIdx(0), cIdx(dv), [&](Value d) {
      Value x = fmul(load(acc, {r, d}), inv);
      store(arith::TruncFOp::create(b, elemTy, x), o, {add(oRow, d)});
    });
    Value logL = math::Log2Op::create(b, l);
    Value lseVal = fmul(fadd(load(rowMax, {r}), logL), cF32(std::log(2.0)));
    store(select(empty, negInf, lseVal), lse, {add(lseBase, r)});
  });
}

namespace {
struct TileAttentionPass
    : public flashjit::attn::impl::TileAttentionBase<TileAttentionPass> {
  using TileAttentionBase::TileAttentionBase;

  void runOnOperation() override {
    if (failed(
            flashjit::attn::detail::tileEach<FlashFwdOp, TiledForwardBuilder>(
                getOperation(), blockM, blockN)))
      signalPassFailure();
  }
};
} // namespace
