// RUN: flashjit-opt %s --flashjit-tile-attention="block-m=64 block-n=32 overlap-softmax=true" | FileCheck %s

// The software-pipelined KV loop: the first block's S = Q K^T before the
// loop (its K at key 0 when the loop is empty), the loop carrying S as a
// fourth value, each iteration loading K of block min(t + 1, hi - 1) and V
// of block t, issuing the next S before the softmax of the carried one.
// CHECK-LABEL: func.func @causal(
// CHECK: %[[Q:.*]] = tile.load %arg0[{{.*}} -> tensor<64x96xbf16>
// CHECK: %[[LIVE:.*]] = arith.cmpi ult, %[[LO:.*]], %[[HI:.*]] : index
// CHECK: %[[FIRST:.*]] = arith.select %[[LIVE]], %{{.*}}, %c0{{.*}} : index
// CHECK: %[[K0:.*]] = tile.load %arg1[{{.*}}] rows %[[FIRST]]
// CHECK: %[[S0:.*]] = tile.dot %[[Q]], %[[K0]] {transpose_rhs}
// CHECK: scf.for %[[T:.*]] = %[[LO]] to %[[HI]] step {{.*}} iter_args({{.*}}, %[[S:.*]] = %[[S0]]) -> (tensor<64x96xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64x32xf32>)
// CHECK: arith.minsi
// CHECK: %[[KN:.*]] = tile.load %arg1{{.*}} -> tensor<32x96xbf16>
// CHECK: %[[V:.*]] = tile.load %arg2{{.*}} -> tensor<32x96xbf16>
// CHECK: %[[SN:.*]] = tile.dot %[[Q]], %[[KN]] {transpose_rhs}
// CHECK: scf.if %{{.*}} -> (tensor<64x32xf32>)
// CHECK: tile.reduce "max" %{{.*}} dim 1
// CHECK: math.exp2 {{.*}} : tensor<64x32xf32>
// CHECK: %[[P:.*]] = arith.truncf {{.*}} : tensor<64x32xf32> to tensor<64x32xbf16>
// CHECK: tile.dot %[[P]], %[[V]] acc
// CHECK: scf.yield {{.*}}, %[[SN]] :
// CHECK: tile.store
module {
attn.flash_fwd @causal {element_type = bf16, gqa = 1 : i64, head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal", sparse_block = 0 : i64}
}
