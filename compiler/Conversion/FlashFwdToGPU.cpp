//===- FlashFwdToGPU.cpp - The tiled forward -> a tensor-core kernel ------===//
//
/// \file
/// `flashjit-lower-tiled-to-gpu` maps the tiled FlashAttention-2 program
/// (one func.func per kernel, carrying `attn.kernel`) onto the GPU. Before:
///
///   func.func @attention(%q: memref<?xbf16>, ..., %pid_m: index,
///                        %pid_bh: index) attributes {attn.kernel = {...}}
///
/// After (abridged):
///
///   module attributes {gpu.container_module} {
///     gpu.module @flashjit_kernels {
///       llvm.mlir.global external @flashjit_smem() {addr_space = 3 : i32}
///       gpu.func @attention(%q: !llvm.ptr, ..., %scale_log2e: f32) kernel {
///         // Q tile, then K of the first block: cp.async into smem
///         scf.for %t = %lo to %hi step %c1 iter_args(O, m, l) {
///           // wait; barrier; start V's copy
///           // S = Q K^T: ldmatrix + llvm.nvvm.mma.m16n8k16 (fp32 accum)
///           // scf.if (block straddles the band or Nkv) { mask S }
///           // m, alpha = exp2(m_old - m_new), P = exp2(S - m), l, O *= alpha
///           // wait; barrier; start the next K's copy
///           // O += P V: P packed to bf16 pairs in registers, V by
///           //           ldmatrix.trans
///         }
///         // l summed over the 4 lanes of a row; O / l and lse stored
///       }
///     }
///   }
///
/// The register and shared-memory geometry comes from kernels/GpuGeometry.h,
/// which the launcher uses too.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/GpuBuilder.h"
#include "compiler/Conversion/KernelEmitters.h"
#include "compiler/Conversion/TileCopy.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

#include <cmath>
#include <limits>
#include <optional>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::gpu;
using namespace flashjit::conversion;
using arith::CmpIPredicate;

namespace {

/// Everything the kernel is specialised on.
struct KernelShape {
  AttentionSpec spec;
  TileConfig config;
  int64_t copyBytes;
  GpuGeometry geo;
  bool hasBand;
};

/// Emits the body of one FlashAttention-2 forward kernel.
class FlashFwdKernel {
public:
  FlashFwdKernel(GpuBuilder &g, const KernelShape &k, mlir::gpu::GPUFuncOp fn,
                 Value smem)
      : g(g), k(k), fn(fn), smem(smem), br(k.config.blockM),
        bc(k.config.blockN), mt(k.geo.mTiles), nt(k.config.blockN / 8),
        dt(k.geo.dvChunk / 8) {}

  void emit();

private:
  using Acc = std::array<Value, 4>;
  Value arg(int i) { return fn.getArgument(i); }
  Value idx(abi::IndexArg i) { return arg(abi::NumBuffers + i); }
  Value ptrAt(Value base, Type elemTy, Value index) {
    return LLVM::GEPOp::create(g.b, g.ptrGen, elemTy, base,
                               ArrayRef<LLVM::GEPArg>{index});
  }
  Value loadI32(Value base, Value index64) {
    return LLVM::LoadOp::create(g.b, g.i32, ptrAt(base, g.i32, index64));
  }
  void setUp();
  Value blockStart(Value t);
  void loadTile(Value base, Value rowBase, Value rowStride, Value row0,
                Value nRows, int64_t rows, int64_t logicalCols, Value colBase,
                int64_t padCols, int64_t rowChunks, int64_t smemOffset) {
    copyTileAsync(g, TileCopier{smem, tid, k.geo.threads, k.copyBytes},
                  TileSource{base, rowBase, rowStride, row0, nRows, rows,
                             logicalCols, colBase, padCols, rowChunks,
                             g.c32(smemOffset)});
  }
  void loadKTile(Value n0);
  void loadVTile(Value n0);
  std::vector<Acc> computeScores();
  std::vector<Acc> maskScores(const std::vector<Acc> &s, Value n0);
  void storeOutputs(ArrayRef<Value> acc, ArrayRef<Value> m, ArrayRef<Value> l);
  Value warpRow(int64_t mi, int64_t half) {
    return g.add(warpRow0, g.c32(mi * 16 + 8 * half));
  }

