//===- TileCopy.h - Shared-memory tiles of the GPU kernels ------*- C++ -*-===//
//
/// \file
/// The two shared-memory pieces every flashjit GPU kernel is built from:
/// copyTileAsync() stages a (rows x head-dim) tile of a strided tensor into
/// XOR-swizzled shared memory with cp.async, and FragmentAddresses gives one
/// thread's ldmatrix addresses into such a tile. The forward and the
/// backward kernels share them. Internal to compiler/Conversion.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_TILECOPY_H
#define FLASHJIT_COMPILER_CONVERSION_TILECOPY_H

#include "compiler/Conversion/GpuBuilder.h"

#include <vector>

namespace flashjit::gpu {

/// Shared-memory addresses of one thread's ldmatrix rows in a swizzled tile,
/// split so that loop-invariant registers stay few: row r = laneRow + R
/// (R a multiple of 8) and chunk c = laneChunk + C (C even, laneChunk 0 or
/// 1) give byte ((r * rowChunks + (c & ~7) + ((c & 7) ^ (r & 7))) * 16:
/// one lane base, four lane XOR terms for C % 8, and an immediate.
///
/// The lane patterns of an m16n8k16 step (tile rows x 16-byte chunks):
///   A operand (rows of the MMA's M):   row lane % 16, chunk lane / 16
///   B operand stored [n][k]:           row (lane / 16) * 8 + lane % 8,
///                                      chunk (lane / 8) % 2
///   B operand stored [k][n] (.trans):  row ((lane / 8) % 2) * 8 + lane % 8,
///                                      chunk lane / 16
struct FragmentAddresses {
  Value base;                ///< tile offset + laneRow * rowChunks * 16
  std::array<Value, 4> xors; ///< ((laneChunk + 2j) ^ (laneRow & 7)) * 16
  int64_t rowChunks = 0;

