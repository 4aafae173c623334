// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=64 block-n=32" | FileCheck %s
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=48 block-n=64" 2>&1 | FileCheck %s --check-prefix=BAD

// A dense causal kernel: Q tile, the running state, then an scf.for over KV
// blocks in the band; the element mask only under an scf.if (straddling
// blocks); online softmax with exp2 rescaling; O / l and lse at the end.
// CHECK-LABEL: func.func @causal(
// CHECK-SAME: %{{.*}}: memref<?xbf16>
// CHECK-SAME: attn.kernel = {block_m = 64 : i64, block_n = 32 : i64
// CHECK-DAG: memref.alloca() : memref<64x96xf32>
// CHECK-DAG: memref.alloca() : memref<64x32xf32>
// CHECK-DAG: memref.alloca() : memref<64xf32>
// CHECK: scf.for %[[KB:.*]] = %{{.*}} to %{{.*}} step
// CHECK: arith.muli %[[KB]], %c32{{.*}} : index
// CHECK: scf.if
// CHECK: arith.select {{.*}} : f32
// CHECK: arith.maxnumf
// CHECK: math.exp2
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: math.log2
module {
attn.flash_fwd @causal {element_type = bf16, gqa = 1 : i64, head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal", sparse_block = 0 : i64}
}

// -----

// Block-sparse: the loop bound is the count read from the layout; each
// listed sparse block is walked in sparse_block / Bc = 4 steps.
// CHECK-LABEL: func.func @sparse(
// CHECK-SAME: memref<?xf16>
// CHECK: memref.load %{{.*}} : memref<?xi32>
// CHECK: arith.index_cast
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step
// CHECK: memref.load %{{.*}} : memref<?xi32>
// CHECK: scf.for %{{.*}} = %{{.*}} to %c4 step
// CHECK: scf.if
// BAD: error: 'attn.flash_fwd' op block-m (48) and block-n (64) must divide sparse_block (128)
module {
attn.flash_fwd @sparse {element_type = f16, gqa = 2 : i64, head_dim_qk = 64 : i64, head_dim_v = 32 : i64, mask = "none", sparse_block = 128 : i64}
}
