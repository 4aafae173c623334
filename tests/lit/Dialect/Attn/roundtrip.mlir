// RUN: flashjit-opt %s | FileCheck %s
// RUN: flashjit-opt %s | flashjit-opt | FileCheck %s

// CHECK-LABEL: attn.flash_fwd @dense
// CHECK-SAME: element_type = bf16
// CHECK-SAME: head_dim_qk = 96 : i64
// CHECK-SAME: mask = "causal"
module {
attn.flash_fwd @dense {element_type = bf16, gqa = 1 : i64, head_dim_qk = 96 : i64, head_dim_v = 96 : i64, mask = "causal", sparse_block = 0 : i64}
}

// Defaults: gqa = 1, sparse_block = 0 (dense).
// CHECK-LABEL: attn.flash_fwd @defaults
// CHECK-SAME: head_dim_qk = 33 : i64, head_dim_v = 17 : i64
module {
attn.flash_fwd @defaults {element_type = f16, head_dim_qk = 33 : i64, head_dim_v = 17 : i64, mask = "none"}
}

// CHECK-LABEL: attn.flash_fwd @sparse_gqa_window
// CHECK-SAME: gqa = 4 : i64
// CHECK-SAME: mask = "sliding_window", sparse_block = 64 : i64
module {
attn.flash_fwd @sparse_gqa_window {element_type = bf16, gqa = 4 : i64, head_dim_qk = 512 : i64, head_dim_v = 1 : i64, mask = "sliding_window", sparse_block = 64 : i64}
}

// The backward carries the same fields (and the same defaults).
// CHECK-LABEL: attn.flash_bwd @backward
// CHECK-SAME: element_type = f16, gqa = 2 : i64
// CHECK-SAME: head_dim_qk = 160 : i64, head_dim_v = 128 : i64
// CHECK-SAME: mask = "causal", sparse_block = 64 : i64
// CHECK-LABEL: attn.flash_bwd @backward_defaults
// CHECK-SAME: {element_type = bf16, head_dim_qk = 1 : i64, head_dim_v = 512 : i64, mask = "none"}
// Its own field: deterministic (default false, elided).
// CHECK-LABEL: attn.flash_bwd @backward_deterministic
// CHECK-SAME: {deterministic = true, element_type = bf16
// CHECK-LABEL: attn.flash_bwd @backward_atomic
// CHECK-SAME: {element_type = bf16
module {
attn.flash_bwd @backward {element_type = f16, gqa = 2 : i64, head_dim_qk = 160 : i64, head_dim_v = 128 : i64, mask = "causal", sparse_block = 64 : i64}
attn.flash_bwd @backward_defaults {element_type = bf16, head_dim_qk = 1 : i64, head_dim_v = 512 : i64, mask = "none"}
attn.flash_bwd @backward_deterministic {deterministic = true, element_type = bf16, head_dim_qk = 8 : i64, head_dim_v = 8 : i64, mask = "none"}
attn.flash_bwd @backward_atomic {deterministic = false, element_type = bf16, head_dim_qk = 8 : i64, head_dim_v = 8 : i64, mask = "none"}
}
