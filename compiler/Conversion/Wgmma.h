//===- Wgmma.h - Hopper warpgroup MMAs (wgmma.mma_async) --------*- C++ -*-===//
//
/// \file
/// The sm_90a tensor-core path: one warpgroup (4 warps, 128 threads)
/// multiplies a 64-row A by an N-column B, m64nNk16 per instruction, with
/// B (and optionally A) read straight from shared memory through a 64-bit
/// matrix descriptor, asynchronously. Internal to compiler/Conversion.
///
/// Shared-memory tiles read by wgmma use the "blocked" 128-byte-swizzle
/// layout (TileSource::blockBytes, GpuBuilder::swizzledBlocked): 64-column
/// blocks, each `rows` rows of 128 bytes, chunk c of row r at ((c ^ r) & 7) *
/// 16 within its row. Tiles start on 1024-byte boundaries, so that this XOR is
/// the hardware's 128B swizzle of the address bits. A descriptor names a start
/// address, the stride between 8-row groups (SBO, 1024 here) and, for an
/// MN-major operand (the M or N dimension contiguous: read transposed), the
/// stride between 64-column blocks along M or N (LBO).
///
/// The accumulator of a warpgroup MMA has the m16n8 layout of mma.sync per
/// warp (warp w of the group holds rows 16w..16w+15; value 4j + e of a
/// thread is n-tile j's element e), and an A operand from registers has the
/// m16n8k16 A layout per warp: the backward's register tiles feed it as they
/// feed mma.sync.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_WGMMA_H
#define FLASHJIT_COMPILER_CONVERSION_WGMMA_H

#include "compiler/Conversion/GpuBuilder.h"

#include "llvm/ADT/SmallVector.h"

namespace flashjit::gpu {

/// How an operand's rows run in a blocked tile.
enum class Major {
  K, ///< rows are M or N, the K dimension contiguous (plain)
  MN ///< rows are K, the M or N dimension contiguous (read transposed)
};

/// Builds wgmma descriptors and instructions for one kernel.
class Wgmma {
public:
  /// \p smem: the dynamic shared memory base (ptr addrspace 3, 1024-byte
  /// aligned).
  Wgmma(GpuBuilder &g, Value smem);

  /// The descriptor of an operand at byte \p offset (i32) of the dynamic
  /// shared memory; \p blockBytes: bytes between the tile's 64-column
  /// blocks (the LBO of an MN-major operand). Its arithmetic is 32-bit, on
  /// the low word (start address and LBO) only: the high word (SBO and the
  /// swizzle) is a constant, and a start address below 2^18 bytes never
  /// carries into the LBO. A constant part of \p offset (an arith.addi of a
  /// constant, a multiple of 16) is added after the shift, so that the
  /// k-steps of one operand share one shift and differ by an immediate.
  Value descriptor(Value offset, Major major, int64_t blockBytes);

  /// d (n / 2 f32 per thread) += A B, m64nNk16. A from shared memory
  /// (\p aDesc) or, when \p aDesc is null, from registers (\p aRegs, the
  /// m16n8k16 A fragment of each warp's 16 rows). \p transA / \p transB: the
  /// operand is MN-major. Without \p accumulate, d = A B (the instruction's
  /// scale-d is 0: \p d's values are not read, undefined ones will do).
  llvm::SmallVector<Value> mma(int64_t n, llvm::ArrayRef<Value> d, Value aDesc,
                               llvm::ArrayRef<Value> aRegs, Value bDesc,
                               bool transA, bool transB,
                               bool accumulate = true);

  /// \p values (f32 or i32) through an empty side-effecting asm that reads
  /// and writes each: register writes before it stay before it, and uses
  /// of its results stay after it (the accumulators around a batch).
  llvm::SmallVector<Value> pin(llvm::ArrayRef<Value> values);

  /// wgmma.fence.sync.aligned, before a batch of MMAs; the batch's
  /// descriptors then build on an opaque copy of the base, so that none is
  /// hoisted out of a loop to hold a register across it.
  void fence();
  void commit();              ///< wgmma.commit_group.sync.aligned
  void wait(int64_t pending); ///< wgmma.wait_group.sync.aligned
  void fenceProxyAsync();     ///< generic-proxy smem writes -> wgmma

private:
  GpuBuilder &g;
  Value descBase;  ///< i32: the start address field of `smem`
  Value batchBase; ///< descBase through an opaque mov (see fence())
};

} // namespace flashjit::gpu

#endif // FLASHJIT_COMPILER_CONVERSION_WGMMA_H
