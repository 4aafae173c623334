// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=64 block-n=32" | FileCheck %s
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=48 block-n=64" 2>&1 | FileCheck %s --check-prefix=BAD

// A dense causal kernel in the tile IR: the Q tile, then an scf.for over
// the KV blocks in the band carrying O, m, l as tiles; the element mask
// only under an scf.if (straddling blocks); the online softmax with exp2
// rescaling; P rounded to bf16 before P V; O / l and lse stored at the end.
// CHECK-LABEL: func.func @causal(
// CHECK-SAME: %{{.*}}: memref<?xbf16>
// CHECK-SAME: attn.kernel = #attn.kernel<role = "forward", head_dim_qk = 96, head_dim_v = 96, element_type = bf16, mask = "causal", gqa = 1, sparse_block = 0, block_m = 64, block_n = 32, deterministic = false>
// CHECK: %[[Q:.*]] = tile.load %arg0[{{.*}}] rows {{.*}} stride {{.*}} : memref<?xbf16> -> tensor<64x96xbf16>
// CHECK: scf.for %[[KB:.*]] = %{{.*}} to %{{.*}} step {{.*}} iter_args({{.*}}) -> (tensor<64x96xf32>, tensor<64xf32>, tensor<64xf32>)
// CHECK: arith.muli %[[KB]], %c32{{.*}} : index
// CHECK: %[[K:.*]] = tile.load %arg1{{.*}} -> tensor<32x96xbf16>
// CHECK: %[[V:.*]] = tile.load %arg2{{.*}} -> tensor<32x96xbf16>
// CHECK: %[[S:.*]] = tile.dot %[[Q]], %[[K]] {transpose_rhs} : tensor<64x96xbf16>, tensor<32x96xbf16> -> tensor<64x32xf32>
// CHECK: scf.if %{{.*}} -> (tensor<64x32xf32>)
// CHECK: tile.iota dim 1 : tensor<64x32xi32>
// CHECK: arith.select {{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
// CHECK: tile.reduce "max" {{.*}} dim 1 : tensor<64x32xf32> -> tensor<64xf32>
// CHECK: arith.maxnumf {{.*}} : tensor<64xf32>
// CHECK: math.exp2 {{.*}} : tensor<64xf32>
// CHECK: math.fma
// CHECK: math.exp2 {{.*}} : tensor<64x32xf32>
// CHECK: tile.reduce "sum"
// CHECK: %[[P:.*]] = arith.truncf {{.*}} : tensor<64x32xf32> to tensor<64x32xbf16>
// CHECK: tile.dot %[[P]], %[[V]] acc
// CHECK: scf.yield
// CHECK: arith.truncf {{.*}} to tensor<64x96xbf16>
// CHECK: tile.store {{.*}}, %arg3[
// CHECK: math.log2
// CHECK: tile.store {{.*}}, %arg4[{{.*}} : tensor<64xf32>, memref<?xf32>
module {
attn.flash_fwd @causal {element_type = bf16, gqa = 1 : i64, head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal", sparse_block = 0 : i64}
}

// -----

// Block-sparse: the loop runs count * (sparse_block / Bc = 4) iterations,
// the count read from the layout; iteration t reads the listed sparse
// block t / 4 and takes its Bc-block t % 4.
// CHECK-LABEL: func.func @sparse(
// CHECK-SAME: memref<?xf16>
// CHECK: memref.load %{{.*}} : memref<?xi32>
// CHECK: arith.index_cast
// CHECK: arith.muli %{{.*}}, %c4
// CHECK: scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step
// CHECK: arith.divui %[[T]], %c4
// CHECK: memref.load %{{.*}} : memref<?xi32>
// CHECK: arith.remui %[[T]], %c4
// CHECK: tile.dot
// BAD: error: 'attn.flash_fwd' op block-m (48) and block-n (64) must divide sparse_block (128)
module {
attn.flash_fwd @sparse {element_type = f16, gqa = 2 : i64, head_dim_qk = 64 : i64, head_dim_v = 32 : i64, mask = "none", sparse_block = 128 : i64}
}
