// RUN: flashjit-opt %s --flashjit-tile-attention="block-m=16 block-n=64 kv-split=true" --canonicalize --cse | FileCheck %s
// RUN: flashjit-opt %s --flashjit-tile-attention="block-m=16 block-n=64 kv-split=true" | flashjit-opt --flashjit-tile-to-cpu-pipeline | FileCheck %s --check-prefix=CPU

// The split-KV forward of a GQA decode (8 query heads per KV head): the
// partial, whose 16 rows are the group's query heads (the Q load and the
// partials' stores take `group %c8`), walks its run of the KV blocks
// (ceil(blocks / kv_splits) of them, run pid_split) and writes f32 partials
// into o_part (%arg9) and lse_part (%arg10); the combine merges the
// kv_splits partials of 64 rows (bwd::kRowBlockRows) and 32 columns into O
// and lse, 32 runs per step (their loads in flight together), a run past
// kv_splits (only in the last loop's steps of 8) read as run kv_splits - 1
// with lse -inf.
// CHECK-LABEL: func.func @decode(
// CHECK-SAME: %arg9: memref<?xf32>, %arg10: memref<?xf32>
// CHECK-SAME: %arg34: index, %arg35: f32, %arg36: index, %arg37: index, %arg38: index)
// CHECK-SAME: attn.arg_names = [{{.*}}"o_part", "lse_part"{{.*}}"kv_splits", "scale_log2e", "pid_m", "pid_bh", "pid_split"]
// CHECK-SAME: attn.kernel = #attn.kernel<role = "forward_split", head_dim_qk = 128, head_dim_v = 128, element_type = bf16, mask = "causal", gqa = 8, sparse_block = 0, block_m = 16, block_n = 64, deterministic = false>
// CHECK: tile.load %arg0[{{.*}}] rows {{.*}} stride %arg17 group %c8 stride %arg16 : memref<?xbf16> -> tensor<16x128xbf16>
// CHECK: arith.divui {{.*}}, %arg34 : index
// CHECK: scf.for {{.*}} -> (tensor<16x128xf32>, tensor<16xf32>, tensor<16xf32>)
// CHECK: arith.divui {{.*}} : tensor<16xi32>
// CHECK: tile.store {{.*}}, %arg9[{{.*}}] rows {{.*}} stride %c128 group %c8 stride {{.*}} : tensor<16x128xf32>, memref<?xf32>
// CHECK: tile.store {{.*}}, %arg10[{{.*}}] rows {{.*}} group %c8 stride %arg13 : tensor<16xf32>, memref<?xf32>
// CHECK-LABEL: func.func @decode_combine(
// CHECK-SAME: attn.kernel = #attn.kernel<role = "combine"
// Its columns: chunk pid_split (%arg38) of 32 (combineChunks(128) = 4).
// CHECK: %[[C0:.*]] = arith.muli %arg38, %c32 : index
// The whole steps of 32 runs read them unchecked.
// CHECK: %[[Q:.*]] = arith.divui %arg34, %c32 : index
// CHECK: %[[WHOLE:.*]] = arith.muli %[[Q]], %c32 : index
// CHECK: scf.for %[[S0:.*]] = %c0 to %[[WHOLE]] step %c32 {{.*}} -> (tensor<64x32xf32>, tensor<64xf32>, tensor<64xf32>)
// CHECK-NOT: arith.select
// CHECK: tile.load %arg10[{{.*}} -> tensor<64xf32>
// CHECK: %[[OFF:.*]] = arith.addi %{{.*}}, %[[C0]] : index
// CHECK: tile.load %arg9[%[[OFF]]] {{.*}} stride %c128 : memref<?xf32> -> tensor<64x32xf32>
// CHECK-NOT: arith.select {{.*}} : index
// CHECK-COUNT-31: tile.load %arg9[{{.*}} stride %c128 : memref<?xf32> -> tensor<64x32xf32>
// CHECK-NOT: tile.load
// CHECK: math.exp2
// CHECK: scf.yield
// The last loop (steps of 8 runs) clamps its runs to kv_splits - 1 and
// weighs those past it -inf.
// CHECK: scf.for %[[T0:.*]] = %[[WHOLE]] to %arg34 step %c8
// CHECK: %[[LAST:.*]] = arith.subi %arg34, %c1
// CHECK: %[[IN:.*]] = arith.cmpi ult, %[[T0]], %arg34
// CHECK: arith.select %[[IN]], %[[T0]], %[[LAST]] : index
// CHECK: tile.load %arg10[{{.*}} -> tensor<64xf32>
// CHECK: arith.select %[[IN]], %{{.*}}, %{{.*}} : f32
// CHECK: tile.load %arg9[{{.*}} stride %c128 : memref<?xf32> -> tensor<64x32xf32>
// CHECK-COUNT-7: tile.load %arg9[{{.*}} stride %c128 : memref<?xf32> -> tensor<64x32xf32>
// CHECK-NOT: tile.load
// CHECK: scf.yield
// CHECK: %[[OC:.*]] = arith.addi %{{.*}}, %[[C0]] : index
// CHECK: tile.store {{.*}}, %arg3[%[[OC]]] {{.*}} : tensor<64x32xbf16>, memref<?xbf16>
// CHECK: tile.store {{.*}}, %arg4[{{.*}} : tensor<64xf32>, memref<?xf32>

// The CPU lowering addresses a grouped row p at (p / 8) * stride + (p % 8)
// * group stride.
// CPU-LABEL: llvm.func @decode(
// CPU: llvm.udiv
// CPU: llvm.urem
// CPU-LABEL: llvm.func @decode_combine(
module {
attn.flash_fwd @decode {element_type = bf16, gqa = 8 : i64, head_dim_qk = 128 : i64, head_dim_v = 128 : i64, mask = "causal", sparse_block = 0 : i64}
}
