//===- GpuBuilder.h - Warp-level building blocks for GPU kernels -*- C++
//-*-===//
//
/// \file
/// A thin layer over ImplicitLocOpBuilder that emits the NVVM-level pieces
/// the GPU lowering assembles kernels from: integer and float arithmetic,
/// pointers in the global and shared address spaces, cp.async tile copies
/// into swizzled shared memory, ldmatrix fragment loads, m16n8k16 tensor-core
/// MMAs, warp shuffles and fast exp2/log2. NVVM intrinsics are emitted as
/// `llvm.call_intrinsic`, so each reads in the IR exactly as its PTX name.
/// Internal to compiler/Conversion.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_GPUBUILDER_H
#define FLASHJIT_COMPILER_CONVERSION_GPUBUILDER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

#include <array>

namespace flashjit::gpu {

using mlir::Type;
using mlir::Value;

/// The element type of Q, K, V and O on the GPU.
enum class Elem { BF16, F16 };

/// The ldmatrix / mma register fragments of one m16n8k16 step.
using Frag4 = std::array<Value, 4>;

class GpuBuilder {
public:
  GpuBuilder(mlir::ImplicitLocOpBuilder &b, Elem elem);

  mlir::ImplicitLocOpBuilder &b;
  const Elem elem;
  Type i1, i16, i32, i64, f32, halfTy, ptrGen, ptrGlobal, ptrShared;

  // Constants and integer arithmetic (any integer type).
  Value c32(int64_t v);
  Value c64(int64_t v);
  Value cf(double v);
  Value cBool(bool v);
  Value add(Value x, Value y) { return mlir::arith::AddIOp::create(b, x, y); }
  Value sub(Value x, Value y) { return mlir::arith::SubIOp::create(b, x, y); }
  Value mul(Value x, Value y) { return mlir::arith::MulIOp::create(b, x, y); }
  Value divU(Value x, Value y) { return mlir::arith::DivUIOp::create(b, x, y); }
  Value remU(Value x, Value y) { return mlir::arith::RemUIOp::create(b, x, y); }
  Value divS(Value x, Value y) { return mlir::arith::DivSIOp::create(b, x, y); }
  Value andI(Value x, Value y) { return mlir::arith::AndIOp::create(b, x, y); }
  Value orI(Value x, Value y) { return mlir::arith::OrIOp::create(b, x, y); }
  Value xorI(Value x, Value y) { return mlir::arith::XOrIOp::create(b, x, y); }
  Value shl(Value x, Value y) { return mlir::arith::ShLIOp::create(b, x, y); }
  Value shrU(Value x, Value y) { return mlir::arith::ShRUIOp::create(b, x, y); }
  Value minS(Value x, Value y) { return mlir::arith::MinSIOp::create(b, x, y); }
  Value maxS(Value x, Value y) { return mlir::arith::MaxSIOp::create(b, x, y); }
  Value cmp(mlir::arith::CmpIPredicate p, Value x, Value y) {
    return mlir::arith::CmpIOp::create(b, p, x, y);
  }
  Value select(Value c, Value x, Value y) {
    return mlir::arith::SelectOp::create(b, c, x, y);
  }
  Value ext64(Value x) { return mlir::arith::ExtSIOp::create(b, i64, x); }
  Value trunc32(Value x) { return mlir::arith::TruncIOp::create(b, i32, x); }
  /// The element offset (i64) of tile row \p row (i32) of a global access:
  /// row * stride (\p stride i64; null: 1), or with a row group (tile
  /// dialect's `group %G stride %gs`; \p group i32, \p groupStride i64)
  /// (row / G) * stride + (row % G) * gs.
  Value rowOffset(Value row, Value stride, Value group = Value(),
                  Value groupStride = Value()) {
    Value seq = ext64(group ? divU(row, group) : row);
    Value at = stride ? mul(seq, stride) : seq;
    return group ? add(at, mul(ext64(remU(row, group)), groupStride)) : at;
  }
  /// Clamps an i64 to [-2^30, 2^30] and truncates it to i32.
  Value clampTo32(Value x);

