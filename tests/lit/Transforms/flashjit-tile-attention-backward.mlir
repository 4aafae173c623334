// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32" | FileCheck %s
// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32" | FileCheck %s --check-prefix=TILE
// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32 dq-block-m=32 dq-block-n=16" | FileCheck %s --check-prefix=DQB
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=48 block-n=32" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32 dq-block-m=2000" 2>&1 | FileCheck %s --check-prefix=BADDQ
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32 dq-block-n=-16" 2>&1 | FileCheck %s --check-prefix=BADDQN
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32 dq-block-m=48" 2>&1 | FileCheck %s --check-prefix=BADDQSPARSE
// RUN: flashjit-opt %s --split-input-file --pass-pipeline='builtin.module(flashjit-cpu-pipeline{block-m=64 block-n=32})' | FileCheck %s --check-prefix=LLVM
// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32 dq-quad-order=true" | FileCheck %s --check-prefix=QUAD

// Every function is tile IR: tiles, scf, scalar index arithmetic and the
// scalar loads of a BCSR list; no buffers of its own, no scalar atomics.
// TILE: func.func @causal_preprocess(
// TILE-NOT: memref.alloca
// TILE-NOT: memref.store
// TILE-NOT: memref.atomic_rmw
// TILE: func.func @sparse_dq(
// TILE-NOT: memref.alloca
// TILE-NOT: memref.store

// dq-quad-order (flashjit's default pipeline sets it): dq_accum's rows in
// quad order, the main loop's atomic add and the conversion's load marked
// (d 96: whole 16-column groups); the deterministic dQ has no dq_accum.
// QUAD-LABEL: func.func @causal(
// QUAD: tile.atomic_add {{.*}} stride %c96 {quad_order} : tensor<64x96xf32>
// QUAD-LABEL: func.func @causal_dq(
// QUAD: tile.load %arg7{{.*}} stride %c96 {quad_order} : memref<?xf32> -> tensor<64x96xf32>
// QUAD-LABEL: func.func @det(
// QUAD-NOT: quad_order
// QUAD-LABEL: func.func @det_dq(

// Three functions with one argument list: the preprocessing (delta and
// -lse * log2(e), 64 rows per program), the main loop (one program per KV
// block: dK, dV) and dQ. Atomic dQ (the default, deterministic = false):
// the preprocessing zeroes dq_accum (%arg7), the main loop adds dS K into it
// with tile.atomic_add, @causal_dq converts.
// CHECK-LABEL: func.func @causal_preprocess(
// CHECK-SAME: %{{.*}}: memref<?xbf16>
// CHECK-SAME: "lse", "delta", "dq_accum", "dq", "dk", "dv", "counts", "indices", "kv_counts", "kv_indices"
// CHECK-SAME: "scale_log2e", "scale", "pid_m", "pid_bh"]
// CHECK-SAME: attn.kernel = #attn.kernel<role = "preprocess"
// CHECK-SAME: block_m = 64, block_n = 32, deterministic = false>
// CHECK: %[[BHN:.*]] = arith.muli %{{.*}}, %arg19 : index
// CHECK: %[[FIRST:.*]] = arith.muli %arg59, %c64{{.*}} : index
// CHECK: %[[STAT:.*]] = arith.muli %arg60, %arg19 : index
// CHECK: %[[O:.*]] = tile.load %arg3[%{{.*}}] rows %[[FIRST]] of %arg19 stride %arg32 : memref<?xbf16> -> tensor<64x64xbf16>
// CHECK: %[[DO:.*]] = tile.load %arg4[%{{.*}}] rows %[[FIRST]] of %arg19 stride %arg35 : memref<?xbf16> -> tensor<64x64xbf16>
// CHECK-DAG: %[[OF:.*]] = arith.extf %[[O]] : tensor<64x64xbf16> to tensor<64x64xf32>
// CHECK-DAG: %[[DOF:.*]] = arith.extf %[[DO]] : tensor<64x64xbf16> to tensor<64x64xf32>
// CHECK: %[[PROD:.*]] = arith.mulf %[[DOF]], %[[OF]] : tensor<64x64xf32>
// CHECK: %[[D:.*]] = tile.reduce "sum" %[[PROD]] dim 1 : tensor<64x64xf32> -> tensor<64xf32>
// CHECK: tile.store %[[D]], %arg6[%[[STAT]]] rows %[[FIRST]] of %arg19 : tensor<64xf32>, memref<?xf32>
// CHECK: %[[LSE:.*]] = tile.load %arg5[%[[STAT]]] rows %[[FIRST]] of %arg19 : memref<?xf32> -> tensor<64xf32>
// CHECK: %[[NEG:.*]] = arith.mulf %[[LSE]], %{{.*}} : tensor<64xf32>
// CHECK: %[[EMPTY:.*]] = arith.cmpf oeq, %[[LSE]], %{{.*}} : tensor<64xf32>
// CHECK: %[[NL:.*]] = arith.select %[[EMPTY]], %{{.*}}, %[[NEG]] : tensor<64xi1>, tensor<64xf32>
// CHECK: %[[AT:.*]] = arith.addi %[[BHN]], %[[STAT]] : index
// CHECK: tile.store %[[NL]], %arg6[%[[AT]]] rows %[[FIRST]] of %arg19 : tensor<64xf32>, memref<?xf32>
// CHECK: tile.store %{{.*}}, %arg7[%{{.*}}] rows %[[FIRST]] of %arg19 stride %c96{{.*}} : tensor<64x96xf32>, memref<?xf32>
// CHECK: return

