//===- FlashBwdToGPU.cpp - The tiled backward -> tensor-core kernels ------===//
//
/// \file
/// Lowers the three functions of the tiled backward (made by
/// flashjit-tile-attention-backward, carrying `attn.kernel`) to
/// three gpu.func kernels with the same names and arguments (minus pid_m and
/// pid_bh). The kernels are emitted from `attn.kernel` (the description, the
/// tiling and the role), not from the functions' tile-IR bodies; they compute
/// the bodies' algorithm (the same loops, masks and rounding points). Before:
///
///   func.func @attention_preprocess(...) {attn.kernel_backward = {role =
///       "preprocess", ...}}
///   func.func @attention(...)    {... role = "main" ...}   // dK, dV
///   func.func @attention_dq(...) {... role = "dq_convert" ...} // atomic dQ
///     (or role = "dq" with deterministic = true: the separate dQ pass)
///
/// After (abridged):
///
///   gpu.func @attention_preprocess(...) kernel {
///     // a warp per row: delta = rowsum(dO * O) (shuffles), and
///     // -lse * log2(e) (-inf where lse = -inf) after it in the workspace;
///     // atomic dQ: the row of dq_accum zeroed
///   }
///   gpu.func @attention(...) kernel {     // program: Bc keys, batch*KV head
///     // K, V: cp.async once (resident); warps split the keys
///     scf.for %g = 0 to gqa {             // query heads of the group
///       scf.for %t = %lo to %hi {         // Q blocks that see the keys
///         // Q, dO and their rows' statistics: double-buffered cp.async
///         // S^T = K Q^T (ldmatrix, mma.m16n8k16); P^T = exp2(S^T * scale *
///         //   log2(e) - lse * log2(e)), masked only where the block pair
///         //   straddles the band
///         // dP^T = V dO^T; dS^T = elem(P^T) (dP^T - delta), from P^T
///         //   rounded as dV's MMA takes it (the tiled IR's order)
///         // dV += P^T dO; dK += dS^T Q (P^T, dS^T packed in registers:
///         //   the accumulator layout is the next MMA's A operand;
///         //   dO and Q by ldmatrix.trans)
///         // atomic dQ: dS^T to shared memory; barrier; dQ = dS K
///         //   (ldmatrix.trans of dS^T and of the resident K, the warps
///         //   splitting 64-column groups); red.global.add(.v2).f32 into
///         //   dq_accum, predicated on the row and column existing
///         // 2-D warp grid (kvQuerySplit = 2, Br = 64): a warp computes
///         //   S^T, dP^T for 2x the keys and half the queries; P^T and
///         //   dS^T to shared memory; barrier; dV, dK for its keys and
///         //   half of the columns with A by ldmatrix from those tiles;
///         //   dQ split over (row half, columns)
///       }
///     }
///     // dK * scale, dV stored
///   }
///   gpu.func @attention_dq(...) kernel {  // atomic dQ: a warp per row,
///     // dQ = dq_accum * scale in the element type
///   }
///   gpu.func @attention_dq(...) kernel {  // deterministic: program: Br
///     // rows, batch*head; Q, dO resident; K, V streamed: S = Q K^T,
///     // dP = dO V^T, dS, dQ += dS K; dQ * scale stored
///   }
///
/// Computing S^T rather than S in the dK/dV kernel puts the keys on the MMA
/// rows, so that dK and dV need no transpose through shared memory; only
/// atomic dQ sends dS^T through it. The separate dQ pass (deterministic by
/// construction) is the dK/dV template (FlashBwdKernel) with the roles of
/// the tiles swapped. Geometry: kernels/GpuGeometry.h (gpuBackwardGeometry).
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/KernelEmitters.h"
#include "compiler/Conversion/TileCopy.h"
#include "compiler/Conversion/Wgmma.h"
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
namespace bwd = flashjit::abi::bwd;

namespace {

enum class Role { Preprocess, Main, Dq, DqConvert };

/// Everything one backward kernel is specialised on.
struct BwdShape {
  AttentionSpec spec;
  TileConfig config;
  int64_t copyBytes;
  GpuBackwardGeometry geo;
  bool hasBand;
  Role role;
  bool vectorAtomics; ///< dQ pairs by red.global.add.v2.f32
  /// The dK/dV kernel on warpgroup MMAs (the `wgmma` option where
  /// geo.wgmmaShape holds).
  bool wgmma;
};

/// What a program of a main kernel accumulates: dS times the streamed
/// QK-wide tile, columns [kStart, kStart + kCols) (dK or dQ), and P times
/// the streamed V-wide tile, columns [vStart, vStart + vCols) (dV). Zero
/// columns: not accumulated.
struct Outputs {
  int64_t kCols = 0, vCols = 0;
  Value kStart, vStart; ///< i32, multiples of 64 elements
};

/// How the warpgroups split dQ = dS K: in 64-column blocks where they can,
/// else over the keys (each adding its keys' share).
struct WgDqSplit {
  bool cols;
  int64_t n, keys; ///< the MMAs' N and the keys one warpgroup reduces
};
static WgDqSplit wgDqSplit(int64_t cols, int64_t groups, int64_t bc) {
  bool bycols = (cols / groups) % 64 == 0;
  return {bycols, bycols ? cols / groups : cols, bycols ? bc : bc / groups};
}

/// Emits one of the three backward kernels.
class FlashBwdKernel {
public:
  FlashBwdKernel(GpuBuilder &g, const BwdShape &k, mlir::gpu::GPUFuncOp fn,
                 Value smem)
      : g(g), k(k), fn(fn), smem(smem), kvMajor(k.role == Role::Main),
        wg(kvMajor && k.wgmma), qs(kvMajor && !wg ? k.geo.kvQuerySplit : 1),
        rr(kvMajor ? k.config.blockN : k.geo.dqRows),
        rs(kvMajor ? k.config.blockM : k.geo.dqKeys),
        mt(wg        ? 1
           : kvMajor ? k.geo.keyTiles
                     : k.geo.rowTiles),
        nt(rs / (8 * qs)), sm(kvMajor ? k.geo.kvSmem : k.geo.dqSmem),
        dqw(dqWarps(k.config.warps, qs)) {}

  void emit();

private:
  using Tiles = std::vector<Acc>; ///< mt x nt accumulators (rows x stream)

  Value arg(int i) { return fn.getArgument(i); }
  Value buf(bwd::Buffer i) { return arg(i); }
  Value idx(bwd::IndexArg i) { return arg(bwd::NumBuffers + i); }
  Value f32Arg(bwd::ScalarArg i) {
    return arg(bwd::NumBuffers + bwd::NumIndexArgs + i);
  }
  Value ptrAt(Value base, Type elemTy, Value index64) {
    return LLVM::GEPOp::create(g.b, g.ptrGen, elemTy, base,
                               ArrayRef<LLVM::GEPArg>{index64});
  }
  Value loadF32(Value base, Value index64) {
    return LLVM::LoadOp::create(g.b, g.f32, ptrAt(base, g.f32, index64));
  }
  Value loadI32(Value base, Value index64) {
    return LLVM::LoadOp::create(g.b, g.i32, ptrAt(base, g.i32, index64));
  }
  /// b * stride_b + h * stride_h of a strided (B, H, N, d) tensor (i64).
  Value headBase(bwd::IndexArg strideB, Value bI, Value hI) {
    return g.add(g.mul(bI, idx(strideB)),
                 g.mul(hI, idx(bwd::IndexArg(strideB + 1))));
  }
  Value c32(int64_t v) { return g.c32(v); }

