//===- Passes.td - flashjit's target passes -----------------*- tablegen -*-===//

#ifndef FLASHJIT_TARGET_PASSES
#define FLASHJIT_TARGET_PASSES

include "mlir/Pass/PassBase.td"

def GpuModuleToPtx : Pass<"flashjit-gpu-module-to-ptx", "mlir::ModuleOp"> {
  let summary = "Replace each gpu.module by a gpu.binary holding its PTX";
  let description = [{
    The last stage of the GPU path, as a pass: each gpu.module directly in
    the module, its body in the LLVM + NVVM dialects (the end of
    flashjit-tile-to-gpu-pipeline), is compiled to PTX by flashjit's PTX
    emitter (compiler/Target/PTXEmitter.h: LLVM's O3 pipeline and the NVPTX
    backend), the one `flashjit compile --emit ptx` runs, and replaced by a
    `gpu.binary` of the same name with one assembly object:

      gpu.binary @flashjit_kernels [#gpu.object<#nvvm.target<O = 3,
          chip = "sm_90a", features = "+ptx80">, assembly = "...">]

    The object's target records the chip, the PTX ISA version and the
    optimisation level the PTX was made for. An architecture or PTX ISA
    version LLVM's NVPTX backend does not know, and an intrinsic the chip
    lacks (wgmma below sm_90a, ...), are named errors.
  }];
  let dependentDialects = ["mlir::gpu::GPUDialect", "mlir::NVVM::NVVMDialect"];
  let options = [
    Option<"chip", "chip", "std::string", "\"sm_90a\"",
           "the GPU architecture: sm_80, sm_86, sm_89, sm_90, sm_90a, ...">,
    Option<"ptxVersion", "ptx-version", "int64_t", "0",
           "the PTX ISA version times ten (81: .version 8.1); 0: the lowest "
           "the chip accepts, as `flashjit compile` without a CUDA driver">,
  ];
}

#endif // FLASHJIT_TARGET_PASSES
