// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=32 block-n=32" --flashjit-tile-attention-backward="block-m=32 block-n=32" --canonicalize --cse | FileCheck %s
// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=32 block-n=32" --flashjit-tile-attention-backward="block-m=32 block-n=32" | flashjit-opt --flashjit-tile-to-cpu-pipeline | FileCheck %s --check-prefix=CPU

// Variable-length packing: the program's batch index b (pid_bh / heads)
// picks its sequence from the offsets cu_seqlens_q (%arg7) and
// cu_seqlens_kv (%arg8): its first rows cu[b] and lengths cu[b + 1] - cu[b]
// replace b * stride_b in every base (start * q_sn + h * q_sh) and seq_q /
// seq_kv in every row bound, so masks see positions within the sequence;
// lse keeps its padded rows (pid_bh * seq_q). A program past its
// sequence's rows visits no KV block.
// CHECK-LABEL: func.func @attention(
// CHECK-SAME: %arg7: memref<?xi32>, %arg8: memref<?xi32>
// CHECK-SAME: attn.arg_names = ["q", "k", "v", "o", "lse", "counts", "indices", "cu_seqlens_q", "cu_seqlens_kv", "batch"
// CHECK: %[[B:.*]] = arith.divui %arg34, %arg10 : index
// CHECK: %[[SQ:.*]] = memref.load %arg7[%[[B]]] : memref<?xi32>
// CHECK: %[[STARTQ:.*]] = arith.index_cast %[[SQ]] : i32 to index
// CHECK: %[[B1:.*]] = arith.addi %[[B]], %c1 : index
// CHECK: %[[EQ:.*]] = memref.load %arg7[%[[B1]]] : memref<?xi32>
// CHECK: %[[ENDQ:.*]] = arith.index_cast %[[EQ]] : i32 to index
// CHECK: %[[NQ:.*]] = arith.subi %[[ENDQ]], %[[STARTQ]] : index
// CHECK: memref.load %arg8[%[[B]]] : memref<?xi32>
// CHECK: memref.load %arg8[%[[B1]]] : memref<?xi32>
// CHECK: %[[NKV:.*]] = arith.subi
// CHECK: %[[M0:.*]] = arith.muli %arg33, %c32 : index
// CHECK: %[[QS:.*]] = arith.muli %[[STARTQ]], %arg15 : index
// CHECK: %[[QH:.*]] = arith.muli %{{.*}}, %arg14 : index
// CHECK: %[[QOFF:.*]] = arith.addi %[[QS]], %[[QH]] : index
// CHECK: %[[LSE:.*]] = arith.muli %arg34, %arg11 : index
// CHECK: tile.load %arg0[%[[QOFF]]] rows %[[M0]] of %[[NQ]] stride %arg15 : memref<?xbf16> -> tensor<32x64xbf16>
// CHECK: %[[INSIDE:.*]] = arith.cmpi slt, %[[M0]], %[[NQ]] : index
// CHECK: %[[HI:.*]] = arith.select %[[INSIDE]], %{{.*}}, %[[LO:.*]] : index
// CHECK: scf.for %{{.*}} = %[[LO]] to %[[HI]] step %c1
// CHECK: tile.load %arg1[%{{.*}}] rows %{{.*}} of %[[NKV]] stride %arg18
// CHECK: tile.store %{{.*}}, %arg3[%{{.*}}] rows %[[M0]] of %[[NQ]] stride %arg24
// CHECK: tile.store %{{.*}}, %arg4[%[[LSE]]] rows %[[M0]] of %[[NQ]] : tensor<32xf32>
// The CPU mode compiles the same programs (the offsets are i32 loads).
// CPU-LABEL: llvm.func @attention(
// CPU: llvm.load %{{.*}} : !llvm.ptr -> i32
module {
  attn.flash_fwd @attention {element_type = bf16, gqa = 2 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "causal", sparse_block = 0 : i64, varlen = true}
}

// -----

// The backward's three functions take the offsets after the KV-major
// layout (%arg15, %arg16): the dK/dV program reads its keys from its
// sequence's first row (cu_seqlens_kv[b] * k_sn) and skips a KV block past
// the sequence; delta and dq_accum keep their padded rows.
// CHECK-LABEL: func.func @attention_preprocess(
// CHECK-SAME: %arg15: memref<?xi32>, %arg16: memref<?xi32>
// CHECK: memref.load %arg15
// CHECK-NOT: memref.load %arg16
// CHECK-LABEL: func.func @attention(
// CHECK: memref.load %arg15
// CHECK: %[[KS:.*]] = memref.load %arg16[%[[B:.*]]] : memref<?xi32>
// CHECK: %[[START:.*]] = arith.index_cast %[[KS]] : i32 to index
// CHECK: %[[N0:.*]] = arith.muli %arg59, %c32 : index
// CHECK: %[[KOFF:.*]] = arith.muli %[[START]], %arg26 : index
// CHECK: tile.load %arg1[%{{.*}}] rows %[[N0]] of %{{.*}} stride %arg26
// CHECK: arith.cmpi slt, %[[N0]], %{{.*}} : index
// CHECK: tile.store %{{.*}}, %arg9[%{{.*}}] rows %[[N0]] of
// CHECK-LABEL: func.func @attention_dq(
// CHECK: memref.load %arg15
module {
  attn.flash_bwd @attention {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64, varlen = true}
}