  template <typename Fn> void forEachRow(Fn &&body);
  void emitPreprocess();
  void emitDqConvert();
  void setUpMain();
  void emitMainBody(const Outputs &out);
  SmallVector<Value> streamHead(const Outputs &out, ValueRange acc);
  Value blockStart(Value t);
  void issueStream(Value first, Value stageOff);
  Tiles product(const FragmentAddresses &a, const FragmentAddresses &b,
                int64_t kSteps) {
    return mmaProduct(g, smem, a, b, mt, nt, kSteps);
  }
  void accumulate(MutableArrayRef<Value> acc, const Tiles &lhs,
                  const FragmentAddresses &bTrans, int64_t cols) {
    mmaAccumulate(g, smem, acc, lhs, bTrans, mt, nt, cols);
  }
  SmallVector<Value> step(const Outputs &out, ArrayRef<Value> acc, Value first,
                          Value stageOff);
  void storeKeyTile(const Tiles &t, int64_t tileOffset);
  Tiles probabilities(Tiles s, Value first, Value stageOff);
  SmallVector<Value> wgStep(const Outputs &out, ArrayRef<Value> acc,
                            Value first, Value stageOff);
  SmallVector<Value> wgProduct(ArrayRef<Value> d, bool v, Value stageOff);
  SmallVector<Value> wgPack(const Tiles &lhs);
  SmallVector<Value> wgAccumulate(ArrayRef<Value> d, ArrayRef<Value> a, bool v,
                                  Value stageOff, int64_t cols);
  SmallVector<Value> wgDq(ArrayRef<Value> d, const WgDqSplit &split);
  void wgReduceDq(ArrayRef<Value> d, const WgDqSplit &split, const Outputs &out,
                  Value first);
  /// Bytes of a blocked tile's 64-column block (rows x 128).
  int64_t blockBytes(int64_t rows) const { return wg ? rows * 128 : 0; }
  void addDq(const Outputs &out, Value first);
  void reduceDqPair(Value rowAt, Value rowOk, Value col, Value v0, Value v1,
                    bool checkCols);
  void addDqSlab(const Outputs &out, ArrayRef<int64_t> rounds, Value first);
  Tiles maskTiles(const Tiles &p, Value first);
  void storeTile(ArrayRef<Value> acc, int64_t cols, Value colStart,
                 int64_t logicalCols, Value out, Value rowBase,
                 bwd::IndexArg strideN, Value nRows, Value factor);

  GpuBuilder &g;
  const BwdShape &k;
  mlir::gpu::GPUFuncOp fn;
  Value smem;
  /// The dK/dV kernel (resident keys, streamed queries), else the dQ kernel.
  const bool kvMajor;
  /// Warpgroup MMAs (the dK/dV kernel, BwdShape::wgmma): warp w holds keys
  /// 16w..16w+15 as with mma.sync, warpgroup w / 4 the 64 keys of its MMAs.
  const bool wg;
  /// Warps along the streamed rows (GpuBackwardGeometry::kvQuerySplit in
  /// the dK/dV kernel); rows of the resident and streamed tiles; a warp's
  /// MMA tiles of S (S^T): mt along the resident rows, nt along the
  /// streamed ones.
  const int64_t qs, rr, rs, mt, nt;
  const GpuBackwardGeometry::Smem sm;
  const DqWarps dqw;
  bool grid() const { return qs > 1; }

