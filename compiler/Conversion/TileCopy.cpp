//===- TileCopy.cpp - Shared-memory tiles of the GPU kernels --------------===//

#include "compiler/Conversion/TileCopy.h"

using namespace mlir;
using arith::CmpIPredicate;

namespace flashjit::gpu {

FragmentAddresses::FragmentAddresses(GpuBuilder &g, Value tileOffset,
                                     Value laneRow, Value laneChunk,
                                     int64_t rowChunks)
    : rowChunks(rowChunks) {
  base = g.add(tileOffset, g.mul(laneRow, g.c32(rowChunks * 16)));
  Value r7 = g.andI(laneRow, g.c32(7));
  for (int64_t j = 0; j < 4; ++j)
    xors[j] = g.mul(g.xorI(g.add(laneChunk, g.c32(2 * j)), r7), g.c32(16));
}

FragmentAddresses FragmentAddresses::inLoop(GpuBuilder &g) const {
  FragmentAddresses copy = *this;
  copy.base = g.opaque(base);
  return copy;
}

FragmentAddresses FragmentAddresses::shifted(GpuBuilder &g, Value bytes) const {
  FragmentAddresses copy = *this;
  copy.base = g.add(base, bytes);
  return copy;
}

Value FragmentAddresses::at(GpuBuilder &g, Value smem, int64_t rowConst,
                            int64_t chunkConst) const {
  int64_t imm = (rowConst * rowChunks + (chunkConst & ~int64_t(7))) * 16;
  Value off = g.add(g.add(base, xors[(chunkConst & 7) / 2]), g.c32(imm));
  return g.sharedBytePtr(smem, off);
}

FragmentAddresses fragmentAddresses(GpuBuilder &g, FragmentPattern pattern,
                                    Value lane, Value rowBase, Value tileOffset,
                                    int64_t rowChunks, Value chunkOffset) {
  Value l16 = g.divU(lane, g.c32(16)), l8 = g.remU(lane, g.c32(8));
  Value l8h = g.remU(g.divU(lane, g.c32(8)), g.c32(2));
  Value row, chunk;
  switch (pattern) {
  case FragmentPattern::A:
    row = g.remU(lane, g.c32(16));
    chunk = l16;
    break;
  case FragmentPattern::B:
    row = g.add(g.mul(l16, g.c32(8)), l8);
    chunk = l8h;
    break;
  case FragmentPattern::BTrans:
    row = g.add(g.mul(l8h, g.c32(8)), l8);
    chunk = l16;
    break;
  }
  if (chunkOffset)
    chunk = g.add(chunk, chunkOffset);
  return FragmentAddresses(g, tileOffset, g.add(rowBase, row), chunk,
                           rowChunks);
}

/// The loop the products share: per k-step, the mt A fragments
/// loadA(ks, mi), then per pair of n-tiles loadB(ks, np) and its MMAs,
/// accumulating into \p s (mt x nt tiles).
template <typename LoadA, typename LoadB>
static std::vector<Acc> productLoop(GpuBuilder &g, std::vector<Acc> s,
                                    int64_t mt, int64_t nt, int64_t kSteps,
                                    LoadA &&loadA, LoadB &&loadB) {
  for (int64_t ks = 0; ks < kSteps; ++ks) {
    std::vector<Frag4> af(mt);
    for (int64_t mi = 0; mi < mt; ++mi)
      af[mi] = loadA(ks, mi);
    for (int64_t np = 0; np < nt / 2; ++np) {
      Frag4 bf = loadB(ks, np);
      for (int64_t mi = 0; mi < mt; ++mi) {
        Acc &s0 = s[mi * nt + 2 * np], &s1 = s[mi * nt + 2 * np + 1];
        s0 = g.mma(af[mi], bf[0], bf[1], s0);
        s1 = g.mma(af[mi], bf[2], bf[3], s1);
      }
    }
  }
  return s;
}

static std::vector<Acc> zeroTiles(GpuBuilder &g, int64_t tiles) {
  Value zero = g.cf(0.0);
  return std::vector<Acc>(tiles, Acc{zero, zero, zero, zero});
}

std::vector<Acc> mmaProduct(GpuBuilder &g, Value smem,
                            const FragmentAddresses &a,
                            const FragmentAddresses &b, int64_t mt, int64_t nt,
                            int64_t kSteps, std::vector<Acc> init) {
  return productLoop(
      g, init.empty() ? zeroTiles(g, mt * nt) : std::move(init), mt, nt, kSteps,
      [&](int64_t ks, int64_t mi) {
        return g.ldmatrix4(a.at(g, smem, mi * 16, ks * 2), false);
      },
      [&](int64_t ks, int64_t np) {
        return g.ldmatrix4(b.at(g, smem, np * 16, ks * 2), false);
      });
}

std::vector<Acc> mmaProductTransposed(GpuBuilder &g, Value smem,
                                      const FragmentAddresses &aTrans,
                                      const FragmentAddresses &bTrans,
                                      int64_t mt, ArrayRef<int64_t> bChunks,
                                      int64_t kSteps) {
  const int64_t nt = 2 * int64_t(bChunks.size());
  return productLoop(
      g, zeroTiles(g, mt * nt), mt, nt, kSteps,
      [&](int64_t ks, int64_t mi) {
        return g.ldmatrix4(aTrans.at(g, smem, ks * 16, mi * 2), true);
      },
      [&](int64_t ks, int64_t np) {
        return g.ldmatrix4(bTrans.at(g, smem, ks * 16, bChunks[np]), true);
      });
}

void mmaAccumulateShared(GpuBuilder &g, Value smem, MutableArrayRef<Value> acc,
                         const FragmentAddresses &a,
                         const FragmentAddresses &bTrans, int64_t mt,
                         int64_t kSteps, int64_t cols) {
  const int64_t ct = cols / 8;
  std::vector<Acc> s(mt * ct);
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = {acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]};
  s = productLoop(
      g, std::move(s), mt, ct, kSteps,
      [&](int64_t ks, int64_t mi) {
        return g.ldmatrix4(a.at(g, smem, mi * 16, ks * 2), false);
      },
      [&](int64_t ks, int64_t np) {
        return g.ldmatrix4(bTrans.at(g, smem, ks * 16, np * 2), true);
      });
  for (size_t i = 0; i < s.size(); ++i)
    for (int64_t e = 0; e < 4; ++e)
      acc[4 * i + e] = s[i][e];
}

