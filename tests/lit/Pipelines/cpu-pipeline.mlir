// RUN: flashjit-opt %s --pass-pipeline='builtin.module(flashjit-cpu-pipeline{block-m=32 block-n=32})' | FileCheck %s
// RUN: flashjit-opt %s --pass-pipeline='builtin.module(flashjit-tiling-pipeline{block-m=16 block-n=16})' | FileCheck %s --check-prefix=TILED

// The CPU pipeline ends in the LLVM dialect: no scf, memref or math left.
// CHECK: llvm.func @attention(
// CHECK-NOT: scf.
// CHECK-NOT: memref.
// CHECK-NOT: math.
// CHECK: llvm.intr.exp2
// CHECK: llvm.return

// TILED: func.func @attention
// TILED: tile.load {{.*}} -> tensor<16x16xbf16>
// TILED: scf.for {{.*}} -> (tensor<16x16xf32>, tensor<16xf32>, tensor<16xf32>)
module {
attn.flash_fwd @attention {element_type = bf16, gqa = 1 : i64, head_dim_qk = 16 : i64, head_dim_v = 16 : i64, mask = "none", sparse_block = 0 : i64}
}