// The main loop: K, V of the program's 32 keys stay in tiles, dK and dV in
// f32 tiles carried over the 2 query heads of the GQA group and the Q
// blocks of the band; P^T is recomputed with one FMA from -lse * log2(e)
// (delta's second half) and exp2, masked only under an scf.if, rounded to
// bf16 for dV and, extended back, for dS; dS rounded for dK and dQ.
// CHECK-LABEL: func.func @causal(
// CHECK-SAME: role = "main"
// CHECK-SAME: block_m = 64, block_n = 32, deterministic = false
// CHECK: %[[K:.*]] = tile.load %arg1[%{{.*}}] rows %[[N0:.*]] of %arg20 stride %arg26 : memref<?xbf16> -> tensor<32x96xbf16>
// CHECK: %[[V:.*]] = tile.load %arg2[%{{.*}}] rows %[[N0]] of %arg20 stride %arg29 : memref<?xbf16> -> tensor<32x64xbf16>
// CHECK: %[[R:.*]]:2 = scf.for %{{.*}} = %{{.*}} to %c2{{.*}} step %{{.*}} iter_args(%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (tensor<32x96xf32>, tensor<32x64xf32>) {
// CHECK: scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[DK:.*]] = %{{.*}}, %[[DV:.*]] = %{{.*}}) -> (tensor<32x96xf32>, tensor<32x64xf32>) {
// CHECK: %[[M0:.*]] = arith.muli %[[T]], %c64{{.*}} : index
// CHECK: %[[Q:.*]] = tile.load %arg0[%{{.*}}] rows %[[M0]] of %arg19 stride %arg23 : memref<?xbf16> -> tensor<64x96xbf16>
// CHECK: %[[DO:.*]] = tile.load %arg4[%{{.*}}] rows %[[M0]] of %arg19 stride %arg35 : memref<?xbf16> -> tensor<64x64xbf16>
// CHECK: %[[NL:.*]] = tile.load %arg6[%{{.*}}] rows %[[M0]] of %arg19 : memref<?xf32> -> tensor<64xf32>
// CHECK: %[[DL:.*]] = tile.load %arg6[%{{.*}}] rows %[[M0]] of %arg19 : memref<?xf32> -> tensor<64xf32>
// CHECK: %[[ST:.*]] = tile.dot %[[K]], %[[Q]] {transpose_rhs} : tensor<32x96xbf16>, tensor<64x96xbf16> -> tensor<32x64xf32>
// CHECK: %[[NLB:.*]] = tile.broadcast %[[NL]] dim 0 : tensor<64xf32> -> tensor<32x64xf32>
// CHECK: %[[SC:.*]] = tile.splat %arg57 : f32 -> tensor<32x64xf32>
// CHECK: %[[FMA:.*]] = math.fma %[[ST]], %[[SC]], %[[NLB]] : tensor<32x64xf32>
// CHECK: %[[PT:.*]] = math.exp2 %[[FMA]] : tensor<32x64xf32>
// CHECK: %[[PM:.*]] = scf.if %{{.*}} -> (tensor<32x64xf32>) {
// CHECK: tile.iota dim 0 : tensor<32x64xi32>
// CHECK: tile.iota dim 1 : tensor<32x64xi32>
// CHECK: arith.select %{{.*}}, %[[PT]], %{{.*}} : tensor<32x64xi1>, tensor<32x64xf32>
// CHECK: } else {
// CHECK-NEXT: scf.yield %[[PT]] : tensor<32x64xf32>
// CHECK: %[[PTH:.*]] = arith.truncf %[[PM]] : tensor<32x64xf32> to tensor<32x64xbf16>
// CHECK: %[[DV2:.*]] = tile.dot %[[PTH]], %[[DO]] acc %[[DV]] : tensor<32x64xf32> : tensor<32x64xbf16>, tensor<64x64xbf16> -> tensor<32x64xf32>
// CHECK: %[[DPT:.*]] = tile.dot %[[V]], %[[DO]] {transpose_rhs} : tensor<32x64xbf16>, tensor<64x64xbf16> -> tensor<32x64xf32>
// CHECK: %[[DLB:.*]] = tile.broadcast %[[DL]] dim 0 : tensor<64xf32> -> tensor<32x64xf32>
// CHECK: %[[DIFF:.*]] = arith.subf %[[DPT]], %[[DLB]] : tensor<32x64xf32>
// CHECK-NOT: arith.extf
// CHECK: %[[DS:.*]] = arith.mulf %[[PM]], %[[DIFF]] : tensor<32x64xf32>
// CHECK: %[[DSH:.*]] = arith.truncf %[[DS]] : tensor<32x64xf32> to tensor<32x64xbf16>
// CHECK: %[[DK2:.*]] = tile.dot %[[DSH]], %[[Q]] acc %[[DK]] : tensor<32x96xf32> : tensor<32x64xbf16>, tensor<64x96xbf16> -> tensor<32x96xf32>
// CHECK: %[[DQ:.*]] = tile.dot %[[DSH]], %[[K]] {transpose_lhs} : tensor<32x64xbf16>, tensor<32x96xbf16> -> tensor<64x96xf32>
// CHECK: tile.atomic_add %[[DQ]], %arg7[%{{.*}}] rows %[[M0]] of %arg19 stride %c96{{.*}} : tensor<64x96xf32>, memref<?xf32>
// CHECK: scf.yield %[[DK2]], %[[DV2]] : tensor<32x96xf32>, tensor<32x64xf32>
// CHECK: %[[DKS:.*]] = arith.mulf %[[R]]#0, %{{.*}} : tensor<32x96xf32>
// CHECK: %[[DKH:.*]] = arith.truncf %[[DKS]] : tensor<32x96xf32> to tensor<32x96xbf16>
// CHECK: tile.store %[[DKH]], %arg9[%{{.*}}] rows %[[N0]] of %arg20 stride %arg41
// CHECK: %[[DVH:.*]] = arith.truncf %[[R]]#1 : tensor<32x64xf32> to tensor<32x64xbf16>
// CHECK: tile.store %[[DVH]], %arg10[%{{.*}}] rows %[[N0]] of %arg20 stride %arg44
// CHECK: return

