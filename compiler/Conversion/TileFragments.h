//===- TileFragments.h - Fragments and per-element lowering ---*- C++ -*-===//
//
/// \file
/// What the op families of the tile lowering (TileToGPU.h) share below the
/// kernel: where a tile value lives (registers in the accumulator layout,
/// a shared slot), a register tile's per-thread fragment, the target of a
/// transposed product's reduction, and the lowering of one element (scalar
/// math, an elementwise op, a scalar buffer load). Internal to
/// compiler/Conversion.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_TILEFRAGMENTS_H
#define FLASHJIT_COMPILER_CONVERSION_TILEFRAGMENTS_H

#include "compiler/Conversion/GpuBuilder.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace flashjit::conversion {

using mlir::LogicalResult;
using mlir::Operation;
using mlir::Value;

/// Where a tile value lives on the GPU.
enum class TileHome {
  Shared,    ///< a shared-memory slot (a tile.load that only feeds dots)
  Registers, ///< the accumulator layout (2-D) or per-row values (rank 1)
  /// A rank-1 f32 slot (a tile.load that only feeds per-column
  /// broadcasts): each thread reads the values of its columns.
  SharedVector,
};

/// One shared-memory slot: a tile copied by cp.async, read by ldmatrix.
struct SharedSlot {
  int64_t offset = 0;     ///< byte offset in the dynamic shared memory
  int64_t rowChunks = 0;  ///< 16-byte chunks per row (a multiple of 8)
  int64_t padCols = 0;    ///< columns copied (zero-filled past the tile's)
  bool splitCols = false; ///< the columns of this program's grid.z chunk
};

/// The per-thread registers of a register tile, in the accumulator order:
/// 2-D element (mi, ni, e) at (mi * nt + ni) * 4 + e, holding row
/// warpRow0 + mi * 16 + grp + 8 * (e / 2) and column ni * 8 + 2 * tig +
/// e % 2; rank-1 element (mi, half) at 2 * mi + half, row warpRow0 + mi * 16
/// + 8 * half + grp.
struct Fragment {
  llvm::SmallVector<Value> regs;
  /// The tile's element type is bf16/f16 but the registers still hold the
  /// f32 values: the rounding happens where they are consumed (packed for
  /// an MMA, converted for a store), so it happens exactly once.
  bool pendingRound = false;
  /// A rounded tile's element pairs (b32, A-operand order) as the warpgroup
  /// MMAs that read it pinned them: what arith.extf widens afterwards.
  llvm::SmallVector<Value> packed;
  /// Every register holds one value, the same in every thread (a splat of
  /// a scalar of the program): a scatter at it reduces over the warp.
  bool uniform = false;
};

/// Where a transposed product's registers are reduced (tile.atomic_add's
/// f32 buffer): element (q, c) at offset + (row0 + q) * stride + c.
struct ReductionTarget {
  Value base, offset, stride; ///< offset, stride: i64
  Value row0, bound;          ///< i32: the first row, rows that exist
  int64_t cols = 0;
  bool pairs = false;     ///< red.global.add.v2 (8-byte aligned pairs)
  bool checkCols = false; ///< columns past the tile exist
  /// The rows' columns in quad order (tile.atomic_add's `quad_order`):
  /// column c at tile::quadColumn(c).
  bool quads = false;
  /// In quad order, with vector atomics and offset and stride multiples of
  /// 4: a thread's quad of a row is one red.global.add.v4.f32 where the
  /// base is 16-byte aligned.
  bool quadVectors = false;
  /// Whether row \p q (i32) exists: row0 + q < bound.
  Value rowExists(gpu::GpuBuilder &g, Value q) const;
  /// Row \p q's first element (i64): offset + (row0 + q) * stride.
  Value rowOffset(gpu::GpuBuilder &g, Value q) const;
  /// Whether base is 16-byte aligned (i1): where 16-byte reductions may
  /// add into it.
  Value baseAligned(gpu::GpuBuilder &g) const;
};

/// dst[(row0 + q), col + colConst + e] += v_e (e = 0, 1) of \p r where row
/// q exists (\p rowChecked: the caller tested it) and (checkCols) its column;
/// with quads at buildQuadColumn(col + colConst) + e (col + colConst even).
void reducePair(gpu::GpuBuilder &g, const ReductionTarget &r, Value q,
                Value col, int64_t colConst, Value v0, Value v1,
                bool rowChecked = false);

/// A one-operand f32 PTX instruction \p asmText ("sin.approx.f32 $0, $1;",
/// "abs.f32 $0, $1;") on \p x, as inline assembly.
Value ptxUnaryF32(mlir::ImplicitLocOpBuilder &b, mlir::Type f32, mlir::Value x,
                  llvm::StringRef asmText);

/// The scalar math flashjit lowers itself, without libdevice: NVVM's
/// approximations for the transcendental functions (ex2, lg2, tanh: as
/// every FlashAttention kernel uses them) and LLVM's intrinsics for the
/// exact ones. Null for any other op (\p x: its scalar operands).
Value lowerScalarMath(mlir::ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                      Operation *op, mlir::ValueRange x);

/// One element of elementwise \p op on scalar \p operands: lowerScalarMath's
/// math, else the op cloned on scalars of \p types; failure (a named error
/// on \p op) for other math.
mlir::FailureOr<llvm::SmallVector<Value>>
lowerScalarElement(mlir::ImplicitLocOpBuilder &b, gpu::GpuBuilder &g,
                   Operation *op, mlir::ValueRange operands,
                   mlir::TypeRange types);

/// `memref.load %buf[%i]` of a 1-D buffer (a layout's count, a varlen
/// offset) as one global load by every thread, its buffer and index
/// through \p map (TileToGPUMemory.cpp shows the IR).
LogicalResult lowerScalarBufferLoad(mlir::ImplicitLocOpBuilder &b,
                                    gpu::GpuBuilder &g, Operation *op,
                                    mlir::IRMapping &map);

} // namespace flashjit::conversion

#endif // FLASHJIT_COMPILER_CONVERSION_TILEFRAGMENTS_H