  GpuBuilder &g;
  const KernelShape &k;
  mlir::gpu::GPUFuncOp fn;
  Value smem;
  const int64_t br, bc, mt, nt, dt;

  Value tid, lane, grp, tig, warpRow0, pidBH, chunk, m0, nq, nkv, scaleLog2;
  Value qRowBase, kRowBase, vRowBase, oRowBase, colBaseV;
  Value jLo, jHi, fullLo, fullHi, off64, winL, winR;
  Value tLo, tHi, listBase, perSparse;
  std::optional<FragmentAddresses> qFrag, kFrag, vFrag;
};

void FlashFwdKernel::setUp() {
  tid = g.threadIdX();
  Value warp = g.divU(tid, g.c32(32));
  lane = g.remU(tid, g.c32(32));
  grp = g.divU(lane, g.c32(4));
  tig = g.remU(lane, g.c32(4));
  warpRow0 = g.mul(warp, g.c32(mt * 16));
  Value pidM = g.blockId(mlir::gpu::Dimension::x);
  if (k.spec.mask == MaskKind::Causal) {
    // Heaviest Q blocks (the last rows see the most keys) start first, so
    // the last wave of the grid is made of short blocks.
    Value blocks = arith::IndexCastUIOp::create(
        g.b, g.i32, mlir::gpu::GridDimOp::create(g.b, mlir::gpu::Dimension::x));
    pidM = g.sub(g.sub(blocks, g.c32(1)), pidM);
  }
  pidBH = g.blockId(mlir::gpu::Dimension::y);
  chunk = g.blockId(mlir::gpu::Dimension::z);
  scaleLog2 = arg(abi::NumBuffers + abi::NumIndexArgs);

  // ldmatrix lanes. Q (A operand): row lane % 16, chunk lane / 16. K (B
  // operand of Q K^T): row (lane / 16) * 8 + lane % 8, chunk (lane / 8) % 2.
  // V (B operand of P V, transposed): row ((lane / 8) % 2) * 8 + lane % 8,
  // chunk lane / 16.
  qFrag = fragmentAddresses(g, FragmentPattern::A, lane, warpRow0,
                            g.c32(k.geo.qOffset), k.geo.qkRowChunks);
  kFrag = fragmentAddresses(g, FragmentPattern::B, lane, g.c32(0),
                            g.c32(k.geo.kOffset), k.geo.qkRowChunks);
  vFrag = fragmentAddresses(g, FragmentPattern::BTrans, lane, g.c32(0),
                            g.c32(k.geo.vOffset), k.geo.vRowChunks);

  Value bh64 = g.ext64(pidBH);
  Value heads = idx(abi::Heads);
  Value b = g.divU(bh64, heads), h = g.remU(bh64, heads);
  Value hk = g.divU(h, g.c64(k.spec.gqaGroup));
  auto rowBase = [&](abi::IndexArg sb, abi::IndexArg sh, Value head) {
    return g.add(g.mul(b, idx(sb)), g.mul(head, idx(sh)));
  };
  qRowBase = rowBase(abi::QStrideB, abi::QStrideH, h);
  kRowBase = rowBase(abi::KStrideB, abi::KStrideH, hk);
  vRowBase = rowBase(abi::VStrideB, abi::VStrideH, hk);
  oRowBase = rowBase(abi::OStrideB, abi::OStrideH, h);
  colBaseV = g.mul(chunk, g.c32(k.geo.dvChunk));

  nq = g.trunc32(idx(abi::SeqQ));
  nkv = g.trunc32(idx(abi::SeqKV));
  m0 = g.mul(pidM, g.c32(br));

  // The band of keys this block's rows see (as the tiled IR computes it).
  Value m064 = g.ext64(m0);
  off64 = g.sub(idx(abi::SeqKV), idx(abi::SeqQ));
  Value rowsValid = g.minS(g.c64(br), g.sub(idx(abi::SeqQ), m064));
  Value lastRow = g.add(m064, g.sub(rowsValid, g.c64(1)));
  Value nkvLast = g.sub(idx(abi::SeqKV), g.c64(1));
  if (k.hasBand) {
    winL = idx(abi::WindowLeft);
    winR = idx(abi::WindowRight);
    jLo = g.clampTo32(g.maxS(g.c64(0), g.sub(g.add(m064, off64), winL)));
    jHi = g.clampTo32(g.minS(nkvLast, g.add(g.add(lastRow, off64), winR)));
    fullLo = g.clampTo32(g.sub(g.add(lastRow, off64), winL));
    fullHi = g.clampTo32(g.add(g.add(m064, off64), winR));
  } else {
    jLo = g.c32(0);
    jHi = g.trunc32(nkvLast);
  }

  if (k.spec.blockSparse) {
    int64_t sb = k.spec.sparseBlock;
    perSparse = g.c32(sb / bc);
    Value qsb = g.ext64(g.divU(m0, g.c32(sb)));
    Value countAt = g.add(g.add(g.mul(b, idx(abi::CountsStrideB)),
                                g.mul(h, idx(abi::CountsStrideH))),
                          qsb);
    listBase = g.add(g.add(g.mul(b, idx(abi::IndicesStrideB)),
                           g.mul(h, idx(abi::IndicesStrideH))),
                     g.mul(qsb, idx(abi::IndicesStrideM)));
    tLo = g.c32(0);
    tHi = g.mul(loadI32(arg(abi::Counts), countAt), perSparse);
  } else {
    tLo = g.divS(jLo, g.c32(bc));
    Value end = g.add(g.divS(jHi, g.c32(bc)), g.c32(1));
    tHi = g.select(g.cmp(CmpIPredicate::sge, jHi, jLo), end, tLo);
  }
}

/// First key of KV-loop iteration \p t.
Value FlashFwdKernel::blockStart(Value t) {
  if (!k.spec.blockSparse)
    return g.mul(t, g.c32(bc));
  Value entry = g.ext64(g.divU(t, perSparse));
  Value sparseIdx = loadI32(arg(abi::Indices), g.add(listBase, entry));
  return g.add(g.mul(sparseIdx, g.c32(k.spec.sparseBlock)),
               g.mul(g.remU(t, perSparse), g.c32(bc)));
}

void FlashFwdKernel::loadKTile(Value n0) {
  loadTile(arg(abi::K), kRowBase, idx(abi::KStrideN), n0, nkv, bc,
           k.spec.headDimQK, g.c32(0), k.geo.dqkPad, k.geo.qkRowChunks,
           k.geo.kOffset);
}

void FlashFwdKernel::loadVTile(Value n0) {
  loadTile(arg(abi::V), vRowBase, idx(abi::VStrideN), n0, nkv, bc,
           k.spec.headDimV, colBaseV, k.geo.dvChunk, k.geo.vRowChunks,
           k.geo.vOffset);
}

/// S = Q K^T for this warp's rows: mt x nt accumulators of 4 f32.
std::vector<FlashFwdKernel::Acc> FlashFwdKernel::computeScores() {
  return mmaProduct(g, smem, *qFrag, *kFrag, mt, nt, k.geo.dqkPad / 16);
}

/// -inf where key n0 + col is past Nkv or outside the row's band. Element
/// (mi, ni, e) holds row warpRow(mi, e / 2) + grp, key ni * 8 + tig * 2 + e
/// % 2.
std::vector<FlashFwdKernel::Acc>
FlashFwdKernel::maskScores(const std::vector<Acc> &s, Value n0) {
  Value negInf = g.cf(-std::numeric_limits<double>::infinity());
  std::vector<Acc> out = s;
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t half = 0; half < 2; ++half) {
      Value lo, hi;
      if (k.hasBand) {
        Value row = g.ext64(g.add(m0, g.add(warpRow(mi, half), grp)));
        Value diag = g.add(row, off64);
        lo = g.clampTo32(g.sub(diag, winL));
        hi = g.clampTo32(g.add(diag, winR));
      }
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t e = 0; e < 2; ++e) {
          Value col = g.add(n0, g.add(g.c32(ni * 8 + e), g.mul(tig, g.c32(2))));
          Value ok = g.cmp(CmpIPredicate::slt, col, nkv);
          if (k.hasBand) {
            ok = g.andI(ok, g.cmp(CmpIPredicate::sge, col, lo));
            ok = g.andI(ok, g.cmp(CmpIPredicate::sle, col, hi));
          }
          Value &v = out[mi * nt + ni][2 * half + e];
          v = g.select(ok, v, negInf);
        }
    }
  return out;
}