  Value tid, warp, lane, grp, tig, warpRow0, nq, nkv, off64, winL, winR;
  // The warp's part of the streamed rows (qs > 1), and its first row.
  Value qw, streamRow0;
  // Atomic dQ: the warp's part of the Br rows and its place within it.
  Value dqRowPart, dqInner;
  Value scaleLog2, bI, hI, hkI, row0;
  // Rows of the resident tiles that exist (nkv or nq) and of the streamed.
  Value nResident, nStream;
  // The streamed tensors' (batch, head) offsets; the statistics' row base.
  Value streamQKBase, streamVBase, statBase;
  // Band of the resident rows (dQ kernel): the full-visibility interval.
  Value fullLo, fullHi;
  // Block-sparse: list base and Q/KV blocks per sparse block.
  Value listBase, perSparse;
  // Per-row statistics of the dQ kernel (2 per m-tile).
  SmallVector<Value> rowNegLse, rowDelta;
  // The dK/dV kernel's delta of the current step's streamed rows (2 per
  // n-tile, see probabilities()).
  SmallVector<Value> stepDelta;
  // Atomic dQ without a band: which of the thread's key rows exist (2 per
  // m-tile).
  SmallVector<Value> keyExists;
  FragmentAddresses resQK, resV, strQK, strQKT, strV, strVT;
  /// Atomic dQ: dS^T as the A operand of dS K, and the resident K as its B
  /// operand at this warp's columns (see addDq).
  FragmentAddresses dsA, kB;
  /// 2-D warp grid: P^T and dS^T in shared memory as the A operands of dV
  /// and dK (the warp's keys).
  FragmentAddresses pTA, dsTA;
  /// Warpgroup MMAs: the builder, and the warpgroup's index.
  std::optional<Wgmma> wgmma;
  Value wgIdx;
};

/// Runs \p body(row64, at) for each row of this program's kPreprocessRows
/// rows that exists: a warp per row (lanes over the columns), pid (x, y) =
/// (row block, b * H + h); at = (b * H + h) * Nq + row, the row's index in
/// the packed f32 statistics.
template <typename Fn> void FlashBwdKernel::forEachRow(Fn &&body) {
  const int64_t rows = GpuBackwardGeometry::kPreprocessRows;
  const int64_t warps = GpuBackwardGeometry::kPreprocessThreads / 32;
  tid = g.threadIdX();
  warp = g.divU(tid, c32(32));
  lane = g.remU(tid, c32(32));
  Value pidM = g.blockId(mlir::gpu::Dimension::x);
  Value bh64 = g.ext64(g.blockId(mlir::gpu::Dimension::y));
  bI = g.divU(bh64, idx(bwd::Heads));
  hI = g.remU(bh64, idx(bwd::Heads));
  nq = g.trunc32(idx(bwd::SeqQ));
  auto loop = scf::ForOp::create(g.b, c32(0), c32(rows / warps), c32(1));
  OpBuilder::InsertionGuard guard(g.b);
  g.b.setInsertionPointToStart(loop.getBody());
  Value row = g.add(g.mul(pidM, c32(rows)),
                    g.add(g.mul(loop.getInductionVar(), c32(warps)), warp));
  g.ifThen(g.cmp(CmpIPredicate::slt, row, nq), [&] {
    Value row64 = g.ext64(row);
    body(row64, g.add(g.mul(bh64, idx(bwd::SeqQ)), row64));
  });
}

/// Calls \p body(col, ok) for the columns lane, lane + 32, ... of a row of
/// \p cols columns (col i32, clamped to 0 where !ok).
template <typename Fn>
static void forLaneColumns(GpuBuilder &g, Value lane, int64_t cols, Fn &&body) {
  for (int64_t c0 = 0; c0 < cols; c0 += 32) {
    Value col = g.add(lane, g.c32(c0));
    Value ok = c0 + 32 <= cols ? g.cBool(true)
                               : g.cmp(CmpIPredicate::slt, col, g.c32(cols));
    body(g.select(ok, col, g.c32(0)), ok, c0 + 32 <= cols);
  }
}

/// delta = rowsum(dO * O) and -lse * log2(e) (shuffles for the sum); with
/// atomic dQ, the row of dq_accum zeroed.
void FlashBwdKernel::emitPreprocess() {
  Value negInf = g.cf(-std::numeric_limits<double>::infinity());
  Value totalRows =
      g.mul(g.mul(idx(bwd::Batch), idx(bwd::Heads)), idx(bwd::SeqQ));
  forEachRow([&](Value row64, Value at) {
    Value oRow = g.add(headBase(bwd::OStrideB, bI, hI),
                       g.mul(row64, idx(bwd::OStrideN)));
    Value doRow = g.add(headBase(bwd::DOStrideB, bI, hI),
                        g.mul(row64, idx(bwd::DOStrideN)));
    Value sum = g.cf(0.0);
    forLaneColumns(
        g, lane, k.spec.headDimV, [&](Value col, Value ok, bool whole) {
          Value col64 = g.ext64(col);
          Value prod = g.fmul(g.loadElement(buf(bwd::O), g.add(oRow, col64)),
                              g.loadElement(buf(bwd::DO), g.add(doRow, col64)));
          sum = g.fadd(sum, whole ? prod : g.select(ok, prod, g.cf(0.0)));
        });
    for (int64_t m = 16; m >= 1; m /= 2)
      sum = g.fadd(sum, g.shuffleXor(sum, m));
    if (k.geo.atomicDq) {
      const int64_t dqk = k.spec.headDimQK;
      Value accRow = g.mul(at, g.c64(dqk));
      forLaneColumns(g, lane, dqk, [&](Value col, Value ok, bool) {
        g.ifThen(ok, [&] {
          LLVM::StoreOp::create(
              g.b, g.cf(0.0),
              ptrAt(buf(bwd::DqAccum), g.f32, g.add(accRow, g.ext64(col))));
        });
      });
    }
    g.ifThen(g.cmp(CmpIPredicate::eq, lane, c32(0)), [&] {
      LLVM::StoreOp::create(g.b, sum, ptrAt(buf(bwd::Delta), g.f32, at));
      Value lse = loadF32(buf(bwd::Lse), at);
      Value neg = g.fmul(lse, g.cf(-1.0 / std::log(2.0)));
      neg = g.select(g.fcmpEq(lse, negInf), negInf, neg);
      LLVM::StoreOp::create(
          g.b, neg, ptrAt(buf(bwd::Delta), g.f32, g.add(totalRows, at)));
    });
  });
}

/// Atomic dQ's last step: dQ = dq_accum * scale in the element type.
void FlashBwdKernel::emitDqConvert() {
  const int64_t dqk = k.spec.headDimQK;
  Value scale = f32Arg(bwd::Scale);
  forEachRow([&](Value row64, Value at) {
    Value dqRow = g.add(headBase(bwd::DQStrideB, bI, hI),
                        g.mul(row64, idx(bwd::DQStrideN)));
    Value accRow = g.mul(at, g.c64(dqk));
    forLaneColumns(g, lane, dqk, [&](Value col, Value ok, bool) {
      Value col64 = g.ext64(col);
      Value v = g.fmul(loadF32(buf(bwd::DqAccum), g.add(accRow, col64)), scale);
      g.ifThen(ok, [&] {
        LLVM::StoreOp::create(g.b, g.toElementBits(v),
                              g.elementPtr(buf(bwd::DQ), g.add(dqRow, col64)));
      });
    });
  });
}

void FlashBwdKernel::setUpMain() {
  tid = g.threadIdX();
  warp = g.divU(tid, c32(32));
  lane = g.remU(tid, c32(32));
  grp = g.divU(lane, c32(4));
  tig = g.remU(lane, c32(4));
  // Warp (key part, query part) = (warp / qs, warp % qs).
  warpRow0 = g.mul(grid() ? g.divU(warp, c32(qs)) : warp, c32(mt * 16));
  qw = grid() ? g.remU(warp, c32(qs)) : c32(0);
  streamRow0 = grid() ? g.mul(qw, c32(rs / qs)) : c32(0);
  Value pidM = g.blockId(mlir::gpu::Dimension::x);
  if (!kvMajor && k.spec.mask == MaskKind::Causal) {
    // Heaviest Q blocks first, as in the forward.
    Value blocks = arith::IndexCastUIOp::create(
        g.b, g.i32, mlir::gpu::GridDimOp::create(g.b, mlir::gpu::Dimension::x));
    pidM = g.sub(g.sub(blocks, c32(1)), pidM);
  }
  Value bh64 = g.ext64(g.blockId(mlir::gpu::Dimension::y));
  nq = g.trunc32(idx(bwd::SeqQ));
  nkv = g.trunc32(idx(bwd::SeqKV));
  off64 = g.sub(idx(bwd::SeqKV), idx(bwd::SeqQ));
  if (k.hasBand) {
    winL = idx(bwd::WindowLeft);
    winR = idx(bwd::WindowRight);
  }
  scaleLog2 = f32Arg(bwd::ScaleLog2e);
  Value heads = idx(bwd::Heads);
  if (kvMajor) {
    Value kvHeads = g.divU(heads, g.c64(k.spec.gqaGroup));
    bI = g.divU(bh64, kvHeads);
    hkI = g.remU(bh64, kvHeads);
    row0 = g.mul(pidM, c32(rr));
    nResident = nkv;
    nStream = nq;
  } else {
    bI = g.divU(bh64, heads);
    hI = g.remU(bh64, heads);
    hkI = g.divU(hI, g.c64(k.spec.gqaGroup));
    row0 = g.mul(pidM, c32(rr));
    nResident = nq;
    nStream = nkv;
  }

  // ldmatrix lane addresses: resident tiles are A operands (rows split
  // over the warps); streamed ones B operands, plain for S and dP and
  // transposed for the accumulations.
  const int64_t qkc = k.geo.qkRowChunks, vc = k.geo.vRowChunks;
  resQK = fragmentAddresses(g, FragmentPattern::A, lane, warpRow0,
                            c32(sm.residentQK), qkc);
  resV = fragmentAddresses(g, FragmentPattern::A, lane, warpRow0,
                           c32(sm.residentV), vc);
  strQK = fragmentAddresses(g, FragmentPattern::B, lane, streamRow0,
                            c32(sm.streamQK), qkc);
  strV = fragmentAddresses(g, FragmentPattern::B, lane, streamRow0,
                           c32(sm.streamV), vc);
  // The 2-D grid's warps accumulate dK and dV over their half of the
  // columns (both head dims are multiples of 32 there).
  // An offset of whole groups of 8 chunks moves the base and keeps the
  // lane XOR terms (registers) of the unshifted pattern.
  auto columnHalf = [&](int64_t tileOffset, int64_t rowChunks, int64_t pad) {
    const int64_t chunks = pad / qs / 8;
    if (!grid() || chunks % 8 == 0)
      return fragmentAddresses(
          g, FragmentPattern::BTrans, lane, c32(0),
          g.add(c32(tileOffset), g.mul(qw, c32(chunks * 16))), rowChunks);
    return fragmentAddresses(g, FragmentPattern::BTrans, lane, c32(0),
                             c32(tileOffset), rowChunks,
                             g.mul(qw, c32(chunks)));
  };
  strQKT = columnHalf(sm.streamQK, qkc, k.geo.dqkPad);
  strVT = columnHalf(sm.streamV, vc, k.geo.dvPad);
  if (grid()) {
    pTA = fragmentAddresses(g, FragmentPattern::A, lane, warpRow0,
                            c32(sm.pTile), k.geo.dsRowChunks);
    dsTA = fragmentAddresses(g, FragmentPattern::A, lane, warpRow0,
                             c32(sm.dsTile), k.geo.dsRowChunks);
  }

  if (k.spec.blockSparse)
    perSparse = c32(k.spec.sparseBlock / rs);
  if (kvMajor && k.geo.atomicDq && !k.hasBand)
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t half = 0; half < 2; ++half)
        keyExists.push_back(g.cmp(
            CmpIPredicate::slt,
            g.add(row0, g.add(warpRow0, g.add(c32(mi * 16 + 8 * half), grp))),
            nkv));
  if (wg) {
    wgmma.emplace(g, smem);
    wgIdx = g.divU(warp, c32(4));
  }
  if (kvMajor && k.geo.atomicDq) {
    const int64_t perPart = k.config.warps / dqw.rowSplit;
    dqRowPart = dqw.rowSplit > 1 ? g.divU(warp, c32(perPart)) : c32(0);
    dqInner = dqw.rowSplit > 1 ? g.remU(warp, c32(perPart)) : warp;
    Value rowChunk = dqw.rowSplit > 1
                         ? g.mul(dqRowPart, c32(rs / dqw.rowSplit / 8))
                         : Value();
    dsA = fragmentAddresses(g, FragmentPattern::B, lane, c32(0), c32(sm.dsTile),
                            k.geo.dsRowChunks, rowChunk);
    kB = fragmentAddresses(
        g, FragmentPattern::BTrans, lane, c32(0),
        g.add(c32(sm.residentQK),
              g.mul(g.divU(dqInner, c32(dqw.cols)), c32(128))),
        k.geo.qkRowChunks,
        g.mul(g.remU(dqInner, c32(dqw.cols)), c32(dqw.colWidth / 8)));
  }
}

/// First streamed row (query in the dK/dV kernel, key in the dQ kernel) of
/// loop iteration \p t.
Value FlashBwdKernel::blockStart(Value t) {
  if (!k.spec.blockSparse)
    return g.mul(t, c32(rs));
  Value entry = g.ext64(g.divU(t, perSparse));
  Value listed = loadI32(kvMajor ? buf(bwd::KvIndices) : buf(bwd::Indices),
                         g.add(listBase, entry));
  return g.add(g.mul(listed, c32(k.spec.sparseBlock)),
               g.mul(g.remU(t, perSparse), c32(rs)));
}

