// RUN: flashjit-opt %s --split-input-file --verify-diagnostics --flashjit-tile-attention="block-m=64 block-n=32" | FileCheck %s

// A softcap score modifier (20 * tanh(s / 20)), inlined on the score tile:
// the raw scores are scaled by scale_log2e * ln 2 first, the region runs on
// the tile before the mask, and the row max and P use log2(e) in place of
// scale_log2e.
// CHECK-LABEL: func.func @softcap(
// CHECK-SAME: %[[SL2E:arg[0-9]+]]: f32, %{{.*}}: index, %{{.*}}: index)
// CHECK: %[[LOG2E:.*]] = arith.constant 1.44269{{.*}} : f32
// CHECK: %[[SCALE:.*]] = arith.mulf %[[SL2E]], %{{.*}} : f32
// CHECK: scf.for
// CHECK: %[[S:.*]] = tile.dot {{.*}} -> tensor<64x32xf32>
// CHECK: %[[SPL:.*]] = tile.splat %[[SCALE]] : f32 -> tensor<64x32xf32>
// CHECK: %[[SS:.*]] = arith.mulf %[[S]], %[[SPL]] : tensor<64x32xf32>
// CHECK: %[[C:.*]] = arith.constant dense<2.000000e+01> : tensor<64x32xf32>
// CHECK: %[[X:.*]] = arith.divf %[[SS]], %[[C]] : tensor<64x32xf32>
// CHECK: %[[T:.*]] = math.tanh %[[X]] : tensor<64x32xf32>
// CHECK: %[[Y:.*]] = arith.mulf %[[T]], %[[C]] : tensor<64x32xf32>
// CHECK: scf.if %{{.*}} -> (tensor<64x32xf32>)
// CHECK: arith.select {{.*}}, %[[Y]], {{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
// CHECK: tile.splat %[[LOG2E]] : f32 -> tensor<64xf32>
// CHECK: tile.reduce "max"
// CHECK: tile.splat %[[LOG2E]] : f32 -> tensor<64x32xf32>
// CHECK-NOT: tile.splat %[[SL2E]]
// CHECK: return
module {
attn.flash_fwd @softcap {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 2.000000e+01 : f32
  %x = arith.divf %s, %c : f32
  %t = math.tanh %x : f32
  %y = arith.mulf %t, %c : f32
  attn.yield %y : f32
}
}

// -----

// expected-error @+2 {{score_mod must take (score: f32, batch: index, head: index, q_idx: index, kv_idx: index), got 2 arguments}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index):
  attn.yield %s : f32
}
}

// -----

// expected-error @+2 {{score_mod must take (score: f32, batch: index, head: index, q_idx: index, kv_idx: index), got 'f16' for score}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f16, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 1.0 : f32
  attn.yield %c : f32
}
}

// -----

// expected-error @+2 {{score_mod may hold only arith and math ops, got 'func.call'}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %y = func.call @f(%s) : (f32) -> f32
  attn.yield %y : f32
}
func.func private @f(f32) -> f32
}

// -----

// expected-error @+2 {{score_mod computes on scalars only, got 'tensor<2xf32>' from 'arith.constant'}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant dense<1.0> : tensor<2xf32>
  attn.yield %s : f32
}
}

// -----

// expected-error @+2 {{score_mod uses q_idx/kv_idx/batch/head: not supported yet}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %d = arith.subi %i, %j : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %y = arith.addf %s, %df : f32
  attn.yield %y : f32
}
}

// -----

// expected-error @+4 {{'attn.yield' op expects parent op 'attn.flash_fwd'}}
module {
func.func @f(%x: f32) -> f32 {
  "scf.execute_region"() ({
    attn.yield %x : f32
  }) : () -> ()
  return %x : f32
}
}