// The conversion: no KV loop, 64 rows per program, dq = bf16(dq_accum *
// scale).
// CHECK-LABEL: func.func @causal_dq(
// CHECK-SAME: role = "dq_convert"
// CHECK-SAME: deterministic = false
// CHECK-NOT: math.exp2
// CHECK: %[[FIRST:.*]] = arith.muli %arg59, %c64{{.*}} : index
// CHECK: %[[ACC:.*]] = tile.load %arg7[%{{.*}}] rows %[[FIRST]] of %arg19 stride %c96{{.*}} : memref<?xf32> -> tensor<64x96xf32>
// CHECK: %[[SC:.*]] = tile.splat %arg58 : f32 -> tensor<64x96xf32>
// CHECK: %[[SCALED:.*]] = arith.mulf %[[ACC]], %[[SC]] : tensor<64x96xf32>
// CHECK: %[[DQ:.*]] = arith.truncf %[[SCALED]] : tensor<64x96xf32> to tensor<64x96xbf16>
// CHECK: tile.store %[[DQ]], %arg8[%{{.*}}] rows %[[FIRST]] of %arg19 stride %arg38 : tensor<64x96xbf16>, memref<?xbf16>
// CHECK-NEXT: return

// LLVM-DAG: llvm.func @causal_preprocess(
// LLVM-DAG: llvm.func @causal(
// LLVM-DAG: llvm.func @causal_dq(
// LLVM-DAG: llvm.atomicrmw fadd
module {
attn.flash_bwd @causal {element_type = bf16, gqa = 2 : i64, head_dim_qk = 96 : i64, head_dim_v = 64 : i64, mask = "causal", sparse_block = 0 : i64}
}

// -----