void mmaAccumulate(GpuBuilder &g, Value smem, MutableArrayRef<Value> acc,
                   const std::vector<Acc> &lhs, const FragmentAddresses &bTrans,
                   int64_t mt, int64_t nt, int64_t cols) {
  const int64_t ct = cols / 8;
  for (int64_t kk = 0; kk < nt / 2; ++kk) {
    std::vector<Frag4> p(mt);
    for (int64_t mi = 0; mi < mt; ++mi) {
      const Acc &lo = lhs[mi * nt + 2 * kk], &hi = lhs[mi * nt + 2 * kk + 1];
      p[mi] = {g.pack2(lo[0], lo[1]), g.pack2(lo[2], lo[3]),
               g.pack2(hi[0], hi[1]), g.pack2(hi[2], hi[3])};
    }
    for (int64_t np = 0; np < ct / 2; ++np) {
      Frag4 bf = g.ldmatrix4(bTrans.at(g, smem, kk * 16, np * 2), true);
      for (int64_t mi = 0; mi < mt; ++mi)
        for (int64_t j = 0; j < 2; ++j) {
          int64_t base = (mi * ct + 2 * np + j) * 4;
          Acc o{acc[base], acc[base + 1], acc[base + 2], acc[base + 3]};
          o = g.mma(p[mi], bf[2 * j], bf[2 * j + 1], o);
          for (int64_t e = 0; e < 4; ++e)
            acc[base + e] = o[e];
        }
    }
  }
}