/// Issues the copies of the streamed tiles starting at row \p first into
/// the stage at byte \p stageOff (and, in the dK/dV kernel, the rows'
/// statistics: rows past Nq read as zero, which makes their P exactly 1 and
/// their contributions exactly 0, since their Q and dO rows are zero too).
void FlashBwdKernel::issueStream(Value first, Value stageOff) {
  TileCopier who{smem, tid, k.geo.threads, k.copyBytes};
  bool qkIsQ = kvMajor;
  copyTileAsync(g, who,
                TileSource{qkIsQ ? buf(bwd::Q) : buf(bwd::K), streamQKBase,
                           idx(qkIsQ ? bwd::QStrideN : bwd::KStrideN), first,
                           nStream, rs, k.spec.headDimQK, c32(0), k.geo.qkCols,
                           k.geo.qkRowChunks, g.add(stageOff, c32(sm.streamQK)),
                           blockBytes(rs)});
  copyTileAsync(g, who,
                TileSource{qkIsQ ? buf(bwd::DO) : buf(bwd::V), streamVBase,
                           idx(qkIsQ ? bwd::DOStrideN : bwd::VStrideN), first,
                           nStream, rs, k.spec.headDimV, c32(0), k.geo.vCols,
                           k.geo.vRowChunks, g.add(stageOff, c32(sm.streamV)),
                           blockBytes(rs)});
  if (!kvMajor)
    return;
  // 2 * Br floats: -lse * log2(e) (second half of the workspace), then delta.
  Value totalRows =
      g.mul(g.mul(idx(bwd::Batch), idx(bwd::Heads)), idx(bwd::SeqQ));
  for (int64_t pass = 0; pass < 2 * rs; pass += k.geo.threads) {
    auto body = [&] {
      Value i = g.add(tid, c32(pass));
      Value isDelta = g.cmp(CmpIPredicate::uge, i, c32(rs));
      Value r = g.remU(i, c32(rs));
      Value q = g.add(first, r);
      Value ok = g.cmp(CmpIPredicate::slt, q, nq);
      Value at = g.add(statBase, g.ext64(g.select(ok, q, c32(0))));
      at = g.select(isDelta, at, g.add(at, totalRows));
      Value src = g.toGlobal(ptrAt(buf(bwd::Delta), g.f32, at));
      Value dst = g.sharedBytePtr(
          smem, g.add(g.add(stageOff, c32(sm.streamStats)), g.mul(i, c32(4))));
      g.copyAsync(dst, src, g.select(ok, c32(4), c32(0)), 4);
    };
    if (pass + k.geo.threads <= 2 * rs)
      body();
    else
      g.ifThen(g.cmp(CmpIPredicate::ult, tid, c32(2 * rs - pass)), body);
  }
}

/// P with 0 where the pair (query, key) is outside the band or the key is
/// past Nkv. Element (mi, ni, e) sits on resident row warpRow0 + mi * 16 +
/// (e / 2) * 8 + grp and streamed row streamRow0 + ni * 8 + tig * 2 + e % 2.
FlashBwdKernel::Tiles FlashBwdKernel::maskTiles(const Tiles &p, Value first) {
  Tiles out = p;
  Value zero = g.cf(0.0);
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t half = 0; half < 2; ++half) {
      Value r =
          g.add(row0, g.add(warpRow0, g.add(c32(mi * 16 + 8 * half), grp)));
      // Resident row r sees streamed rows in [lo, hi]: for a query r, keys
      // [r + off - L, r + off + R]; for a key r, queries [r - off - R,
      // r - off + L].
      Value lo, hi;
      if (k.hasBand) {
        Value diag =
            kvMajor ? g.sub(g.ext64(r), off64) : g.add(g.ext64(r), off64);
        lo = g.clampTo32(g.sub(diag, kvMajor ? winR : winL));
        hi = g.clampTo32(g.add(diag, kvMajor ? winL : winR));
      }
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t e = 0; e < 2; ++e) {
          Value c = g.add(g.add(first, streamRow0),
                          g.add(c32(ni * 8 + e), g.mul(tig, c32(2))));
          Value ok = !kvMajor         ? g.cmp(CmpIPredicate::slt, c, nkv)
                     : k.geo.atomicDq ? g.cmp(CmpIPredicate::slt, r, nkv)
                                      : g.cBool(true);
          if (k.hasBand) {
            ok = g.andI(ok, g.cmp(CmpIPredicate::sge, c, lo));
            ok = g.andI(ok, g.cmp(CmpIPredicate::sle, c, hi));
          }
          Value &v = out[mi * nt + ni][2 * half + e];
          v = g.select(ok, v, zero);
        }
    }
  return out;
}

/// One streamed block at row \p first, in the stage at \p stageOff.
SmallVector<Value> FlashBwdKernel::step(const Outputs &out,
                                        ArrayRef<Value> accIn, Value first,
                                        Value stageOff) {
  if (wg)
    return wgStep(out, accIn, first, stageOff);
  SmallVector<Value> acc(accIn);
  FragmentAddresses aQK = resQK.inLoop(g), aV = resV.inLoop(g);
  FragmentAddresses bQK = strQK.inLoop(g).shifted(g, stageOff);
  FragmentAddresses bV = strV.inLoop(g).shifted(g, stageOff);

  // S (S^T in the dK/dV kernel), then P.
  Tiles p =
      probabilities(product(aQK, bQK, k.geo.dqkPad / 16), first, stageOff);
  auto delta = [&](int64_t mi, int64_t ni, int64_t e) {
    return kvMajor ? stepDelta[ni * 2 + e % 2] : rowDelta[mi * 2 + e / 2];
  };

  // The warp's columns of dK and dV (all of them, or its half in the 2-D
  // grid).
  const int64_t kCols = out.kCols / qs, vCols = out.vCols / qs;
  MutableArrayRef<Value> accK(acc.data(), mt * kCols / 8 * 4);
  MutableArrayRef<Value> accV(acc.data() + mt * kCols / 8 * 4,
                              mt * vCols / 8 * 4);
  FragmentAddresses bVT;
  if (out.vCols)
    bVT =
        strVT.inLoop(g).shifted(g, g.add(stageOff, g.mul(out.vStart, c32(2))));
  if (grid())
    storeKeyTile(p, sm.pTile);
  else if (out.vCols) // dV += P^T dO
    accumulate(accV, p, bVT, out.vCols);
  if (out.kCols) {
    // dP = dO V^T (dP^T = V dO^T), dS = P (dP - delta) with P rounded to
    // the element type, as dV's MMA takes it (the tiled IR's rounding
    // point; wgStep's dS too): the pairs are packed as the MMA's A operand
    // and P^T's stores pack them.
    Tiles ds = product(aV, bV, k.geo.dvPad / 16);
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t half = 0; half < 2; ++half) {
          const Acc &pa = p[mi * nt + ni];
          auto [p0, p1] = g.unpack2(g.pack2(pa[2 * half], pa[2 * half + 1]));
          for (int64_t e = 2 * half; e < 2 * half + 2; ++e) {
            Value &v = ds[mi * nt + ni][e];
            v = g.fmul(e % 2 ? p1 : p0, g.fsub(v, delta(mi, ni, e)));
          }
        }
    // dK += dS^T Q, dQ += dS K (atomic dQ: dS^T stored before the dK
    // MMAs, which then cover the stores' latency: +0.3-1%, run B13).
    const bool atomicDq = kvMajor && k.geo.atomicDq;
    if (atomicDq)
      storeKeyTile(ds, sm.dsTile);
    FragmentAddresses bQKT =
        strQKT.inLoop(g).shifted(g, g.add(stageOff, g.mul(out.kStart, c32(2))));
    if (grid()) {
      // Every warp's P^T and dS^T are stored: dV and dK over all Br
      // queries, then dQ.
      g.barrier();
      mmaAccumulateShared(g, smem, accV, pTA.inLoop(g), bVT, mt, rs / 16,
                          vCols);
      mmaAccumulateShared(g, smem, accK, dsTA.inLoop(g), bQKT, mt, rs / 16,
                          kCols);
      addDq(out, first);
    } else {
      accumulate(accK, ds, bQKT, out.kCols);
      if (atomicDq) {
        g.barrier(); // every warp's dS^T is stored
        addDq(out, first);
      }
    }
  }
  return acc;
}

