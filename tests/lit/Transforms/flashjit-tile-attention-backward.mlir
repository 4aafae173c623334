// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=64 block-n=32" | FileCheck %s
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention-backward="block-m=48 block-n=32" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: flashjit-opt %s --split-input-file --pass-pipeline='builtin.module(flashjit-cpu-pipeline{block-m=64 block-n=32})' | FileCheck %s --check-prefix=LLVM

// Three functions with one argument list: the preprocessing (delta), the
// main loop (one program per KV block: dK, dV) and dQ. Atomic dQ (the
// default, deterministic = false): the preprocessing zeroes dq_accum
// (%arg7), the main loop adds dS K into it atomically, @causal_dq converts.
// CHECK-LABEL: func.func @causal_preprocess(
// CHECK-SAME: %{{.*}}: memref<?xbf16>
// CHECK-SAME: "lse", "delta", "dq_accum", "dq", "dk", "dv", "counts", "indices", "kv_counts", "kv_indices"
// CHECK-SAME: "scale_log2e", "scale", "pid_m", "pid_bh"]
// CHECK-SAME: attn.kernel = #attn.kernel<role = "preprocess"
// CHECK-SAME: block_m = 64, block_n = 32, deterministic = false>
// CHECK: scf.for
// CHECK: iter_args
// CHECK: arith.mulf
// CHECK: memref.store %{{.*}}, %arg6[%{{.*}}] : memref<?xf32>
// CHECK: scf.for %{{.*}} = %{{.*}} to %c96
// CHECK: memref.store %cst, %arg7[%{{.*}}] : memref<?xf32>
// CHECK: return

// The main loop: K, V of the program's 32 keys and the dK, dV accumulators
// stay in f32 tiles; it walks the 2 query heads of the GQA group, then the
// Q blocks of the band; P is recomputed with exp2 from lse * log2(e); the
// element mask only under an scf.if; P and dS rounded for the matmuls.
// CHECK-LABEL: func.func @causal(
// CHECK-SAME: role = "main"
// CHECK-SAME: deterministic = false
// CHECK-DAG: memref.alloca() : memref<32x96xf32>
// CHECK-DAG: memref.alloca() : memref<32x64xf32>
// CHECK-DAG: memref.alloca() : memref<64x32xf32>
// CHECK-DAG: memref.alloca() : memref<64x96xf32>
// CHECK: scf.for %[[G:.*]] = %{{.*}} to %c2{{.*}} step
// CHECK: scf.for %[[QB:.*]] = %{{.*}} to %{{.*}} step
// CHECK: arith.muli %[[QB]], %c64{{.*}} : index
// CHECK: memref.load %arg5[%{{.*}}] : memref<?xf32>
// CHECK: arith.cmpf ogt
// CHECK: arith.mulf
// CHECK: memref.load %arg6[%{{.*}}] : memref<?xf32>
// CHECK: math.exp2
// CHECK: scf.if
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: memref.atomic_rmw addf %{{.*}}, %arg7[%{{.*}}] : (f32, memref<?xf32>) -> f32
// CHECK: return

// The conversion: no KV loop, dq = bf16(dq_accum * scale).
// CHECK-LABEL: func.func @causal_dq(
// CHECK-SAME: role = "dq_convert"
// CHECK-SAME: deterministic = false
// CHECK-NOT: math.exp2
// CHECK: %[[ACC:.*]] = memref.load %arg7[%{{.*}}] : memref<?xf32>
// CHECK: %[[SCALED:.*]] = arith.mulf %[[ACC]], %arg56 : f32
// CHECK: %[[DQ:.*]] = arith.truncf %[[SCALED]] : f32 to bf16
// CHECK: memref.store %[[DQ]], %arg8[%{{.*}}] : memref<?xbf16>
// CHECK-NEXT: }
// CHECK-NEXT: }
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
// alone; @det_dq is the separate pass: a KV loop over the band, the same
// recomputation, dQ += dS K.
// CHECK-LABEL: func.func @det_preprocess(
// CHECK-SAME: role = "preprocess"
// CHECK-SAME: deterministic = true
// CHECK-NOT: %arg7[
// CHECK: return
// CHECK-LABEL: func.func @det(
// CHECK-SAME: role = "main"
// CHECK-SAME: deterministic = true
// CHECK-NOT: memref.atomic_rmw
// CHECK-NOT: %arg7[
// CHECK: return
// CHECK-LABEL: func.func @det_dq(
// CHECK-SAME: role = "dq"
// CHECK-SAME: deterministic = true
// CHECK: scf.for %[[KB:.*]] = %{{.*}} to %{{.*}} step
// CHECK: arith.muli %[[KB]], %c32{{.*}} : index
// CHECK: math.exp2
// CHECK: scf.if
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: return
// LLVM-LABEL: llvm.func @det(
// LLVM-NOT: llvm.atomicrmw
// LLVM: llvm.return
module {
attn.flash_bwd @det {deterministic = true, element_type = bf16, head_dim_qk = 96 : i64, head_dim_v = 64 : i64, mask = "causal"}
}

// -----

// Block-sparse: the main loop reads the KV-major layout (kv_counts,
// kv_indices), each listed sparse Q block walked in sparse_block / Br = 2
// steps; the deterministic dQ pass reads the forward's layout,
// sparse_block / Bc = 4 steps.
// CHECK-LABEL: func.func @sparse(
// CHECK-SAME: memref<?xf16>
// CHECK: memref.load %arg13[%{{.*}}] : memref<?xi32>
// CHECK: scf.for
// CHECK: memref.load %arg14[%{{.*}}] : memref<?xi32>
// CHECK: scf.for %{{.*}} = %{{.*}} to %c2{{.*}} step
// CHECK: scf.if
// CHECK-LABEL: func.func @sparse_dq(
// CHECK: memref.load %arg11[%{{.*}}] : memref<?xi32>
// CHECK: scf.for
// CHECK: memref.load %arg12[%{{.*}}] : memref<?xi32>
// CHECK: scf.for %{{.*}} = %{{.*}} to %c4{{.*}} step
// CHECK: scf.if
// BAD: error: 'attn.flash_bwd' op block-m (48) and block-n (32) must divide sparse_block (128)
module {
attn.flash_bwd @sparse {element_type = f16, gqa = 1 : i64, head_dim_qk = 32 : i64, head_dim_v = 16 : i64, mask = "none", sparse_block = 128 : i64, deterministic = true}
}