// deterministic = true: the preprocessing and the main loop leave dq_accum
// alone; @det_dq is the separate pass (its own tiling, dq-block-m x
// dq-block-n, block-m x block-n by default): a KV loop over the band, the
// same recomputation (S = Q K^T, queries on the rows), dQ += dS K.
// CHECK-LABEL: func.func @det_preprocess(
// CHECK-SAME: role = "preprocess"
// CHECK-SAME: deterministic = true
// CHECK-NOT: %arg7[
// CHECK: return
// CHECK-LABEL: func.func @det(
// CHECK-SAME: role = "main"
// CHECK-SAME: deterministic = true
// CHECK-NOT: tile.atomic_add
// CHECK-NOT: %arg7[
// CHECK: return
// CHECK-LABEL: func.func @det_dq(
// CHECK-SAME: role = "dq"
// CHECK-SAME: block_m = 64, block_n = 32, deterministic = true
// CHECK-NOT: tile.atomic_add
// CHECK: %[[M0:.*]] = arith.muli %arg59, %c64{{.*}} : index
// CHECK: %[[Q:.*]] = tile.load %arg0[%{{.*}}] rows %[[M0]] of %arg19 stride %arg23 : memref<?xbf16> -> tensor<64x96xbf16>
// CHECK: %[[DO:.*]] = tile.load %arg4[%{{.*}}] rows %[[M0]] of %arg19 stride %arg35 : memref<?xbf16> -> tensor<64x64xbf16>
// CHECK: %[[NL:.*]] = tile.load %arg6[%{{.*}}] rows %[[M0]] of %arg19 : memref<?xf32> -> tensor<64xf32>
// CHECK: %[[DL:.*]] = tile.load %arg6[%{{.*}}] rows %[[M0]] of %arg19 : memref<?xf32> -> tensor<64xf32>
// CHECK: %[[R:.*]] = scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (tensor<64x96xf32>) {
// CHECK: %[[N0:.*]] = arith.muli %[[T]], %c32{{.*}} : index
// CHECK: %[[K:.*]] = tile.load %arg1[%{{.*}}] rows %[[N0]] of %arg20 stride %arg26 : memref<?xbf16> -> tensor<32x96xbf16>
// CHECK: %[[V:.*]] = tile.load %arg2[%{{.*}}] rows %[[N0]] of %arg20 stride %arg29 : memref<?xbf16> -> tensor<32x64xbf16>
// CHECK: %[[S:.*]] = tile.dot %[[Q]], %[[K]] {transpose_rhs} : tensor<64x96xbf16>, tensor<32x96xbf16> -> tensor<64x32xf32>
// CHECK: %[[NLB:.*]] = tile.broadcast %[[NL]] dim 1 : tensor<64xf32> -> tensor<64x32xf32>
// CHECK: %[[FMA:.*]] = math.fma %[[S]], %{{.*}}, %[[NLB]] : tensor<64x32xf32>
// CHECK: %[[P:.*]] = math.exp2 %[[FMA]] : tensor<64x32xf32>
// CHECK: %[[PM:.*]] = scf.if %{{.*}} -> (tensor<64x32xf32>) {
// CHECK: tile.iota dim 1 : tensor<64x32xi32>
// CHECK: arith.select %{{.*}}, %[[P]], %{{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
// CHECK: %[[DP:.*]] = tile.dot %[[DO]], %[[V]] {transpose_rhs} : tensor<64x64xbf16>, tensor<32x64xbf16> -> tensor<64x32xf32>
// CHECK: %[[DLB:.*]] = tile.broadcast %[[DL]] dim 1 : tensor<64xf32> -> tensor<64x32xf32>
// CHECK: %[[DIFF:.*]] = arith.subf %[[DP]], %[[DLB]] : tensor<64x32xf32>
// CHECK-NOT: arith.extf
// CHECK: %[[DS:.*]] = arith.mulf %[[PM]], %[[DIFF]] : tensor<64x32xf32>
// CHECK: %[[DSH:.*]] = arith.truncf %[[DS]] : tensor<64x32xf32> to tensor<64x32xbf16>
// CHECK: %[[DQ:.*]] = tile.dot %[[DSH]], %[[K]] acc %[[ACC]] : tensor<64x96xf32> : tensor<64x32xbf16>, tensor<32x96xbf16> -> tensor<64x96xf32>
// CHECK: scf.yield %[[DQ]] : tensor<64x96xf32>
// CHECK: %[[SCALED:.*]] = arith.mulf %[[R]], %{{.*}} : tensor<64x96xf32>
// CHECK: %[[DQH:.*]] = arith.truncf %[[SCALED]] : tensor<64x96xf32> to tensor<64x96xbf16>
// CHECK: tile.store %[[DQH]], %arg8[%{{.*}}] rows %[[M0]] of %arg19 stride %arg38 : tensor<64x96xbf16>, memref<?xbf16>
// CHECK: return