  // Float arithmetic.
  Value fadd(Value x, Value y) { return mlir::arith::AddFOp::create(b, x, y); }
  Value fsub(Value x, Value y) { return mlir::arith::SubFOp::create(b, x, y); }
  Value fmul(Value x, Value y) { return mlir::arith::MulFOp::create(b, x, y); }
  Value fma(Value x, Value y, Value z) {
    return mlir::LLVM::FMAOp::create(b, x, y, z);
  }
  Value fmax(Value x, Value y) { return mlir::LLVM::MaxNumOp::create(b, x, y); }
  Value fcmpEq(Value x, Value y) {
    return mlir::arith::CmpFOp::create(b, mlir::arith::CmpFPredicate::OEQ, x,
                                       y);
  }
  /// ex2.approx.ftz: 2^x, with 2^-inf = 0.
  Value exp2(Value x);
  /// lg2.approx.ftz.
  Value log2(Value x);
  /// shfl.sync.bfly with all 32 lanes (an f32, or an i64 as two words).
  Value shuffleXor(Value x, int64_t laneMask);
  /// Lane 0's \p x (i32) in every lane (shfl.sync.idx): a value the warp
  /// shares, as ptxas can tell (uniform registers, no R2UR per use).
  Value fromLane0(Value x);

  /// \p x (i32) through an opaque `mov`: values derived from the result
  /// inside a loop are not loop-invariant, so LLVM cannot hoist dozens of
  /// address computations into registers live across the loop.
  Value opaque(Value x);

  // Threads and blocks (i32).
  Value threadIdX();
  Value blockId(mlir::gpu::Dimension dim);
  /// The threads that barrier() synchronises: 0 for the whole block
  /// (bar.sync 0), else the first barrierThreads of it on named barrier 1
  /// (the consumers of a kernel with a producer warpgroup).
  int64_t barrierThreads = 0;
  void barrier();
  /// bar.sync (waits for \p threads arrivals, this warp's included) and
  /// bar.arrive (adds this warp's, does not wait) on named barrier \p id
  /// (i32, 0-15): a turn passed between warpgroups.
  void namedBarrierSync(Value id, int64_t threads);
  void namedBarrierArrive(Value id, int64_t threads);
  /// setmaxnreg.{inc,dec}.sync.aligned.u32 \p count: this warpgroup's
  /// registers per thread from here on (sm_90a; the kernel's .maxntid and
  /// .minnctapersm fix the count at entry, which ptxas allocates around).
  void setMaxRegisters(int64_t count, bool increase);
  /// bar.warp.sync over all 32 lanes: free where the warp is converged (a
  /// NOP in SASS), and an ordering point that the PTX assembler moves no
  /// shared-memory access across.
  void warpSync();

  // mbarriers (sm_90 for the waits), each 8 bytes at shared pointer \p bar.
  /// mbarrier.init with \p count arrivals per phase.
  void mbarrierInit(Value bar, int64_t count);
  /// One arrival of this thread (release: its reads and writes before it
  /// happen before the phase completes).
  void mbarrierArrive(Value bar);
  /// cp.async.mbarrier.arrive.noinc: one arrival when this thread's
  /// cp.async copies issued so far have landed (init counts it).
  void mbarrierArriveOnCopies(Value bar);
  /// Waits (acquire) until the phase of parity \p parity (i32: 0 or 1) has
  /// completed: mbarrier.try_wait.parity in a loop.
  void mbarrierWait(Value bar, Value parity);
  /// mbarrier.arrive.expect_tx: this thread's arrival, and \p bytes more
  /// that the phase waits for (the tensor copies that complete on it).
  void mbarrierExpectBytes(Value bar, int64_t bytes);

  // The tensor memory accelerator (sm_90).
  /// cp.async.bulk.tensor of the box at \p coords (i32, innermost first)
  /// of tensor map \p map (a generic pointer to a kernel parameter) into
  /// shared pointer \p dst; its bytes complete on mbarrier \p bar.
  void tensorCopy(Value dst, Value map, llvm::ArrayRef<Value> coords,
                  Value bar);
  /// cp.async.bulk.tensor of shared pointer \p src out to the box at
  /// \p coords (i32, innermost first) of tensor map \p map (a generic
  /// pointer to a kernel parameter), in the thread's bulk group: rows and
  /// columns past the map's bounds are not written. bulkCommit() closes
  /// the group, bulkWait() waits for it.
  void tensorStore(Value map, llvm::ArrayRef<Value> coords, Value src);
  /// prefetch.tensormap: brings \p map into the descriptor cache.
  void prefetchTensorMap(Value map);

  /// Emits \p body inside `scf.if %cond` (no results).
  template <typename Fn> void ifThen(Value cond, Fn &&body) {
    auto ifOp = mlir::scf::IfOp::create(b, cond, /*withElseRegion=*/false);
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    body();
  }