  FragmentAddresses() = default;
  FragmentAddresses(GpuBuilder &g, Value tileOffset, Value laneRow,
                    Value laneChunk, int64_t rowChunks);
  /// The same addresses from an opaque copy of the lane base (see
  /// GpuBuilder::opaque): used inside loops.
  FragmentAddresses inLoop(GpuBuilder &g) const;
  /// The same pattern \p bytes (i32) further on: another stage of a
  /// double-buffered tile, or a column offset that is a multiple of 8
  /// chunks.
  FragmentAddresses shifted(GpuBuilder &g, Value bytes) const;
  /// Address of row laneRow + rowConst, column (laneChunk + chunkConst) * 8.
  Value at(GpuBuilder &g, Value smem, int64_t rowConst,
           int64_t chunkConst) const;
};

/// The lane's (row, chunk) of the three ldmatrix patterns above.
enum class FragmentPattern { A, B, BTrans };
/// \p chunkOffset (optional, i32): an even number of chunks added to the
/// lane's chunk (any even number: the swizzle only XORs the low 3 bits of
/// the chunk index, which whole groups of 8 leave alone).
FragmentAddresses fragmentAddresses(GpuBuilder &g, FragmentPattern pattern,
                                    Value lane, Value rowBase, Value tileOffset,
                                    int64_t rowChunks,
                                    Value chunkOffset = Value());

/// One m16n8 fp32 accumulator tile (4 values per thread).
using Acc = std::array<Value, 4>;

/// The mt x nt accumulator tiles of A B^T (+ \p init, if given) for one
/// warp: A's 16-row tiles at \p a (A pattern, rows mi * 16), B's rows at
/// \p b (B pattern, nt / 2 ldmatrix of 16 rows), \p kSteps k-steps of 16.
/// Tile (mi, ni) is at mi * nt + ni; \p init, if not empty, is the MMAs'
/// first accumulator in the same order (else zeros).
std::vector<Acc> mmaProduct(GpuBuilder &g, Value smem,
                            const FragmentAddresses &a,
                            const FragmentAddresses &b, int64_t mt, int64_t nt,
                            int64_t kSteps, std::vector<Acc> init = {});

/// The mt x nt accumulator tiles of A B for one warp, both operands stored
/// [k][m] and [k][n] (read with ldmatrix.trans): A at \p aTrans (B pattern:
/// k rows ks * 16, m chunks mi * 2), B at \p bTrans (BTrans pattern: k rows
/// ks * 16; n-tiles 2j, 2j + 1 at chunk \p bChunks[j], nt / 2 entries).
std::vector<Acc>
mmaProductTransposed(GpuBuilder &g, Value smem, const FragmentAddresses &aTrans,
                     const FragmentAddresses &bTrans, int64_t mt,
                     llvm::ArrayRef<int64_t> bChunks, int64_t kSteps);

/// acc (mt x cols / 8 tiles, 4 values each) += lhs B: lhs (mt x nt tiles in
/// accumulator layout) is packed to the element type as the A operand, two
/// n-tiles per 16-wide k-step (the accumulator layout is the A layout of
/// the next MMA); B (nt * 8 rows x cols) is read transposed at \p bTrans.
void mmaAccumulate(GpuBuilder &g, Value smem, llvm::MutableArrayRef<Value> acc,
                   const std::vector<Acc> &lhs, const FragmentAddresses &bTrans,
                   int64_t mt, int64_t nt, int64_t cols);

/// acc (mt x cols / 8 tiles, 4 values each) += A B with A in shared memory
/// stored [m][k] at \p a (A pattern: rows mi * 16, k chunks ks * 2) and B
/// stored [k][n] at \p bTrans (BTrans pattern: k rows ks * 16, n chunks
/// from 0), \p kSteps k-steps of 16.
void mmaAccumulateShared(GpuBuilder &g, Value smem,
                         llvm::MutableArrayRef<Value> acc,
                         const FragmentAddresses &a,
                         const FragmentAddresses &bTrans, int64_t mt,
                         int64_t kSteps, int64_t cols);

/// Who copies: the block's threads and the copy width.
struct TileCopier {
  Value smem;        ///< the dynamic shared memory (ptr addrspace 3)
  Value tid;         ///< thread index (i32)
  int64_t threads;   ///< threads in the block
  int64_t copyBytes; ///< 16, 8, 4 or 2
};

/// One tile: rows [row0, row0 + rows) x padded columns [0, padCols) of a
/// strided tensor, whose column colBase + c holds logical column c.
struct TileSource {
  Value base;      ///< the tensor (generic pointer, 16-bit elements)
  Value rowBase;   ///< element offset of the (batch, head) (i64)
  Value rowStride; ///< elements between rows (i64)
  Value row0;      ///< first row (i32)
  Value nRows;     ///< rows that exist (i32); later ones are zero-filled
  int64_t rows;
  int64_t logicalCols; ///< columns that exist; later ones are zero-filled
  Value colBase;       ///< first column (i32)
  int64_t padCols;     ///< columns copied (a multiple of 8)
  int64_t rowChunks;   ///< 16-byte chunks per row in shared memory
  Value smemOffset;    ///< byte offset of the tile (i32)
  /// 0: rows of rowChunks chunks, chunk c of row r at (c & ~7) | ((c ^ r) &
  /// 7). Else the blocked layout of wgmma (Wgmma.h): 64-column blocks
  /// blockBytes apart, rows of 128 bytes within a block.
  int64_t blockBytes = 0;
  /// A row group (tile.load's `group %G stride %gs`; null: none): row p is
  /// row p / G of head p % G, heads groupStride elements apart (i32, i64).
  Value groupSize = {}, groupStride = {};
};

/// Issues the cp.async copies of \p src into swizzled shared memory. Rows at
/// or past nRows and columns past the logical width are zero-filled
/// (cp.async's src-size), so padding never injects NaN into the MMAs.
void copyTileAsync(GpuBuilder &g, const TileCopier &who, const TileSource &src);

} // namespace flashjit::gpu

#endif // FLASHJIT_COMPILER_CONVERSION_TILECOPY_H