// dq-block-m / dq-block-n tile the separate pass only (32 rows x 16 keys
// here); the main loop keeps block-m x block-n; the conversion of atomic dQ
// is a row kernel and does not use them.
// DQB-LABEL: func.func @causal(
// DQB-SAME: block_m = 64, block_n = 32
// DQB: tile.dot %{{.*}}, %{{.*}} {transpose_rhs} : tensor<32x96xbf16>, tensor<64x96xbf16> -> tensor<32x64xf32>
// DQB-LABEL: func.func @causal_dq(
// DQB-SAME: role = "dq_convert"
// DQB: tile.load %arg7[%{{.*}}] rows %{{.*}} of %arg19 stride %c96{{.*}} : memref<?xf32> -> tensor<64x96xf32>
// DQB-LABEL: func.func @det(
// DQB-SAME: block_m = 64, block_n = 32
// DQB-LABEL: func.func @det_dq(
// DQB-SAME: role = "dq"
// DQB-SAME: block_m = 32, block_n = 16, deterministic = true
// DQB: arith.muli %arg59, %c32{{.*}} : index
// DQB: tile.load %arg0[%{{.*}}] rows {{.*}} : memref<?xbf16> -> tensor<32x96xbf16>
// DQB: scf.for %[[T:.*]] = %{{.*}} iter_args(%{{.*}}) -> (tensor<32x96xf32>) {
// DQB: arith.muli %[[T]], %c16{{.*}} : index
// DQB: tile.load %arg1[%{{.*}}] rows {{.*}} : memref<?xbf16> -> tensor<16x96xbf16>
// DQB: tile.dot %{{.*}}, %{{.*}} {transpose_rhs} : tensor<32x96xbf16>, tensor<16x96xbf16> -> tensor<32x16xf32>
// DQB: tile.dot %{{.*}}, %{{.*}} acc %{{.*}} : tensor<32x96xf32> : tensor<32x16xbf16>, tensor<16x96xbf16> -> tensor<32x96xf32>

// LLVM-LABEL: llvm.func @det(
// LLVM-NOT: llvm.atomicrmw
// LLVM: llvm.return
module {
attn.flash_bwd @det {deterministic = true, element_type = bf16, head_dim_qk = 96 : i64, head_dim_v = 64 : i64, mask = "causal"}
}

// -----

// Block-sparse: the main loop reads the KV-major layout (kv_counts,
// kv_indices), each listed sparse Q block walked in sparse_block / Br = 2
// steps, every listed block (no band: nothing to skip or mask, and a
// deterministic main loop needs no mask for keys past Nkv); the
// deterministic dQ pass reads the forward's layout, sparse_block / Bc = 4
// steps, and masks the keys past Nkv.
// CHECK-LABEL: func.func @sparse(
// CHECK-SAME: memref<?xf16>
// CHECK: memref.load %arg13[%{{.*}}] : memref<?xi32>
// CHECK: scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step
// CHECK: arith.divui %[[T]], %c2{{.*}} : index
// CHECK: memref.load %arg14[%{{.*}}] : memref<?xi32>
// CHECK: arith.remui %[[T]], %c2{{.*}} : index
// CHECK-NOT: scf.if
// CHECK: tile.dot
// CHECK-NOT: scf.if
// CHECK-LABEL: func.func @sparse_dq(
// CHECK: memref.load %arg11[%{{.*}}] : memref<?xi32>
// CHECK: scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step
// CHECK: arith.divui %[[T]], %c4{{.*}} : index
// CHECK: memref.load %arg12[%{{.*}}] : memref<?xi32>
// CHECK: arith.remui %[[T]], %c4{{.*}} : index
// CHECK: scf.if
// BAD: error: 'attn.flash_bwd' op block-m (48) and block-n (32) must divide sparse_block (128)
// BADDQ: error: dq-block-m and dq-block-n must be 0 (block-m, block-n) or in [1, 1024], got 2000 and 0
// BADDQN: error: dq-block-m and dq-block-n must be 0 (block-m, block-n) or in [1, 1024], got 0 and -16
// BADDQSPARSE: error: 'attn.flash_bwd' op dq-block-m (48) and dq-block-n (32) must divide sparse_block (128)
module {
attn.flash_bwd @sparse {element_type = f16, gqa = 1 : i64, head_dim_qk = 32 : i64, head_dim_v = 16 : i64, mask = "none", sparse_block = 128 : i64, deterministic = true}
}
