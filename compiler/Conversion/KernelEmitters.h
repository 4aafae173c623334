//===- KernelEmitters.h - The op families of the GPU lowering ---*- C++ -*-===//
//
/// \file
/// flashjit-lower-tiled-to-gpu (LowerTiledToGPU.cpp) walks the tiled
/// functions and hands each to its op family's emitter: the forward
/// (FlashFwdToGPU.cpp, functions carrying `attn.kernel`) or the backward
/// (FlashBwdToGPU.cpp, `attn.kernel_backward`). Each emitter adds one
/// gpu.func of the same name to the gpu.module. Internal.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_KERNELEMITTERS_H
#define FLASHJIT_COMPILER_CONVERSION_KERNELEMITTERS_H

#include "compiler/Conversion/GpuBuilder.h"
#include "kernels/AttentionSpec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace flashjit::conversion {

/// Lowers a tiled forward function (emits its errors on \p fn).
mlir::LogicalResult lowerForwardKernel(mlir::func::FuncOp fn,
                                       mlir::gpu::GPUModuleOp gpuModule,
                                       int64_t warps, int64_t copyBytes);

/// Lowers one of the three tiled backward functions.
mlir::LogicalResult lowerBackwardKernel(mlir::func::FuncOp fn,
                                        mlir::gpu::GPUModuleOp gpuModule,
                                        int64_t warps, int64_t copyBytes,
                                        bool vectorAtomics, bool wgmma);

/// The description a tiling pass recorded on a tiled function
/// (`attn.kernel` or `attn.kernel_backward`): head dims, element type, mask,
/// GQA group, sparse block, the backward's `deterministic` (the direction
/// is left Forward).
AttentionSpec specFromAttrs(mlir::DictionaryAttr attrs);

/// Integer field \p name of \p attrs (0 if absent).
int64_t intAttr(mlir::DictionaryAttr attrs, llvm::StringRef name);

/// Appends a `gpu.func` kernel named as \p tiled, taking \p argTys, with a
/// known block size of \p threads and the dynamic shared memory it needs
/// recorded as `attn.shared_bytes`; copies the description attributes.
mlir::gpu::GPUFuncOp createKernelFunc(mlir::ImplicitLocOpBuilder &b,
                                      mlir::gpu::GPUModuleOp gpuModule,
                                      mlir::func::FuncOp tiled,
                                      mlir::TypeRange argTys, int64_t threads,
                                      int64_t sharedBytes);

/// The base of the dynamic shared memory (`@flashjit_smem`).
mlir::Value sharedMemoryBase(mlir::ImplicitLocOpBuilder &b, gpu::GpuBuilder &g);

} // namespace flashjit::conversion

#endif // FLASHJIT_COMPILER_CONVERSION_KERNELEMITTERS_H
