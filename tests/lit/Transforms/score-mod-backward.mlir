// RUN: flashjit-opt %s --split-input-file --verify-diagnostics --flashjit-tile-attention-backward="block-m=64 block-n=32" | FileCheck %s

// The backward of a softcap (20 * tanh(s / 20)): the dK/dV loop scales
// S^T = K Q^T, runs the region on it to recompute P (its exponent in
// log2(e) units), and derives d(score')/d(score) beside each op of the
// region by the chain rule: 1 / 20 for the division, 1 - t^2 for the tanh,
// 20 for the product. Then the constant factors fold (FoldConstantFactors):
// scale and 1 / 20 are one factor computed once (%[[F]] = scale * 0.05),
// the derivative's 1 / 20 * 20 is gone (1 - t^2 as one fma), and the 20
// of the product joins log2(e) in the exponent's fma (28.85 = 20 log2 e).
// dS = P (dP - D) takes the factor through P, right after P is rounded
// for dV (one tile live across the dV and dP products, not two). Every
// function records the modifier.
// CHECK-LABEL: func.func @softcap_preprocess(
// CHECK-SAME: score_mod = "softcap:20"
// CHECK-LABEL: func.func @softcap(
// CHECK-SAME: %[[SCALE:arg[0-9]+]]: f32, %arg{{[0-9]+}}: index, %arg{{[0-9]+}}: index)
// CHECK-SAME: role = "main"{{.*}}score_mod = "softcap:20"
// CHECK: %[[F:.*]] = arith.mulf %[[SCALE]], %{{.*}} : f32
// CHECK: scf.for
// CHECK: %[[ST:.*]] = tile.dot %{{.*}}, %{{.*}} {transpose_rhs} : {{.*}} -> tensor<32x64xf32>
// CHECK: %[[SPL:.*]] = tile.splat %[[F]] : f32 -> tensor<32x64xf32>
// CHECK: %[[X:.*]] = arith.mulf %[[ST]], %[[SPL]] : tensor<32x64xf32>
// CHECK-NOT: arith.divf
// CHECK: %[[T:.*]] = math.tanh %[[X]] : tensor<32x64xf32>
// CHECK: %[[NT:.*]] = arith.negf %[[T]] : tensor<32x64xf32>
// CHECK: %[[DY:.*]] = math.fma %[[NT]], %[[T]], %{{.*}} : tensor<32x64xf32>
// CHECK: %[[E:.*]] = math.fma %[[T]], %[[C2:.*]], %{{.*}} : tensor<32x64xf32>
// CHECK: math.exp2 %[[E]]
// CHECK: arith.truncf %[[P:.*]] : tensor<32x64xf32> to tensor<32x64xbf16>
// CHECK-NEXT: %[[PD:.*]] = arith.mulf %[[P]], %[[DY]] : tensor<32x64xf32>
// CHECK: tile.dot
// CHECK: %[[DPD:.*]] = arith.subf
// CHECK: %[[DS:.*]] = arith.mulf %[[PD]], %[[DPD]] : tensor<32x64xf32>
// CHECK: arith.truncf %[[DS]] : tensor<32x64xf32> to tensor<32x64xbf16>
// CHECK-LABEL: func.func @softcap_dq(
// CHECK-SAME: score_mod = "softcap:20"
module {
attn.flash_bwd @softcap {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 2.000000e+01 : f32
  %x = arith.divf %s, %c : f32
  %t = math.tanh %x : f32
  %y = arith.mulf %t, %c : f32
  attn.yield %y : f32
}
}

// -----

// In the dK/dV loop the keys are the rows: a region's kv_idx is n0 + iota
// dim 0 and q_idx the Q block's first row + iota dim 1. A bias that does
// not depend on the score has derivative 1 (s + bias), a constant tile.
// CHECK-LABEL: func.func @bias(
// CHECK: scf.for
// CHECK: tile.dot %{{.*}}, %{{.*}} {transpose_rhs} : {{.*}} -> tensor<32x64xf32>
// CHECK-DAG: tile.iota dim 0 : tensor<32x64xi32>
// CHECK-DAG: tile.iota dim 1 : tensor<32x64xi32>
// CHECK: arith.subi
// CHECK: arith.sitofp
// CHECK: math.exp2
module {
attn.flash_bwd @bias {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %d = arith.subi %j, %i : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %y = arith.addf %s, %df : f32
  attn.yield %y : f32
}
}

// -----

// An op the backward cannot differentiate (floor of the score) is a named
// error on the description.
// expected-error @+2 {{score_mod: the backward cannot differentiate 'math.floor' with respect to the score}}
module {
attn.flash_bwd @floor {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %y = math.floor %s : f32
  attn.yield %y : f32
}
}

// -----

// A floor of something that does not depend on the score is a constant:
// nothing to differentiate.
// CHECK-LABEL: func.func @floor_bias(
module {
attn.flash_bwd @floor_bias {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %hi = arith.index_cast %h : index to i32
  %hf = arith.sitofp %hi : i32 to f32
  %f = math.floor %hf : f32
  %y = arith.addf %s, %f : f32
  attn.yield %y : f32
}
}
