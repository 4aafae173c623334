// RUN: flashjit-opt %s --flashjit-tile-attention-backward="block-m=32 block-n=32" | FileCheck %s

// The backward recomputes P with the mask_mod inlined as the forward's:
// -inf where it yields false before the exponent, so P (and dS) are 0
// there. In the dK/dV loop the keys are on the tile's rows (S^T): the
// query positions are the columns' index tile.
// CHECK-LABEL: func.func @document(
// CHECK-SAME: attn.kernel = #attn.kernel<role = "main"{{.*}}mask_mod = "custom">
// CHECK: scf.for
// CHECK: tile.gather
// CHECK: tile.gather
// CHECK: %[[K:.*]] = arith.cmpf oeq, %{{.*}}, %{{.*}} : tensor<32x32xf32>
// CHECK: %[[M:.*]] = arith.select %[[K]], %{{.*}}, %{{.*}} : tensor<32x32xi1>, tensor<32x32xf32>
// CHECK: math.fma %[[M]]
// CHECK: math.exp2
module {
attn.flash_bwd @document {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  attn.yield %same : i1
}
}