/// P = exp2(S * scale * log2(e) - lse * log2(e)) (one FMA and one ex2 per
/// element) from \p p = S (S^T in the dK/dV kernel), masked; the dK/dV
/// kernel also loads the streamed rows' delta into stepDelta.
FlashBwdKernel::Tiles FlashBwdKernel::probabilities(Tiles p, Value first,
                                                    Value stageOff) {
  SmallVector<Value> colNegLse, colDelta;
  if (kvMajor) {
    Value stats = g.add(stageOff, c32(sm.streamStats));
    for (int64_t ni = 0; ni < nt; ++ni)
      for (int64_t e = 0; e < 2; ++e) {
        Value c = g.add(g.add(streamRow0, c32(ni * 8 + e)), g.mul(tig, c32(2)));
        Value at = g.add(stats, g.mul(c, c32(4)));
        colNegLse.push_back(
            LLVM::LoadOp::create(g.b, g.f32, g.sharedBytePtr(smem, at)));
        colDelta.push_back(LLVM::LoadOp::create(
            g.b, g.f32, g.sharedBytePtr(smem, g.add(at, c32(rs * 4)))));
      }
  }
  auto negLse = [&](int64_t mi, int64_t ni, int64_t e) {
    return kvMajor ? colNegLse[ni * 2 + e % 2] : rowNegLse[mi * 2 + e / 2];
  };
  stepDelta = colDelta;
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t ni = 0; ni < nt; ++ni)
      for (int64_t e = 0; e < 4; ++e) {
        Value &v = p[mi * nt + ni][e];
        v = g.exp2(g.fma(v, scaleLog2, negLse(mi, ni, e)));
      }

  // Only block pairs that cross Nkv (dQ kernel) or the band's edge pay for
  // the element mask.
  Value needsMask = g.cBool(false);
  if (!kvMajor)
    needsMask = g.cmp(CmpIPredicate::sgt, g.add(first, c32(rs)), nkv);
  if (k.hasBand) {
    if (kvMajor) {
      // Keys [row0, row0 + Bc) x queries [first, first + Br): all visible
      // iff row0 >= lastQuery + off - L and lastKey <= first + off + R.
      Value q0 = g.ext64(first), n0 = g.ext64(row0);
      Value lastQ = g.add(q0, g.c64(rs - 1)), lastK = g.add(n0, g.c64(rr - 1));
      needsMask = g.orI(
          g.cmp(CmpIPredicate::slt, n0, g.sub(g.add(lastQ, off64), winL)),
          g.cmp(CmpIPredicate::sgt, lastK, g.add(g.add(q0, off64), winR)));
    } else {
      needsMask = g.orI(needsMask, g.cmp(CmpIPredicate::slt, first, fullLo));
      needsMask = g.orI(needsMask, g.cmp(CmpIPredicate::sgt,
                                         g.add(first, c32(rs - 1)), fullHi));
    }
  }
  // Without a band and without atomic dQ the dK/dV kernel needs no mask:
  // keys past Nkv only feed dK/dV rows that are never stored. With atomic
  // dQ they would feed dQ (their P need not be finite): without a band, a
  // select per element (no branch) zeroes them; with one, the last KV
  // block takes the element mask.
  if (!keyExists.empty())
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t ni = 0; ni < nt; ++ni)
        for (int64_t e = 0; e < 4; ++e) {
          Value &v = p[mi * nt + ni][e];
          v = g.select(keyExists[mi * 2 + e / 2], v, g.cf(0.0));
        }
  if (kvMajor && k.geo.atomicDq && k.hasBand)
    needsMask =
        g.orI(needsMask, g.cmp(CmpIPredicate::sgt, g.add(row0, c32(rr)), nkv));
  if (!kvMajor || k.hasBand) {
    SmallVector<Type> types(mt * nt * 4, g.f32);
    auto maskIf = scf::IfOp::create(g.b, types, needsMask, true);
    auto flatten = [](const Tiles &t) {
      SmallVector<Value> f;
      for (const Acc &a : t)
        f.append(a.begin(), a.end());
      return f;
    };
    {
      OpBuilder::InsertionGuard guard(g.b);
      g.b.setInsertionPointToStart(maskIf.thenBlock());
      scf::YieldOp::create(g.b, flatten(maskTiles(p, first)));
      g.b.setInsertionPointToStart(maskIf.elseBlock());
      scf::YieldOp::create(g.b, flatten(p));
    }
    for (int64_t i = 0; i < mt * nt; ++i)
      for (int64_t e = 0; e < 4; ++e)
        p[i][e] = maskIf.getResult(i * 4 + e);
  }
  return p;
}

/// Warpgroup MMAs: issues d += S^T = K Q^T (\p v false) or dP^T = V dO^T
/// (\p v true) for the warpgroup's 64 keys and all Br queries, one m64nBr
/// k16 MMA per 16 columns of the head dim, both operands K-major in blocked
/// tiles (the k-step's 32 bytes within the 128-byte rows of a 64-column
/// block).
SmallVector<Value> FlashBwdKernel::wgProduct(ArrayRef<Value> dIn, bool v,
                                             Value stageOff) {
  const int64_t kSteps = (v ? k.geo.dvPad : k.geo.dqkPad) / 16;
  Value aTile =
      g.add(c32(v ? sm.residentV : sm.residentQK), g.mul(wgIdx, c32(64 * 128)));
  Value bTile = g.add(stageOff, c32(v ? sm.streamV : sm.streamQK));
  SmallVector<Value> d(dIn);
  for (int64_t ks = 0; ks < kSteps; ++ks) {
    const int64_t inRow = (ks % 4) * 32;
    Value a = wgmma->descriptor(g.add(aTile, c32((ks / 4) * rr * 128 + inRow)),
                                Major::K, rr * 128);
    Value b = wgmma->descriptor(g.add(bTile, c32((ks / 4) * rs * 128 + inRow)),
                                Major::K, rs * 128);
    d = wgmma->mma(rs, d, a, {}, b, false, false);
  }
  return d;
}

/// The A registers of lhs (P^T or dS^T, the warp's 16 keys x Br queries
/// in accumulator layout): 4 per 16 queries.
SmallVector<Value> FlashBwdKernel::wgPack(const Tiles &lhs) {
  SmallVector<Value> a;
  for (int64_t kk = 0; kk < nt / 2; ++kk) {
    const Acc &lo = lhs[2 * kk], &hi = lhs[2 * kk + 1];
    a.append({g.pack2(lo[0], lo[1]), g.pack2(lo[2], lo[3]),
              g.pack2(hi[0], hi[1]), g.pack2(hi[2], hi[3])});
  }
  return a;
}

/// Warpgroup MMAs: issues d (\p cols / 8 n-tiles) += lhs B, lhs as the A
/// registers \p a (wgPack), B the streamed dO (\p v) or Q read MN-major:
/// one m64n(cols)k16 MMA per 16 queries.
SmallVector<Value> FlashBwdKernel::wgAccumulate(ArrayRef<Value> dIn,
                                                ArrayRef<Value> a, bool v,
                                                Value stageOff, int64_t cols) {
  Value bTile = g.add(stageOff, c32(v ? sm.streamV : sm.streamQK));
  SmallVector<Value> d(dIn);
  for (int64_t kk = 0; kk < nt / 2; ++kk) {
    Value b = wgmma->descriptor(g.add(bTile, c32(kk * 16 * 128)), Major::MN,
                                rs * 128);
    d = wgmma->mma(cols, d, Value(), a.slice(4 * kk, 4), b, false, true);
  }
  return d;
}

/// Warpgroup MMAs: issues d += dS K (after the barrier that follows the
/// dS^T stores), A = dS from the dS^T tile and B = the resident K, both
/// MN-major.
SmallVector<Value> FlashBwdKernel::wgDq(ArrayRef<Value> dIn,
                                        const WgDqSplit &split) {
  Value kTile =
      g.add(c32(sm.residentQK),
            split.cols ? g.mul(wgIdx, c32(split.n / 64 * rr * 128)) : c32(0));
  Value keyBytes = split.cols ? c32(0) : g.mul(wgIdx, c32(split.keys * 128));
  SmallVector<Value> d(dIn);
  for (int64_t ks = 0; ks < split.keys / 16; ++ks) {
    Value rows = g.add(keyBytes, c32(ks * 16 * 128));
    Value a =
        wgmma->descriptor(g.add(c32(sm.dsTile), rows), Major::MN, rr * 128);
    Value b = wgmma->descriptor(g.add(kTile, rows), Major::MN, rr * 128);
    d = wgmma->mma(split.n, d, a, {}, b, true, true);
  }
  return d;
}

/// dq_accum += the warpgroup's dS K (\p d) as in addDqSlab: warp w % 4
/// holds query rows 16 (w % 4)..+15 of its columns.
void FlashBwdKernel::wgReduceDq(ArrayRef<Value> d, const WgDqSplit &split,
                                const Outputs &out, Value first) {
  const int64_t dqk = k.spec.headDimQK;
  Value colBase = split.cols ? g.mul(wgIdx, c32(split.n)) : c32(0);
  Value rowBase = g.mul(g.add(g.mul(bI, idx(bwd::Heads)), hI), idx(bwd::SeqQ));
  Value col0 = g.add(g.add(out.kStart, colBase), g.mul(tig, c32(2)));
  Value q0 = g.add(first, g.add(g.mul(g.remU(warp, c32(4)), c32(16)), grp));
  for (int64_t half = 0; half < 2; ++half) {
    Value q = g.add(q0, c32(8 * half));
    Value rowOk = g.cmp(CmpIPredicate::slt, q, nq);
    Value rowAt = g.mul(g.add(rowBase, g.ext64(q)), g.c64(dqk));
    for (int64_t j = 0; j < split.n / 8; ++j)
      reduceDqPair(rowAt, rowOk, g.add(col0, c32(8 * j)), d[4 * j + 2 * half],
                   d[4 * j + 2 * half + 1], dqk % 64 != 0);
  }
}

