//===- PTXEmitter.h - gpu.module (LLVM + NVVM dialects) -> PTX --*- C++ -*-===//
//
/// \file
/// The last stage of the GPU path: a gpu.module whose body is already in the
/// LLVM and NVVM dialects (after convert-gpu-to-nvvm, convert-nvvm-to-llvm and
/// reconcile-unrealized-casts) is translated to LLVM IR for
/// nvptx64-nvidia-cuda, optimised with LLVM's O3 pipeline and the NVPTX
/// TargetMachine (so NVVMReflect and the NVPTX IR passes run), and printed as
/// PTX by the NVPTX backend.
///
/// Errors are reported as CompileError, never by aborting the process, as far
/// as that can be checked before code generation:
///  - checkTarget() rejects an architecture or PTX ISA version that LLVM's
///    NVPTX backend does not know, and a PTX version below the architecture's
///    minimum (LLVM would exit with "PTX version X does not support target").
///  - The translated module is verified (an `immarg` operand that is not a
///    constant, a wrong intrinsic signature, ...).
///  - NVVM intrinsics that need a newer architecture than the target (mma,
///    ldmatrix, cp.async, wgmma, ...) are rejected by name; NVPTX's instruction
///    selector would otherwise exit with "Cannot select: intrinsic ...".
///  - LLVM diagnostics of error severity are collected and thrown.
/// Instruction-selection failures that these checks do not foresee still end
/// the process inside LLVM (report_fatal_error cannot be recovered from).
///
/// This header includes no MLIR or LLVM header.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_TARGET_PTXEMITTER_H
#define FLASHJIT_COMPILER_TARGET_PTXEMITTER_H

#include <string>

namespace mlir {
class ModuleOp;
namespace gpu {
class GPUModuleOp;
} // namespace gpu
} // namespace mlir

namespace flashjit {

/// What the NVPTX backend is asked to produce.
struct PtxOptions {
  /// The GPU architecture, as LLVM's NVPTX backend names it: "sm_80",
  /// "sm_86", "sm_89", "sm_90", "sm_90a", ...
  std::string arch = "sm_90a";
  /// The PTX ISA version times ten: 80 -> ".version 8.0", 90 -> ".version 9.0".
  int ptxVersion = 80;
  /// LLVM optimisation level, 0..3 (the IR pipeline and code generation).
  int optLevel = 3;
};

/// The lowest PTX ISA version (times ten) that LLVM accepts for \p arch, e.g.
/// 70 for sm_80, 78 for sm_90, 80 for sm_90a. Throws CompileError for an
/// architecture LLVM's NVPTX backend does not know.
int minPtxVersion(const std::string &arch);

/// The highest PTX ISA version (times ten) LLVM's NVPTX backend can emit
/// (90 for LLVM 22).
int maxPtxVersion();

/// The PTX ISA version (times ten) a CUDA driver of \p driverVersion
/// (cuDriverGetVersion's encoding: 13000 = CUDA 13.0, 12080 = 12.8) accepts:
/// 13000 -> 90, 12090 -> 88, 12080 -> 87, 12040 -> 84, 12000 -> 80,
/// 11080 -> 78. Returns 0 for 0 (unknown) and for drivers older than 11.0.
int driverPtxVersion(int driverVersion);

/// Chooses the PTX ISA version for \p arch: minPtxVersion(arch), raised to
/// driverPtxVersion(driverVersion) (0 = unknown driver: the minimum), and
/// capped at maxPtxVersion(). Returns the version times ten. Throws
/// CompileError for an unknown architecture.
int choosePtxVersion(const std::string &arch, int driverVersion);

/// Throws CompileError if LLVM's NVPTX backend does not know \p opts.arch,
/// cannot emit PTX version \p opts.ptxVersion, or would refuse the pair
/// (ptxVersion below minPtxVersion(arch)), or if optLevel is not 0..3.
void checkTarget(const PtxOptions &opts);

/// Translates the body of the only gpu.module in \p module (whose contents
/// are in the LLVM + NVVM dialects) to LLVM IR for nvptx64-nvidia-cuda with
/// the NVPTX data layout and the module flag nvvm-reflect-ftz = 1, runs the
/// O<optLevel> pipeline with the NVPTX TargetMachine, and returns the
/// optimised LLVM IR as text. Registers the builtin, LLVM, NVVM and GPU
/// dialect translations on the module's context if they are missing.
/// Throws CompileError (see the file comment).
std::string gpuModuleToLLVMIR(mlir::ModuleOp module, const PtxOptions &opts);

/// As gpuModuleToLLVMIR(), then runs the NVPTX backend and returns the PTX.
std::string gpuModuleToPtx(mlir::ModuleOp module, const PtxOptions &opts);

/// As gpuModuleToPtx(ModuleOp), for \p gpuModule itself (one of several in
/// a module: flashjit-gpu-module-to-ptx, compiler/Target/Passes.td).
std::string gpuModuleToPtx(mlir::gpu::GPUModuleOp gpuModule,
                           const PtxOptions &opts);

} // namespace flashjit

#endif // FLASHJIT_COMPILER_TARGET_PTXEMITTER_H