void FlashFwdKernel::emit() {
  setUp();
  Value negInf = g.cf(-std::numeric_limits<double>::infinity());
  Value zero = g.cf(0.0);

  // Prologue: Q once, K of the first block.
  loadTile(arg(abi::Q), qRowBase, idx(abi::QStrideN), m0, nq, br,
           k.spec.headDimQK, g.c32(0), k.geo.dqkPad, k.geo.qkRowChunks,
           k.geo.qOffset);
  loadKTile(blockStart(tLo));
  g.commitGroup();

  // Loop-carried registers: O (mt x dt x 4), m and l (2 rows per m-tile).
  SmallVector<Value> init(mt * dt * 4, zero);
  init.append(2 * mt, negInf);
  init.append(2 * mt, zero);
  auto loop = scf::ForOp::create(g.b, tLo, tHi, g.c32(1), init);
  {
    OpBuilder::InsertionGuard guard(g.b);
    g.b.setInsertionPointToStart(loop.getBody());
    Value t = loop.getInductionVar();
    auto carried = loop.getRegionIterArgs();
    SmallVector<Value> acc(carried.begin(), carried.begin() + mt * dt * 4);
    SmallVector<Value> m(carried.begin() + mt * dt * 4,
                         carried.begin() + mt * dt * 4 + 2 * mt);
    SmallVector<Value> l(carried.begin() + mt * dt * 4 + 2 * mt, carried.end());
    Value n0 = blockStart(t);
    // Loop-variant copies of the lane bases: addresses are recomputed
    // (one add each) rather than hoisted into live registers.
    std::optional<FragmentAddresses> outerQ = qFrag, outerK = kFrag,
                                     outerV = vFrag;
    Value outerTid = tid;
    qFrag = qFrag->inLoop(g);
    kFrag = kFrag->inLoop(g);
    vFrag = vFrag->inLoop(g);
    tid = g.opaque(tid);

    g.waitAll();
    g.barrier(); // K(t) landed; every warp is done with V(t-1)
    loadVTile(n0);
    g.commitGroup();

    std::vector<Acc> s = computeScores();

    // Only blocks that cross Nkv or the band's edge pay for the mask.
    Value needsMask = g.cmp(CmpIPredicate::sgt, g.add(n0, g.c32(bc)), nkv);
    if (k.hasBand) {
      needsMask = g.orI(needsMask, g.cmp(CmpIPredicate::slt, n0, fullLo));
      needsMask = g.orI(needsMask, g.cmp(CmpIPredicate::sgt,
                                         g.add(n0, g.c32(bc - 1)), fullHi));
    }
    SmallVector<Type> sTypes(mt * nt * 4, g.f32);
    auto maskIf = scf::IfOp::create(g.b, sTypes, needsMask, true);
    auto flatten = [](const std::vector<Acc> &v) {
      SmallVector<Value> f;
      for (const Acc &a : v)
        f.append(a.begin(), a.end());
      return f;
    };
    {
      OpBuilder::InsertionGuard g2(g.b);
      g.b.setInsertionPointToStart(maskIf.thenBlock());
      scf::YieldOp::create(g.b, flatten(maskScores(s, n0)));
      g.b.setInsertionPointToStart(maskIf.elseBlock());
      scf::YieldOp::create(g.b, flatten(s));
    }
    for (int64_t i = 0; i < mt * nt; ++i)
      for (int64_t e = 0; e < 4; ++e)
        s[i][e] = maskIf.getResult(i * 4 + e);

    // Online softmax, per row (mi, half): each row lives in 4 lanes.
    SmallVector<Value> alphas;
    Value maxMoved = g.cmp(CmpIPredicate::ne, g.c32(0), g.c32(0));
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t half = 0; half < 2; ++half) {
        Value mx = negInf;
        for (int64_t ni = 0; ni < nt; ++ni)
          for (int64_t e = 0; e < 2; ++e)
            mx = g.fmax(mx, s[mi * nt + ni][2 * half + e]);
        mx = g.fmax(mx, g.shuffleXor(mx, 1));
        mx = g.fmax(mx, g.shuffleXor(mx, 2));
        // Raw scores: the max is taken before scaling (scale >= 0), and
        // m is kept in scaled log2 units.
        mx = g.fmul(mx, scaleLog2);
        Value &mRow = m[2 * mi + half];
        Value mNew = g.fmax(mRow, mx);
        maxMoved = g.orI(
            maxMoved,
            arith::CmpFOp::create(g.b, arith::CmpFPredicate::UNE, mNew, mRow));
        Value mUse = g.select(g.fcmpEq(mNew, negInf), zero, mNew);
        Value alpha = g.exp2(g.fsub(mRow, mUse));
        Value negMUse = arith::NegFOp::create(g.b, mUse);
        Value sum = zero;
        for (int64_t ni = 0; ni < nt; ++ni)
          for (int64_t e = 0; e < 2; ++e) {
            // P = exp2(s * scale * log2(e) - m): one FMA and one ex2.
            Value &v = s[mi * nt + ni][2 * half + e];
            v = g.exp2(g.fma(v, scaleLog2, negMUse));
            sum = g.fadd(sum, v);
          }
        Value &lRow = l[2 * mi + half];
        lRow = g.fadd(g.fmul(lRow, alpha), sum);
        mRow = mNew;
        alphas.push_back(alpha);
      }
    // O *= alpha only when some row's max moved (a warp-uniform branch):
    // after the first blocks it rarely does, and the rescale is mt * dt * 4
    // multiplies per thread.
    Value anyMoved =
        g.intrinsic("llvm.nvvm.vote.any.sync", {g.i1}, {g.c32(-1), maxMoved});
    SmallVector<Type> accTypes(acc.size(), g.f32);
    auto rescale = scf::IfOp::create(g.b, accTypes, anyMoved, true);
    {
      OpBuilder::InsertionGuard g2(g.b);
      g.b.setInsertionPointToStart(rescale.thenBlock());
      SmallVector<Value> scaled(acc);
      for (int64_t mi = 0; mi < mt; ++mi)
        for (int64_t half = 0; half < 2; ++half)
          for (int64_t di = 0; di < dt; ++di)
            for (int64_t e = 0; e < 2; ++e) {
              Value &o = scaled[(mi * dt + di) * 4 + 2 * half + e];
              o = g.fmul(o, alphas[2 * mi + half]);
            }
      scf::YieldOp::create(g.b, scaled);
      g.b.setInsertionPointToStart(rescale.elseBlock());
      scf::YieldOp::create(g.b, acc);
    }
    for (size_t i = 0; i < acc.size(); ++i)
      acc[i] = rescale.getResult(i);

    g.waitAll();
    g.barrier(); // V(t) landed; every warp is done with K(t)
    Value next = g.add(t, g.c32(1));
    g.ifThen(g.cmp(CmpIPredicate::slt, next, tHi), [&] {
      loadKTile(blockStart(next));
      g.commitGroup();
    });

    // O += P V. P's accumulator layout is the A-operand layout of the next
    // MMA: two n-tiles of S make one 16-wide k-step; V by ldmatrix.trans.
    mmaAccumulate(g, smem, acc, s, *vFrag, mt, nt, k.geo.dvChunk);
    SmallVector<Value> yield(acc);
    yield.append(m);
    yield.append(l);
    scf::YieldOp::create(g.b, yield);
    qFrag = outerQ;
    kFrag = outerK;
    vFrag = outerV;
    tid = outerTid;
  }
  auto res = loop.getResults();
  storeOutputs(
      SmallVector<Value>(res.begin(), res.begin() + mt * dt * 4),
      SmallVector<Value>(res.begin() + mt * dt * 4,
                         res.begin() + mt * dt * 4 + 2 * mt),
      SmallVector<Value>(res.begin() + mt * dt * 4 + 2 * mt, res.end()));
  mlir::gpu::ReturnOp::create(g.b);
}