/// One streamed block on warpgroup MMAs, in three batches (each: the
/// registers it reads pinned, wgmma.fence, the MMAs, commit):
///   1. S^T; wait; P;
///   2. dV += P^T dO and dP^T together; wait; dS; dS^T to shared memory;
///   3. dK += dS^T Q, left in flight across the barrier, then dQ = dS K;
///      wait for both; the dQ reductions.
SmallVector<Value> FlashBwdKernel::wgStep(const Outputs &out,
                                          ArrayRef<Value> accIn, Value first,
                                          Value stageOff) {
  const int64_t kc = out.kCols / 2, vc = out.vCols / 2;
  auto zeros = [&](int64_t n) { return SmallVector<Value>(n, g.cf(0.0)); };
  auto tiles = [&](ArrayRef<Value> d) {
    Tiles t(d.size() / 4);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = {d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]};
    return t;
  };
  auto finish = [&](SmallVector<Value> d) {
    wgmma->commit();
    wgmma->wait(0);
    return wgmma->pin(d);
  };

  // 1. S^T, P.
  SmallVector<Value> s = wgmma->pin(zeros(rs / 2));
  wgmma->fence();
  Tiles p = probabilities(tiles(finish(wgProduct(s, false, stageOff))), first,
                          stageOff);

  // 2. dV and dP^T.
  SmallVector<Value> live(accIn.begin() + kc, accIn.begin() + kc + vc);
  SmallVector<Value> pa = wgPack(p);
  live.append(pa);
  live.append(zeros(rs / 2));
  live = wgmma->pin(live);
  wgmma->fence();
  SmallVector<Value> accV = wgAccumulate(
      ArrayRef<Value>(live).take_front(vc),
      ArrayRef<Value>(live).slice(vc, pa.size()), true, stageOff, out.vCols);
  SmallVector<Value> dp =
      wgProduct(ArrayRef<Value>(live).take_back(rs / 2), true, stageOff);
  SmallVector<Value> both(accV);
  both.append(dp);
  both = finish(both);
  // dS = P (dP - delta) with P as dV used it (the packed A registers):
  // P's f32 registers are free while dV and dP^T run.
  Tiles ds = tiles(ArrayRef<Value>(both).take_back(rs / 2));
  for (int64_t ni = 0; ni < nt; ++ni)
    for (int64_t half = 0; half < 2; ++half) {
      // Tile ni's row half `half` is A register (ni / 2) * 4 + (ni % 2) * 2
      // + half of wgPack.
      auto [p0, p1] = g.unpack2(live[vc + (ni / 2) * 4 + (ni % 2) * 2 + half]);
      for (int64_t e = 0; e < 2; ++e) {
        Value &v = ds[ni][2 * half + e];
        v = g.fmul(e ? p1 : p0, g.fsub(v, stepDelta[ni * 2 + e]));
      }
    }
  storeKeyTile(ds, sm.dsTile);

  // 3. dK, then (every warp's dS^T stored) dQ.
  SmallVector<Value> kLive(accIn.begin(), accIn.begin() + kc);
  SmallVector<Value> dsa = wgPack(ds);
  kLive.append(dsa);
  kLive = wgmma->pin(kLive);
  wgmma->fence();
  SmallVector<Value> accK = wgAccumulate(
      ArrayRef<Value>(kLive).take_front(kc),
      ArrayRef<Value>(kLive).take_back(dsa.size()), false, stageOff, out.kCols);
  wgmma->commit();
  wgmma->fenceProxyAsync(); // dS^T, stored above, is read by wgmma
  g.barrier();
  WgDqSplit split = wgDqSplit(out.kCols, k.config.warps / 4, rr);
  SmallVector<Value> dq = wgmma->pin(zeros(split.n / 2));
  wgmma->fence();
  dq = wgDq(dq, split);
  SmallVector<Value> all(accK);
  all.append(dq);
  all = finish(all);
  wgReduceDq(ArrayRef<Value>(all).take_back(split.n / 2), split, out, first);

  SmallVector<Value> acc(all.begin(), all.begin() + kc);
  acc.append(ArrayRef<Value>(both).take_front(vc).begin(),
             ArrayRef<Value>(both).take_front(vc).end());
  return acc;
}

/// P^T or dS^T (keys x queries, the warp's part) to the shared-memory tile
/// at \p tileOffset, 32-bit stores of the accumulator's column pairs. The
/// block's barrier at the start of the next step guards the tile.
void FlashBwdKernel::storeKeyTile(const Tiles &t, int64_t tileOffset) {
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t half = 0; half < 2; ++half) {
      Value key = g.add(warpRow0, g.add(c32(mi * 16 + 8 * half), grp));
      for (int64_t ni = 0; ni < nt; ++ni) {
        const Acc &a = t[mi * nt + ni];
        Value col = g.add(streamRow0, c32(ni * 8));
        Value chunkAt = wg ? g.swizzledBlocked(key, col, blockBytes(rr))
                           : g.swizzled(key, col, k.geo.dsRowChunks);
        Value at = g.add(c32(tileOffset), g.add(chunkAt, g.mul(tig, c32(4))));
        LLVM::StoreOp::create(g.b, g.pack2(a[2 * half], a[2 * half + 1]),
                              g.sharedBytePtr(smem, at));
      }
    }
}

/// Atomic dQ, second half (after a barrier: every warp's dS^T is stored):
/// dq_accum[streamed rows, kStart + c] += (dS K)[row, kStart + c] over this
/// program's keys, unscaled: dS^T comes back from shared memory as the A
/// operand by ldmatrix.trans; K is resident.
void FlashBwdKernel::addDq(const Outputs &out, Value first) {
  // Rounds of column groups, as many per slab as keep the slab's
  // accumulators at 64 registers; a last partial round only for the warp
  // phases that have a group.
  const DqWarps &w = dqw;
  const int64_t groups = ceilDiv(out.kCols, 64);
  const int64_t fullRounds = groups / w.groups;
  const int64_t regsPerRound = rs / w.rowSplit / 16 * (w.colWidth / 8) * 4;
  const int64_t perSlab = std::max<int64_t>(1, 64 / regsPerRound);
  for (int64_t r0 = 0; r0 < fullRounds; r0 += perSlab) {
    SmallVector<int64_t> rounds;
    for (int64_t r = r0; r < std::min(fullRounds, r0 + perSlab); ++r)
      rounds.push_back(r);
    addDqSlab(out, rounds, first);
  }
  if (groups % w.groups != 0)
    g.ifThen(g.cmp(CmpIPredicate::ult, g.divU(dqInner, c32(w.cols)),
                   c32(groups % w.groups)),
             [&] { addDqSlab(out, {fullRounds}, first); });
}

/// One slab of addDq: the warp's columns of \p rounds (column group
/// r * groups + phase of each round r, piece warp % cols of it).
void FlashBwdKernel::addDqSlab(const Outputs &out, ArrayRef<int64_t> rounds,
                               Value first) {
  const DqWarps &w = dqw;
  const int64_t pairs = w.colWidth / 16, mtQ = rs / w.rowSplit / 16;
  const int64_t dqk = k.spec.headDimQK;
  SmallVector<int64_t> chunks, colConst;
  for (int64_t r : rounds)
    for (int64_t jj = 0; jj < pairs; ++jj) {
      chunks.push_back(8 * r * w.groups + 2 * jj);
      colConst.push_back(64 * r * w.groups + 16 * jj);
    }
  FragmentAddresses b = kB.inLoop(g).shifted(g, g.mul(out.kStart, c32(2)));
  Tiles dq =
      mmaProductTransposed(g, smem, dsA.inLoop(g), b, mtQ, chunks, rr / 16);
  // Columns past the head dim exist only where the chunks overhang it.
  const bool colsInside =
      dqk % 64 == 0 &&
      (k.geo.kvCombined ? out.kCols == dqk
                        : k.geo.dkChunk * k.geo.dkChunks == dqk);
  Value warpCol0 =
      g.add(out.kStart,
            g.add(g.mul(g.divU(dqInner, c32(w.cols)), c32(64)),
                  g.add(g.mul(g.remU(dqInner, c32(w.cols)), c32(w.colWidth)),
                        g.mul(tig, c32(2)))));
  Value rows0 = w.rowSplit > 1
                    ? g.add(first, g.mul(dqRowPart, c32(rs / w.rowSplit)))
                    : first;
  Value rowBase = g.mul(g.add(g.mul(bI, idx(bwd::Heads)), hI), idx(bwd::SeqQ));
  const int64_t nt2 = int64_t(chunks.size()) * 2;
  for (int64_t mi = 0; mi < mtQ; ++mi)
    for (int64_t half = 0; half < 2; ++half) {
      Value q = g.add(rows0, g.add(c32(mi * 16 + 8 * half), grp));
      Value rowOk = g.cmp(CmpIPredicate::slt, q, nq);
      Value rowAt = g.mul(g.add(rowBase, g.ext64(q)), g.c64(dqk));
      for (int64_t n = 0; n < nt2; ++n) {
        const Acc &v = dq[mi * nt2 + n];
        reduceDqPair(rowAt, rowOk,
                     g.add(warpCol0, c32(colConst[n / 2] + 8 * (n % 2))),
                     v[2 * half], v[2 * half + 1], !colsInside);
      }
    }
}

