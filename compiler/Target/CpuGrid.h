//===- CpuGrid.h - Running tiled functions on host threads ------*- C++ -*-===//
//
/// \file
/// What the CPU execution mode's kernels share (CpuEngine.cpp: the forward
/// and its block classification; CpuBackwardEngine.cpp: the backward): the
/// JIT of a tiled module, memref descriptors of host buffers, and the grid
/// of programs run on host threads. Internal to compiler/Target.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_TARGET_CPUGRID_H
#define FLASHJIT_COMPILER_TARGET_CPUGRID_H

#include "compiler/Compiler.h"
#include "kernels/HostTensor.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"

#include <memory>
#include <string>
#include <vector>

namespace flashjit::cpu {

/// A (allocated, aligned, offset, size, stride) memref<?xT> descriptor.
struct MemRef1D {
  void *allocated;
  void *aligned;
  int64_t offset, size, stride;
};

inline MemRef1D describe(void *data, int64_t size) {
  return {data, data, 0, size, 1};
}

/// The packed entry point the ExecutionEngine makes for a function.
using PackedEntry = void (*)(void **);

/// Runs the CPU pipeline on \p source (the attn stage of \p spec when
/// empty) and JIT-compiles it.
std::unique_ptr<mlir::ExecutionEngine> jitCompile(mlir::MLIRContext &ctx,
                                                  const AttentionSpec &spec,
                                                  const TileConfig &config,
                                                  const KernelSource &source);

/// Function \p name of \p engine; CompileError when it has none.
PackedEntry lookupEntry(mlir::ExecutionEngine &engine, const std::string &name);

/// The memrefs of \p d's captured tensors, after checking that they are
/// \p spec's (its count, none empty).
std::vector<MemRef1D> capturedBuffers(const AttentionSpec &spec,
                                      const AttentionData &d);

/// Runs \p entry for every (pid_m, pid_bh) in [0, gridM) x [0, gridBH) on
/// host threads. The argument list is: the buffers, the index arguments, the
/// f32 arguments, pid_m, pid_bh (kernels/KernelABI.h); with \p gridZ > 0
/// also pid_split, every one of [0, gridZ) (abi::split); then the
/// buffers of \p tail (a score modifier's captured tensors, and in the
/// backward their gradients and words) and the index arguments of
/// \p tailIdx (the deterministic backward's captured sizes).
void runGrid(PackedEntry entry, const std::vector<MemRef1D> &bufs,
             const std::vector<int64_t> &idx, const std::vector<float> &f32s,
             int64_t gridM, int64_t gridBH, int64_t gridZ = 0,
             const std::vector<MemRef1D> &tail = {},
             const std::vector<int64_t> &tailIdx = {});

/// The whole buffer behind a view, from the view's offset on.
MemRef1D view(const HalfTensor &t);

/// A varlen kernel's offsets (AttentionData::cuSeqQ or cuSeqKV), or
/// \p unused (a valid buffer the kernel never reads) when there are none.
MemRef1D varlenOffsets(const std::vector<int32_t> &cu, MemRef1D unused);

/// Checks the layout argument against \p spec and \p p.
void checkLayoutArg(const AttentionSpec &spec, const Problem &p,
                    const BlockSparseLayout *layout);

} // namespace flashjit::cpu

#endif // FLASHJIT_COMPILER_TARGET_CPUGRID_H
