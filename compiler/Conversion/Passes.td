//===- Passes.td - flashjit's conversions -------------------*- tablegen -*-===//

#ifndef FLASHJIT_CONVERSION_PASSES
#define FLASHJIT_CONVERSION_PASSES

include "mlir/Pass/PassBase.td"

def LowerTiledToGPU : Pass<"flashjit-lower-tiled-to-gpu", "mlir::ModuleOp"> {
  let summary = "Map the tiled FlashAttention program onto a tensor-core kernel";
  let description = [{
    Replaces each tiled function (func.func carrying `attn.kernel`, made by
    flashjit-tile-attention) by a `gpu.module` holding one `gpu.func` kernel
    that runs the same program per thread block: blockIdx = (Q block,
    batch * head, O-column chunk); `warps` warps split the Br query rows
    (FlashAttention-2: no inter-warp reduction); Q, K, V are staged in
    swizzled shared memory with cp.async (`copy-bytes` wide: the alignment
    of the pointers and strides), read with ldmatrix (transposed for V);
    S = Q K^T and O += P V run on m16n8k16 MMAs with fp32 accumulators held
    in registers across the KV loop; row max and sum use warp shuffles, the
    softmax scale is folded into exp2, and P is converted to the element type
    in registers. K of the next block loads while P V runs, V while S runs.
    The kernel's arguments are the tiled function's, minus pid_m and pid_bh.
    Options: `warps` (per thread block, 4 by default) and the knobs of
    compiler/Conversion/GpuLoweringKnobs.def (`flashjit-opt --help` lists
    them with their descriptions).
  }];
  let dependentDialects = ["mlir::gpu::GPUDialect", "mlir::LLVM::LLVMDialect",
                           "mlir::scf::SCFDialect", "mlir::arith::ArithDialect"];
  // Its options (`warps` and every knob of GpuLoweringKnobs.def) are
  // declared in LowerTiledToGPU.cpp from that one list, which the pipelines'
  // options and GpuLoweringConfig expand too.
}

def MarkGridConstants : Pass<"flashjit-mark-grid-constants",
                              "mlir::LLVM::LLVMFuncOp"> {
  let summary = "Make the tensor-map parameters of kernels __grid_constant__";
  let description = [{
    After convert-gpu-to-nvvm: a kernel that records `attn.tensor_maps`
    (TileToGPUTma.cpp) takes those tensor maps as its last arguments; each
    becomes a 128-byte `llvm.byval` parameter, 64-byte aligned and
    `nvvm.grid_constant`, so that the kernel reads it where it lies (a
    param-space address, which TMA instructions take) rather than from a
    local copy. The NVVM dialect admits nvvm.grid_constant only on kernel
    functions of the LLVM dialect, hence after the conversion.
  }];
  let dependentDialects = ["mlir::NVVM::NVVMDialect"];
}

def LowerTileToLoops : Pass<"flashjit-lower-tile-to-loops", "mlir::ModuleOp"> {
  let summary = "Lower the tile IR to loops on memref buffers (the CPU mode)";
  let description = [{
    Rewrites every function body so that no tensor and no tile op remains:
    each tile value gets a memref.alloca of its static shape, hoisted to the
    function's entry block, and each op on tiles becomes a loop nest over
    its elements (memref load / store / atomic_rmw, scf, scalar arith and
    math), with the semantics TileOps.td gives: tile.load zero-fills the
    rows past `rows` without reading them, tile.store and tile.atomic_add
    skip them (atomic_add by memref.atomic_rmw addf), tile.dot accumulates
    in f32 in order k = 0..K-1 from acc (or 0), tile.reduce folds maxnumf
    from -inf or addf from 0 in index order. Elementwise arith / math ops on
    tiles (the ElementwiseMappable ops) are cloned on scalars. A loop
    carrying tiles gets one buffer per tile iter_arg (the yielded tiles are
    copied back at the end of the body, through temporaries when the yield
    permutes them); an scf.if yielding tiles writes a result buffer in each
    branch. Scalar code is left as it is; an op on tiles that cannot be
    lowered (an unknown op, a dynamic shape) is a named error.
  }];
  let dependentDialects = ["mlir::memref::MemRefDialect",
                           "mlir::scf::SCFDialect", "mlir::arith::ArithDialect",
                           "mlir::math::MathDialect"];
}

#endif // FLASHJIT_CONVERSION_PASSES