  // Pointers.
  Value toGlobal(Value genericPtr);
  /// If \p pred (i1; null: always): *ptr += v without a result
  /// (red.global.add.f32; an i64 \p v: red.global.add.u64, two's complement
  /// so signed too); \p ptr generic, to global memory. A predicated
  /// reduction in the PTX, which ptxas (12.x, 13.0) branches around, each
  /// in a convergence region of its own (BSSY, @!P BRA, REDG, BSYNC): where
  /// many share one predicate, test it once around them (a null \p pred).
  void reduceAdd(Value pred, Value ptr, Value v);
  /// If \p pred (null: always): ptr[0] += v0, ptr[1] += v1 in one
  /// red.global.add.v2.f32 (sm_90, PTX ISA 8.1); \p ptr 8-byte aligned.
  void reduceAdd2(Value pred, Value ptr, Value v0, Value v1);
  /// red.global.add.v4.f32 of \p v (four values; sm_90, PTX ISA 8.1) at
  /// \p ptr, 16-byte aligned, where \p pred (i1; null: always).
  void reduceAdd4(Value pred, Value ptr, llvm::ArrayRef<Value> v);
  /// If \p pred: adds \p bytes (i32, a multiple of 16) of f32 from shared
  /// pointer \p src into global memory at generic pointer \p dst, both
  /// 16-byte aligned, by the tensor memory accelerator
  /// (cp.reduce.async.bulk ... .bulk_group.add.f32, sm_90): each element
  /// atomically, asynchronously; bulkCommit() closes the thread's group.
  void bulkReduceAdd(Value pred, Value dst, Value src, Value bytes);
  /// cp.async.bulk.commit_group: the thread's bulk copies since the last.
  void bulkCommit();
  /// Waits until at most \p pending of the thread's committed bulk groups
  /// are still in flight: until their shared-memory sources are read
  /// (\p read), or until they are complete.
  void bulkWait(int64_t pending, bool read);
  /// Address of element \p index (i64) of a 16-bit-element array.
  Value elementPtr(Value base, Value index);
  /// Element \p index (i64) of a 16-bit-element array, as f32.
  Value loadElement(Value base, Value index);
  /// \p base + \p bytes (i32) for a shared-memory pointer.
  Value sharedBytePtr(Value base, Value bytes);
  Value intrinsic(llvm::StringRef name, mlir::TypeRange results,
                  mlir::ValueRange args);
  Value extract(Value aggregate, int64_t i);

  /// Byte offset of the 16-byte chunk holding column \p col (a multiple of
  /// 8 elements, i32) of row \p row (i32) in a swizzled tile with
  /// \p rowChunks chunks per row: chunk (col / 8) ^ (row % 8).
  Value swizzled(Value row, Value col, int64_t rowChunks);
  /// The same chunk in the blocked layout of wgmma (Wgmma.h): 64-column
  /// blocks \p blockBytes apart, rows of 128 bytes, chunk ((col / 8) ^ row)
  /// % 8 within the row.
  Value swizzledBlocked(Value row, Value col, int64_t blockBytes);

  /// cp.async of \p bytes (4, 8 or 16) with zero fill past \p srcBytes; for
  /// 2-byte copies a synchronous load and store.
  void copyAsync(Value dstShared, Value srcGlobal, Value srcBytes,
                 int64_t bytes);
  void commitGroup();
  void waitAll();
  /// cp.async.wait_group: waits until at most \p pending groups are in
  /// flight.
  void waitGroup(int64_t pending);

  /// ldmatrix.sync.aligned.m8n8.x4(.trans).b16 at \p addr (shared).
  Frag4 ldmatrix4(Value addr, bool transpose);
  /// d = a * b + c, m16n8k16 with fp32 accumulate; a: 4 x b32, b: 2 x b32.
  std::array<Value, 4> mma(const Frag4 &a, Value b0, Value b1,
                           const std::array<Value, 4> &c);
  /// Two f32 -> one b32 of two elements (x in the low half).
  Value pack2(Value x, Value y);
  /// The f32 pair (\p x, \p y) as vector<2xf32> (an 8-byte store's value).
  Value pairF32(Value x, Value y);
  /// pack2's inverse: one b32 of two elements -> two f32 (low half first).
  std::pair<Value, Value> unpack2(Value bits);
  /// One f32 -> one 16-bit element (as i16).
  Value toElementBits(Value x);
};

} // namespace flashjit::gpu

#endif // FLASHJIT_COMPILER_CONVERSION_GPUBUILDER_H