/// dq_accum[rowAt + col + e] += v_e for e = 0, 1 where the row exists
/// (\p rowOk) and, with \p checkCols, the column does: one vector
/// reduction where the target has them and the row's pairs are 8-byte
/// aligned (dqk even: col + 1 < dqk iff col < dqk), else two. Predicated,
/// not branched: the caller's block stays one basic block.
void FlashBwdKernel::reduceDqPair(Value rowAt, Value rowOk, Value col, Value v0,
                                  Value v1, bool checkCols) {
  const int64_t dqk = k.spec.headDimQK;
  const bool pair = k.vectorAtomics && dqk % 2 == 0;
  for (int64_t e = 0; e < 2; e += pair ? 2 : 1) {
    Value c = e ? g.add(col, c32(e)) : col;
    Value ok = checkCols ? g.andI(rowOk, g.cmp(CmpIPredicate::slt, c, c32(dqk)))
                         : rowOk;
    Value ptr = ptrAt(buf(bwd::DqAccum), g.f32, g.add(rowAt, g.ext64(c)));
    if (pair)
      g.reduceAdd2(ok, ptr, v0, v1);
    else
      g.reduceAdd(ok, ptr, e ? v1 : v0);
  }
}

/// The pipelined loop over the streamed blocks of the current head: two
/// stages; block t + 1 copies while block t computes.
SmallVector<Value> FlashBwdKernel::streamHead(const Outputs &out,
                                              ValueRange accIn) {
  // The streamed blocks [tLo, tHi).
  Value tLo, tHi;
  if (k.spec.blockSparse) {
    Value sb = c32(k.spec.sparseBlock);
    Value residentSparse = g.ext64(g.divU(row0, sb));
    // The dK/dV kernel walks the KV-major transpose, the dQ kernel the
    // forward's layout; their strides are laid out alike.
    auto cs = kvMajor ? bwd::KvCountsStrideB : bwd::CountsStrideB;
    auto is = kvMajor ? bwd::KvIndicesStrideB : bwd::IndicesStrideB;
    auto at = [&](int64_t i) { return idx(bwd::IndexArg(i)); };
    Value countBuf = kvMajor ? buf(bwd::KvCounts) : buf(bwd::Counts);
    Value countAt =
        g.add(g.add(g.mul(bI, at(cs)), g.mul(hI, at(cs + 1))), residentSparse);
    listBase = g.add(g.add(g.mul(bI, at(is)), g.mul(hI, at(is + 1))),
                     g.mul(residentSparse, at(is + 2)));
    tLo = c32(0);
    tHi = g.mul(loadI32(countBuf, countAt), perSparse);
  } else {
    // Streamed rows the resident block sees: for queries (dQ kernel) keys
    // [first + off - L, last + off + R]; for keys (dK/dV kernel) queries
    // [first - off - R, last - off + L]; clipped to the tensor.
    Value first64 = g.ext64(row0);
    Value valid = g.minS(g.c64(rr), g.sub(g.ext64(nResident), first64));
    Value last64 = g.add(first64, g.sub(valid, g.c64(1)));
    Value lo = g.c64(0);
    Value hi = g.sub(g.ext64(nStream), g.c64(1));
    if (k.hasBand) {
      if (kvMajor) {
        lo = g.maxS(lo, g.sub(g.sub(first64, off64), winR));
        hi = g.minS(hi, g.add(g.sub(last64, off64), winL));
      } else {
        lo = g.maxS(lo, g.sub(g.add(first64, off64), winL));
        hi = g.minS(hi, g.add(g.add(last64, off64), winR));
      }
    }
    Value lo32 = g.clampTo32(lo), hi32 = g.clampTo32(hi);
    tLo = g.divS(lo32, c32(rs));
    Value end = g.add(g.divS(hi32, c32(rs)), c32(1));
    tHi = g.select(g.cmp(CmpIPredicate::sge, hi32, lo32), end, tLo);
  }

  g.barrier(); // every warp is done with both stages (previous head)
  g.ifThen(g.cmp(CmpIPredicate::slt, tLo, tHi),
           [&] { issueStream(blockStart(tLo), c32(0)); });
  g.commitGroup();

  auto loop = scf::ForOp::create(g.b, tLo, tHi, c32(1), accIn);
  {
    OpBuilder::InsertionGuard guard(g.b);
    g.b.setInsertionPointToStart(loop.getBody());
    Value t = loop.getInductionVar();
    Value outerTid = tid;
    tid = g.opaque(tid);
    Value stage = g.andI(g.sub(t, tLo), c32(1));
    Value stageOff = g.mul(stage, c32(sm.stageBytes));
    Value next = g.add(t, c32(1));
    g.barrier(); // every warp is done with the other stage (block t - 1)
    g.ifThen(g.cmp(CmpIPredicate::slt, next, tHi), [&] {
      issueStream(blockStart(next),
                  g.mul(g.sub(c32(1), stage), c32(sm.stageBytes)));
    });
    g.commitGroup();
    g.waitGroup(1); // block t (and the resident tiles) landed
    if (wg)
      wgmma->fenceProxyAsync(); // cp.async's writes, read by wgmma
    g.barrier();
    SmallVector<Value> acc =
        step(out, SmallVector<Value>(loop.getRegionIterArgs()), blockStart(t),
             stageOff);
    scf::YieldOp::create(g.b, acc);
    tid = outerTid;
  }
  return SmallVector<Value>(loop.getResults());
}

/// acc (mt x cols/8 tiles) * factor -> out rows row0 + warpRow0 + ... (<
/// nRows), columns colStart + ... (< logicalCols).
void FlashBwdKernel::storeTile(ArrayRef<Value> acc, int64_t cols,
                               Value colStart, int64_t logicalCols, Value out,
                               Value rowBase, bwd::IndexArg strideN,
                               Value nRows, Value factor) {
  const int64_t ct = cols / 8;
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t half = 0; half < 2; ++half) {
      Value r =
          g.add(row0, g.add(warpRow0, g.add(c32(mi * 16 + 8 * half), grp)));
      Value rowOk = g.cmp(CmpIPredicate::slt, r, nRows);
      Value rowAt = g.add(rowBase, g.mul(g.ext64(r), idx(strideN)));
      for (int64_t di = 0; di < ct; ++di)
        for (int64_t e = 0; e < 2; ++e) {
          Value col =
              g.add(colStart, g.add(c32(di * 8 + e), g.mul(tig, c32(2))));
          Value ok =
              g.andI(rowOk, g.cmp(CmpIPredicate::slt, col, c32(logicalCols)));
          Value v = acc[(mi * ct + di) * 4 + 2 * half + e];
          if (factor)
            v = g.fmul(v, factor);
          g.ifThen(ok, [&] {
            Value ptr = g.elementPtr(out, g.add(rowAt, g.ext64(col)));
            LLVM::StoreOp::create(g.b, g.toElementBits(v), ptr);
          });
        }
    }
}

/// One program's work for the outputs \p out: accumulators at zero, the
/// streamed loop (per query head of the group in the dK/dV kernel), then the
/// stores.
void FlashBwdKernel::emitMainBody(const Outputs &out) {
  // The warp's columns (its half of them in the 2-D grid).
  const int64_t kCols = out.kCols / qs, vCols = out.vCols / qs;
  const int64_t kt = kCols / 8, vt = vCols / 8;
  SmallVector<Value> acc(mt * (kt + vt) * 4, g.cf(0.0));
  Value scale = f32Arg(bwd::Scale);
  if (!kvMajor) {
    streamQKBase = headBase(bwd::KStrideB, bI, hkI);
    streamVBase = headBase(bwd::VStrideB, bI, hkI);
    acc = streamHead(out, acc);
    storeTile(acc, out.kCols, out.kStart, k.spec.headDimQK, buf(bwd::DQ),
              headBase(bwd::DQStrideB, bI, hI), bwd::DQStrideN, nq, scale);
    return;
  }
  auto forHead = [&](Value h, ValueRange in) {
    hI = h;
    streamQKBase = headBase(bwd::QStrideB, bI, hI);
    streamVBase = headBase(bwd::DOStrideB, bI, hI);
    statBase = g.mul(g.add(g.mul(bI, idx(bwd::Heads)), hI), idx(bwd::SeqQ));
    return streamHead(out, in);
  };
  Value firstHead = g.mul(hkI, g.c64(k.spec.gqaGroup));
  if (k.spec.gqaGroup == 1) {
    acc = forHead(firstHead, acc);
  } else {
    auto loop = scf::ForOp::create(g.b, g.c64(0), g.c64(k.spec.gqaGroup),
                                   g.c64(1), acc);
    OpBuilder::InsertionGuard guard(g.b);
    g.b.setInsertionPointToStart(loop.getBody());
    SmallVector<Value> res = forHead(g.add(firstHead, loop.getInductionVar()),
                                     loop.getRegionIterArgs());
    scf::YieldOp::create(g.b, res);
    g.b.setInsertionPointAfter(loop);
    acc = SmallVector<Value>(loop.getResults());
  }
  ArrayRef<Value> accK(acc.data(), mt * kt * 4);
  ArrayRef<Value> accV(acc.data() + mt * kt * 4, mt * vt * 4);
  if (out.kCols)
    storeTile(accK, kCols, g.add(out.kStart, g.mul(qw, c32(kCols))),
              k.spec.headDimQK, buf(bwd::DK), headBase(bwd::DKStrideB, bI, hkI),
              bwd::DKStrideN, nkv, scale);
  if (out.vCols)
    storeTile(accV, vCols, g.add(out.vStart, g.mul(qw, c32(vCols))),
              k.spec.headDimV, buf(bwd::DV), headBase(bwd::DVStrideB, bI, hkI),
              bwd::DVStrideN, nkv, Value());
}