/// O = acc / l (0 for a row that saw no key), lse = (m + log2 l) * ln 2.
void FlashFwdKernel::storeOutputs(ArrayRef<Value> acc, ArrayRef<Value> m,
                                  ArrayRef<Value> l) {
  Value zero = g.cf(0.0);
  Value negInf = g.cf(-std::numeric_limits<double>::infinity());
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t half = 0; half < 2; ++half) {
      Value lRow = l[2 * mi + half];
      lRow = g.fadd(lRow, g.shuffleXor(lRow, 1));
      lRow = g.fadd(lRow, g.shuffleXor(lRow, 2));
      Value empty = g.fcmpEq(lRow, zero);
      Value inv =
          g.select(empty, zero, arith::DivFOp::create(g.b, g.cf(1.0), lRow));
      Value row = g.add(m0, g.add(warpRow(mi, half), grp));
      Value rowOk = g.cmp(CmpIPredicate::slt, row, nq);
      Value oRow = g.add(oRowBase, g.mul(g.ext64(row), idx(abi::OStrideN)));
      for (int64_t di = 0; di < dt; ++di)
        for (int64_t e = 0; e < 2; ++e) {
          Value col =
              g.add(colBaseV, g.add(g.c32(di * 8 + e), g.mul(tig, g.c32(2))));
          Value ok = g.andI(
              rowOk, g.cmp(CmpIPredicate::slt, col, g.c32(k.spec.headDimV)));
          Value v = g.fmul(acc[(mi * dt + di) * 4 + 2 * half + e], inv);
          g.ifThen(ok, [&] {
            Value ptr = g.elementPtr(arg(abi::O), g.add(oRow, g.ext64(col)));
            LLVM::StoreOp::create(g.b, g.toElementBits(v), ptr);
          });
        }
      Value lse =
          g.fmul(g.fadd(m[2 * mi + half], g.log2(lRow)), g.cf(std::log(2.0)));
      lse = g.select(empty, negInf, lse);
      Value writer =
          g.andI(rowOk, g.andI(g.cmp(CmpIPredicate::eq, tig, g.c32(0)),
                               g.cmp(CmpIPredicate::eq, chunk, g.c32(0))));
      g.ifThen(writer, [&] {
        Value at = g.add(g.mul(g.ext64(pidBH), idx(abi::SeqQ)), g.ext64(row));
        LLVM::StoreOp::create(g.b, lse, ptrAt(arg(abi::Lse), g.f32, at));
      });
    }
}