void copyTileAsync(GpuBuilder &g, const TileCopier &who,
                   const TileSource &src) {
  const int64_t bytes = who.copyBytes, perCopy = bytes / 2;
  const int64_t perRow = src.padCols / perCopy, total = src.rows * perRow;
  const int64_t threads = who.threads;
  const int64_t rowChunks = src.rowChunks;
  Value tid = who.tid, smem = who.smem;
  Value lastRow = g.sub(src.nRows, g.c32(1));
  // Issues copy number (thread, pass): row r = laneRow + pass * rowsPerPass
  // when every pass covers whole rows, so that a thread's column, its
  // zero-fill size and its swizzled offset are fixed across passes (few live
  // registers: the rest are immediates).
  // (Grouped rows are not evenly spaced: each copy finds its own row.)
  const bool regular =
      threads % perRow == 0 && (threads / perRow) % 8 == 0 && !src.groupSize;
  const int64_t rowsPerPass = regular ? threads / perRow : 0;
  auto columnTerms = [&](Value col, Value &srcBytes, Value &useCol) {
    Value gCol = g.add(src.colBase, col);
    Value left = g.mul(g.sub(g.c32(src.logicalCols), gCol), g.c32(2));
    srcBytes = g.minS(g.maxS(left, g.c32(0)), g.c32(bytes));
    useCol = g.ext64(g.select(g.cmp(CmpIPredicate::sgt, srcBytes, g.c32(0)),
                              gCol, g.c32(0)));
  };
  // Byte offset of (row, col) (col a multiple of the copy width) and the
  // bytes between rows, in either layout.
  const int64_t rowBytes = src.blockBytes ? 128 : rowChunks * 16;
  auto tileOffset = [&](Value row, Value col) {
    Value inChunk = g.mul(g.remU(col, g.c32(8)), g.c32(2));
    return g.add(src.blockBytes ? g.swizzledBlocked(row, col, src.blockBytes)
                                : g.swizzled(row, col, rowChunks),
                 inChunk);
  };
  auto rowElem = [&](Value row) {
    return g.add(src.rowBase, g.rowOffset(row, src.rowStride, src.groupSize,
                                          src.groupStride));
  };
  // Regular case: one global pointer per thread and tile, advanced by
  // rowsPerPass rows per pass (a 64-bit add); rows past nRows copy zero
  // bytes from the head's first row (always a valid address).
  Value laneBytes, laneDst, lanePtr, passStride, rowsLeft, safePtr;
  if (regular) {
    Value laneRow = g.divU(tid, g.c32(perRow));
    Value laneCol = g.mul(g.remU(tid, g.c32(perRow)), g.c32(perCopy));
    Value laneUseCol;
    columnTerms(laneCol, laneBytes, laneUseCol);
    laneDst = g.sharedBytePtr(
        smem, g.add(src.smemOffset, tileOffset(laneRow, laneCol)));
    Value firstRow = g.minS(g.add(src.row0, laneRow), lastRow);
    lanePtr = g.toGlobal(
        g.elementPtr(src.base, g.add(rowElem(firstRow), laneUseCol)));
    safePtr =
        g.toGlobal(g.elementPtr(src.base, g.add(src.rowBase, laneUseCol)));
    passStride = g.mul(src.rowStride, g.c64(rowsPerPass));
    rowsLeft = g.sub(g.sub(src.nRows, src.row0), laneRow);
  }
  for (int64_t first = 0; first < total; first += threads) {
    auto body = [&] {
      if (regular) {
        int64_t pass = first / threads;
        Value dst =
            g.sharedBytePtr(laneDst, g.c32(pass * rowsPerPass * rowBytes));
        Value ptr =
            pass == 0
                ? lanePtr
                : LLVM::GEPOp::create(
                      g.b, g.ptrGlobal, g.i16, lanePtr,
                      ArrayRef<LLVM::GEPArg>{g.mul(passStride, g.c64(pass))});
        Value rowOk =
            g.cmp(CmpIPredicate::sgt, rowsLeft, g.c32(pass * rowsPerPass));
        g.copyAsync(dst, g.select(rowOk, ptr, safePtr),
                    g.select(rowOk, laneBytes, g.c32(0)), bytes);
        return;
      }
      Value i = g.add(tid, g.c32(first));
      Value r = g.divU(i, g.c32(perRow));
      Value col = g.mul(g.remU(i, g.c32(perRow)), g.c32(perCopy));
      Value srcBytes, useCol;
      columnTerms(col, srcBytes, useCol);
      Value dstOff = g.add(src.smemOffset, tileOffset(r, col));
      Value row = g.add(src.row0, r);
      Value rowOk = g.cmp(CmpIPredicate::slt, row, src.nRows);
      Value elem = g.add(rowElem(g.minS(row, lastRow)), useCol);
      g.copyAsync(g.sharedBytePtr(smem, dstOff),
                  g.toGlobal(g.elementPtr(src.base, elem)),
                  g.select(rowOk, srcBytes, g.c32(0)), bytes);
    };
    if (first + threads <= total)
      body();
    else
      g.ifThen(g.cmp(CmpIPredicate::ult, tid, g.c32(total - first)), body);
  }
}

} // namespace flashjit::gpu