void FlashBwdKernel::emit() {
  if (k.role == Role::Preprocess || k.role == Role::DqConvert) {
    if (k.role == Role::Preprocess)
      emitPreprocess();
    else
      emitDqConvert();
    mlir::gpu::ReturnOp::create(g.b);
    return;
  }
  setUpMain();
  const GpuBackwardGeometry &geo = k.geo;
  const int64_t qkc = geo.qkRowChunks, vc = geo.vRowChunks;
  // The resident tiles: one commit group before the streamed ones.
  TileCopier who{smem, tid, geo.threads, k.copyBytes};
  Value resQKBase = kvMajor ? headBase(bwd::KStrideB, bI, hkI)
                            : headBase(bwd::QStrideB, bI, hI);
  Value resVBase = kvMajor ? headBase(bwd::VStrideB, bI, hkI)
                           : headBase(bwd::DOStrideB, bI, hI);
  copyTileAsync(g, who,
                TileSource{kvMajor ? buf(bwd::K) : buf(bwd::Q), resQKBase,
                           idx(kvMajor ? bwd::KStrideN : bwd::QStrideN), row0,
                           nResident, rr, k.spec.headDimQK, c32(0), geo.qkCols,
                           qkc, c32(sm.residentQK), blockBytes(rr)});
  copyTileAsync(g, who,
                TileSource{kvMajor ? buf(bwd::V) : buf(bwd::DO), resVBase,
                           idx(kvMajor ? bwd::VStrideN : bwd::DOStrideN), row0,
                           nResident, rr, k.spec.headDimV, c32(0), geo.vCols,
                           vc, c32(sm.residentV), blockBytes(rr)});
  g.commitGroup();

  if (!kvMajor) {
    // The resident rows' statistics, and the band they see fully.
    Value totalRows =
        g.mul(g.mul(idx(bwd::Batch), idx(bwd::Heads)), idx(bwd::SeqQ));
    Value stat0 = g.mul(g.add(g.mul(bI, idx(bwd::Heads)), hI), idx(bwd::SeqQ));
    for (int64_t mi = 0; mi < mt; ++mi)
      for (int64_t half = 0; half < 2; ++half) {
        Value r =
            g.add(row0, g.add(warpRow0, g.add(c32(mi * 16 + 8 * half), grp)));
        Value rc = g.minS(r, g.sub(nq, c32(1)));
        Value at = g.add(stat0, g.ext64(rc));
        rowDelta.push_back(loadF32(buf(bwd::Delta), at));
        rowNegLse.push_back(loadF32(buf(bwd::Delta), g.add(at, totalRows)));
      }
    if (k.hasBand) {
      Value m064 = g.ext64(row0);
      Value rowsValid = g.minS(g.c64(rr), g.sub(idx(bwd::SeqQ), m064));
      Value lastRow = g.add(m064, g.sub(rowsValid, g.c64(1)));
      fullLo = g.clampTo32(g.sub(g.add(lastRow, off64), winL));
      fullHi = g.clampTo32(g.add(g.add(m064, off64), winR));
    }
    Value z = g.blockId(mlir::gpu::Dimension::z);
    Outputs out;
    out.kCols = geo.dqChunk;
    out.kStart = g.mul(z, c32(geo.dqChunk));
    emitMainBody(out);
  } else if (geo.kvCombined) {
    Outputs out;
    out.kCols = geo.dqkPad;
    out.kStart = c32(0);
    out.vCols = geo.dvPad;
    out.vStart = c32(0);
    emitMainBody(out);
  } else {
    // grid.z: dK chunks, then dV chunks; one chunk of one per program.
    Value z = g.blockId(mlir::gpu::Dimension::z);
    Value isK = g.cmp(CmpIPredicate::ult, z, c32(geo.dkChunks));
    auto ifOp = scf::IfOp::create(g.b, isK, /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(g.b);
      g.b.setInsertionPointToStart(ifOp.thenBlock());
      Outputs out;
      out.kCols = geo.dkChunk;
      out.kStart = g.mul(z, c32(geo.dkChunk));
      emitMainBody(out);
      g.b.setInsertionPointToStart(ifOp.elseBlock());
      Outputs outV;
      outV.vCols = geo.dvChunk;
      outV.vStart = g.mul(g.sub(z, c32(geo.dkChunks)), c32(geo.dvChunk));
      emitMainBody(outV);
    }
  }
  mlir::gpu::ReturnOp::create(g.b);
}

/// Reads the description, tiling and role the tiling pass recorded.
FailureOr<BwdShape> readShape(func::FuncOp fn, int64_t warps, int64_t copyBytes,
                              bool vectorAtomics, bool wgmma) {
  // The attribute's verifier has checked every field and the role's mode.
  auto attrs = fn->getAttrOfType<attn::KernelAttr>("attn.kernel");
  BwdShape k;
  k.spec = specFromAttr(attrs);
  k.hasBand = k.spec.mask != MaskKind::None;
  k.config.blockM = attrs.getBlockM();
  k.config.blockN = attrs.getBlockN();
  k.config.warps = warps;
  k.copyBytes = copyBytes;
  k.vectorAtomics = vectorAtomics;
  StringRef name = attrs.getRole();
  k.role = name == "preprocess" ? Role::Preprocess
           : name == "main"     ? Role::Main
           : name == "dq"       ? Role::Dq
                                : Role::DqConvert;
  // copy-bytes and warps were checked by checkGpuOptions.
  std::string problem = gpuBackwardConfigProblem(k.spec, k.config, INT64_MAX);
  if (!problem.empty())
    return fn.emitError() << problem;
  k.geo = gpuBackwardGeometry(k.spec, k.config);
  k.wgmma = wgmma && k.geo.wgmmaShape && k.role == Role::Main;
  return k;
}

} // namespace

LogicalResult flashjit::conversion::lowerBackwardKernel(
    func::FuncOp fn, mlir::gpu::GPUModuleOp gpuModule, int64_t warps,
    int64_t copyBytes, bool vectorAtomics, bool wgmma) {
  FailureOr<BwdShape> shape =
      readShape(fn, warps, copyBytes, vectorAtomics, wgmma);
  if (failed(shape))
    return failure();
  ImplicitLocOpBuilder b(fn.getLoc(), fn.getContext());
  GpuBuilder g(b, shape->spec.dtype == DType::BF16 ? Elem::BF16 : Elem::F16);
  SmallVector<Type> argTys(bwd::NumBuffers, g.ptrGen);
  argTys.append(bwd::NumIndexArgs, g.i64);
  argTys.append(bwd::NumF32Args, g.f32);
  const GpuBackwardGeometry &geo = shape->geo;
  int64_t threads = geo.threads, shared = 0;
  switch (shape->role) {
  case Role::Preprocess:
  case Role::DqConvert:
    threads = GpuBackwardGeometry::kPreprocessThreads;
    break;
  case Role::Main:
    shared = geo.kvSmem.total;
    break;
  case Role::Dq:
    shared = geo.dqSmem.total;
    break;
  }
  auto kernel = createKernelFunc(b, gpuModule, fn, argTys, threads, shared);
  b.setInsertionPointToStart(&kernel.getBody().front());
  Value smem = sharedMemoryBase(b, g);
  FlashBwdKernel(g, *shape, kernel, smem).emit();
  return success();
}