/// Reads the description and tiling the tiling pass recorded.
FailureOr<KernelShape> readShape(func::FuncOp fn, int64_t warps,
                                 int64_t copyBytes) {
  auto attrs = fn->getAttrOfType<DictionaryAttr>("attn.kernel");
  KernelShape k;
  k.spec = specFromAttrs(attrs);
  k.hasBand = k.spec.mask != MaskKind::None;
  k.config.blockM = intAttr(attrs, "block_m");
  k.config.blockN = intAttr(attrs, "block_n");
  k.config.warps = warps;
  k.copyBytes = copyBytes;
  if (copyBytes != 2 && copyBytes != 4 && copyBytes != 8 && copyBytes != 16)
    return fn.emitError() << "copy-bytes must be 2, 4, 8 or 16, got "
                          << copyBytes;
  std::string problem = gpuConfigProblem(k.spec, k.config, INT64_MAX);
  if (!problem.empty())
    return fn.emitError() << problem;
  k.geo = gpuGeometry(k.spec, k.config);
  return k;
}

} // namespace

LogicalResult
flashjit::conversion::lowerForwardKernel(func::FuncOp fn,
                                         mlir::gpu::GPUModuleOp gpuModule,
                                         int64_t warps, int64_t copyBytes) {
  FailureOr<KernelShape> shape = readShape(fn, warps, copyBytes);
  if (failed(shape))
    return failure();
  ImplicitLocOpBuilder b(fn.getLoc(), fn.getContext());
  GpuBuilder g(b, shape->spec.dtype == DType::BF16 ? Elem::BF16 : Elem::F16);
  SmallVector<Type> argTys(abi::NumBuffers, g.ptrGen);
  argTys.append(abi::NumIndexArgs, g.i64);
  argTys.push_back(g.f32);
  auto kernel = createKernelFunc(b, gpuModule, fn, argTys, shape->geo.threads,
                                 shape->geo.sharedBytes);
  b.setInsertionPointToStart(&kernel.getBody().front());
  Value smem = sharedMemoryBase(b, g);
  FlashFwdKernel(g, *shape, kernel, smem).emit();
  return success();
}
