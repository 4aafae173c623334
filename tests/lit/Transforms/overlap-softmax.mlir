// RUN: flashjit-opt %s --flashjit-tile-attention="block-m=64 block-n=32 overlap-softmax=true" | FileCheck %s

// The software-pipelined KV loop (FlashAttention-3's order): the first
// block's S = Q K^T and softmax before the loop (its K at key 0 when there
// is no block; its row sum 0 then), the loop over [lo, last) carrying P
// rounded and the previous row max, each iteration loading K of block
// t + 1 and V of block t, issuing the next S, then O += P V with O
// rescaled by exp2(previous max - max), then the next block's softmax;
// after the loop the last block's P V, its V block found before the loop.
// CHECK-LABEL: func.func @causal(
// CHECK: %[[Q:.*]] = tile.load %arg0[{{.*}} -> tensor<64x96xbf16>
// CHECK: %[[LIVE:.*]] = arith.cmpi ult, %[[LO:.*]], %[[HI:.*]] : index
// CHECK: %[[FIRST:.*]] = arith.select %[[LIVE]], %{{.*}}, %c0{{.*}} : index
// CHECK: %[[LAST:.*]] = arith.select %[[LIVE]], %{{.*}}, %[[LO]] : index
// CHECK: %[[NLAST:.*]] = arith.select %[[LIVE]], %{{.*}}, %c0{{.*}} : index
// CHECK: %[[K0:.*]] = tile.load %arg1[{{.*}}] rows %[[FIRST]]
// CHECK: %[[S0:.*]] = tile.dot %[[Q]], %[[K0]] {transpose_rhs}
// CHECK: %[[SUM0:.*]] = tile.reduce "sum" %{{.*}} dim 1
// CHECK-NOT: scf.for
// CHECK: %[[L0:.*]] = arith.select %[[LIVE]], %[[SUM0]], %{{.*}} : tensor<64xf32>
// CHECK: %[[P0:.*]] = arith.truncf {{.*}} : tensor<64x32xf32> to tensor<64x32xbf16>
// CHECK: %[[R:.*]]:5 = scf.for %[[T:.*]] = %[[LO]] to %[[LAST]] step {{.*}} iter_args(%[[O:.*]] = %{{.*}}, %[[M:.*]] = %{{.*}}, %{{.*}} = %[[L0]], %[[P:.*]] = %[[P0]], %[[MP:.*]] = %{{.*}}) -> (tensor<64x96xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64x32xbf16>, tensor<64xf32>)
// CHECK: %[[KN:.*]] = tile.load %arg1{{.*}} -> tensor<32x96xbf16>
// CHECK: %[[V:.*]] = tile.load %arg2{{.*}} -> tensor<32x96xbf16>
// CHECK: %[[SN:.*]] = tile.dot %[[Q]], %[[KN]] {transpose_rhs}
// CHECK: %[[D:.*]] = arith.subf %[[MP]], %{{.*}} : tensor<64xf32>
// CHECK: %[[A:.*]] = math.exp2 %[[D]]
// CHECK: %[[B:.*]] = tile.broadcast %[[A]] dim 1
// CHECK: %[[OS:.*]] = arith.mulf %[[O]], %[[B]]
// CHECK: tile.dot %[[P]], %[[V]] acc %[[OS]]
// CHECK: scf.if %{{.*}} -> (tensor<64x32xf32>)
// CHECK: tile.reduce "max" %{{.*}} dim 1
// CHECK: math.exp2 {{.*}} : tensor<64x32xf32>
// CHECK: %[[PN:.*]] = arith.truncf {{.*}} : tensor<64x32xf32> to tensor<64x32xbf16>
// CHECK: scf.yield {{.*}}, %[[PN]], %[[M]] :
// CHECK: %[[VL:.*]] = tile.load %arg2[{{.*}}] rows %[[NLAST]]
// CHECK: arith.subf %[[R]]#4, %{{.*}} : tensor<64xf32>
// CHECK: %[[OL:.*]] = arith.mulf %[[R]]#0, %{{.*}}
// CHECK: tile.dot %[[R]]#3, %[[VL]] acc %[[OL]]
// CHECK: tile.store
module {
attn.flash_fwd @causal {element_type = bf16, gqa = 1 : i64, head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal", sparse_block = 0 : i64}
}
