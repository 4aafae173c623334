// RUN: flashjit-opt %s --split-input-file --verify-diagnostics --flashjit-tile-attention="block-m=64 block-n=32" | FileCheck %s

// A softcap score modifier (20 * tanh(s / 20)), inlined on the score tile:
// the raw scores are scaled by scale_log2e * ln 2 first, the region runs on
// the tile before the mask, and the row max and P use log2(e) in place of
// scale_log2e. Two multiplies a score are folded away: the scale and the
// region's s / 20 are one product by scale / 20 (foldScaleIntoProduct),
// and the last product with the positive constant 20 is left to the max
// and P (peelPositiveScale): the mask and P take tanh's tile, and their
// factor is 20 log2(e). tanh's tile lies in [-1, 1] and 2 * 20 log2(e) is
// 57.7 <= 120 (bf16's P stays normal down to exp2(-2 f)), so the row max
// is the bound 20 log2(e) itself: no reduction (fixedRowMax).
// CHECK-LABEL: func.func @softcap(
// CHECK-SAME: %[[SL2E:arg[0-9]+]]: f32, %{{.*}}: index, %{{.*}}: index)
// CHECK-SAME: attn.kernel = #attn.kernel<{{.*}}, score_mod = "softcap:20">
// CHECK: %[[LOG2E:.*]] = arith.constant 1.44269{{.*}} : f32
// CHECK: %[[SCALE:.*]] = arith.mulf %[[SL2E]], %{{.*}} : f32
// CHECK: %[[INV:.*]] = arith.constant 5.000000e-02 : f32
// CHECK: %[[SCALE_C:.*]] = arith.mulf %[[SCALE]], %[[INV]] : f32
// CHECK: scf.for
// CHECK: %[[S:.*]] = tile.dot {{.*}} -> tensor<64x32xf32>
// CHECK-NOT: tile.iota
// CHECK-NOT: tile.splat %[[SCALE]] :
// CHECK: %[[SPL:.*]] = tile.splat %[[SCALE_C]] : f32 -> tensor<64x32xf32>
// CHECK: %[[X:.*]] = arith.mulf %[[S]], %[[SPL]] : tensor<64x32xf32>
// CHECK-NOT: arith.divf
// CHECK: %[[T:.*]] = math.tanh %[[X]] : tensor<64x32xf32>
// CHECK-NOT: arith.mulf %[[T]]
// CHECK: %[[FACTOR:.*]] = arith.constant 2.885390e+01 : f32
// CHECK-NOT: arith.mulf %[[T]]
// CHECK: scf.if %{{.*}} -> (tensor<64x32xf32>)
// CHECK: arith.select {{.*}}, %[[T]], {{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
// CHECK-NOT: tile.reduce "max"
// CHECK: %[[BOUND:.*]] = arith.constant dense<2.885390e+01> : tensor<64xf32>
// CHECK: arith.maxnumf %{{.*}}, %[[BOUND]] : tensor<64xf32>
// CHECK-NOT: tile.reduce "max"
// CHECK: tile.splat %[[FACTOR]] : f32 -> tensor<64x32xf32>
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

// Softcap 50 (Gemma 2's): 2 * 50 log2(e) = 144 > 120, so P against a
// fixed bound could leave bf16's normal range: the row max is reduced.
// CHECK-LABEL: func.func @softcap50(
// CHECK: %[[T:.*]] = math.tanh
// CHECK: %[[FACTOR:.*]] = arith.constant 72.1347{{.*}} : f32
// CHECK: tile.splat %[[FACTOR]] : f32 -> tensor<64xf32>
// CHECK: tile.reduce "max"
module {
attn.flash_fwd @softcap50 {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 5.000000e+01 : f32
  %x = arith.divf %s, %c : f32
  %t = math.tanh %x : f32
  %y = arith.mulf %t, %c : f32
  attn.yield %y : f32
}
}

// -----

// A last product with a negative constant stays (max(x * c) is not
// max(x) * c for c < 0): the max and P take the product, by log2(e).
// CHECK-LABEL: func.func @negative(
// CHECK: %[[LOG2E:.*]] = arith.constant 1.44269{{.*}} : f32
// CHECK: %[[C:.*]] = arith.constant dense<-2.000000e+00> : tensor<64x32xf32>
// CHECK-NEXT: %[[T:.*]] = math.tanh
// CHECK-NEXT: %[[Y:.*]] = arith.mulf %[[T]], %[[C]] : tensor<64x32xf32>
// CHECK: scf.if %{{.*}} -> (tensor<64x32xf32>)
// CHECK: arith.select {{.*}}, %[[Y]], {{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
// CHECK: tile.splat %[[LOG2E]] : f32 -> tensor<64xf32>
// CHECK: tile.reduce "max"
module {
attn.flash_fwd @negative {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant -2.000000e+00 : f32
  %t = math.tanh %s : f32
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

// ALiBi with 4 heads (--score-mod alibi:4), causal, GQA 2: the index
// arguments become i32 tiles of the score tile's shape, built as the mask
// builds its columns: head = splat of the query head (pid_bh % heads, not
// the KV head), q_idx = m0 + iota dim 0, kv_idx = n0 + iota dim 1. An index
// constant is an i32 splat, index_cast to i32 is no op on the tiles, and the
// region runs before the mask's select; the scaling of the scores and the
// region's s + bias are one math.fma. The bias slope (j - i) is split
// (peelUniformAddend) into slope (c - r) for element (r, c), a tile built
// once before the KV loop, and slope (n0 - m0), one value a block on the
// row shape, which the softmax adds to the row max and to each row's
// exponent offset: no score pays for the block's position.
// CHECK-LABEL: func.func @alibi(
// CHECK-SAME: %{{.*}}: f32, %[[PIDM:arg[0-9]+]]: index, %[[PIDBH:arg[0-9]+]]: index)
// CHECK-SAME: attn.kernel = #attn.kernel<{{.*}}, score_mod = "alibi:4">
// CHECK: %[[HQ:.*]] = arith.remui %[[PIDBH]], %{{.*}} : index
// CHECK: %[[M0:.*]] = arith.muli %[[PIDM]], %{{.*}} : index
// CHECK: %[[COLS:.*]] = tile.iota dim 1 : tensor<64x32xi32>
// CHECK: %[[ROWS:.*]] = tile.iota dim 0 : tensor<64x32xi32>
// CHECK: %[[D:.*]] = arith.subi %[[COLS]], %[[ROWS]] : tensor<64x32xi32>
// CHECK: %[[DF:.*]] = arith.sitofp %[[D]] : tensor<64x32xi32> to tensor<64x32xf32>
// CHECK: %[[HI:.*]] = arith.index_cast %[[HQ]] : index to i32
// CHECK: %[[HT:.*]] = tile.splat %[[HI]] : i32 -> tensor<64x32xi32>
// CHECK: %[[ONE:.*]] = arith.constant dense<1> : tensor<64x32xi32>
// CHECK: %[[H1:.*]] = arith.addi %[[HT]], %[[ONE]] : tensor<64x32xi32>
// CHECK: %[[HF:.*]] = arith.sitofp %[[H1]] : tensor<64x32xi32> to tensor<64x32xf32>
// CHECK: %[[N8:.*]] = arith.constant dense<-8.000000e+00> : tensor<64x32xf32>
// CHECK: %[[HC:.*]] = arith.constant dense<4.000000e+00> : tensor<64x32xf32>
// CHECK: %[[K:.*]] = arith.divf %[[N8]], %[[HC]] : tensor<64x32xf32>
// CHECK: %[[E:.*]] = arith.mulf %[[HF]], %[[K]] : tensor<64x32xf32>
// CHECK: %[[SLOPE:.*]] = math.exp2 %[[E]] : tensor<64x32xf32>
// CHECK: %[[BIAS:.*]] = arith.mulf %[[DF]], %[[SLOPE]] : tensor<64x32xf32>
// The slope again on the row shape, and m0 there, for slope (n0 - m0):
// CHECK: %[[M0I:.*]] = arith.index_cast %[[M0]] : index to i32
// CHECK: %[[M0R:.*]] = tile.splat %[[M0I]] : i32 -> tensor<64xi32>
// CHECK: %[[SLOPER:.*]] = math.exp2 %{{.*}} : tensor<64xf32>
// CHECK: scf.for %[[T:.*]] = %{{.*}} to
// CHECK: %[[N0:.*]] = arith.muli %[[T]], %{{.*}} : index
// CHECK: %[[S:.*]] = tile.dot {{.*}} -> tensor<64x32xf32>
// CHECK: %[[SPL:.*]] = tile.splat %{{.*}} : f32 -> tensor<64x32xf32>
// CHECK-NOT: arith.mulf %[[S]]
// CHECK: %[[N0I:.*]] = arith.index_cast %[[N0]] : index to i32
// CHECK: %[[N0R:.*]] = tile.splat %[[N0I]] : i32 -> tensor<64xi32>
// CHECK: %[[DU:.*]] = arith.subi %[[N0R]], %[[M0R]] : tensor<64xi32>
// CHECK: %[[DUF:.*]] = arith.sitofp %[[DU]] : tensor<64xi32> to tensor<64xf32>
// CHECK: %[[U:.*]] = arith.mulf %[[DUF]], %[[SLOPER]] : tensor<64xf32>
// The scaling and the region's sum are one fma (foldScaleIntoSum), on the
// tile from before the loop.
// CHECK-NOT: arith.addf
// CHECK: %[[Y:.*]] = math.fma %[[S]], %[[SPL]], %[[BIAS]] : tensor<64x32xf32>
// CHECK: scf.if %{{.*}} -> (tensor<64x32xf32>)
// CHECK: arith.select {{.*}}, %[[Y]], {{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
// CHECK: %[[MAX:.*]] = tile.reduce "max"
// CHECK: arith.addf %[[MAX]], %[[U]] : tensor<64xf32>
// CHECK: math.fma %[[U]], %{{.*}}, %{{.*}} : tensor<64xf32>
// CHECK: return
module {
attn.flash_fwd @alibi {element_type = bf16, gqa = 2 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "causal", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %H = arith.constant 4.000000e+00 : f32
  %n8 = arith.constant -8.000000e+00 : f32
  %k = arith.divf %n8, %H : f32
  %one = arith.constant 1 : index
  %h1 = arith.addi %h, %one : index
  %hi = arith.index_cast %h1 : index to i32
  %hf = arith.sitofp %hi : i32 to f32
  %e = arith.mulf %hf, %k : f32
  %slope = math.exp2 %e : f32
  %d = arith.subi %j, %i : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %bias = arith.mulf %slope, %df : f32
  %y = arith.addf %s, %bias : f32
  attn.yield %y : f32
}
}

// -----

// A distance bias -|j - i| / 4: its |.| is no additive structure, so the
// bias stays in the KV loop (peelUniformAddend leaves it) and the softmax
// adds nothing to the row max.
// CHECK-LABEL: func.func @distance(
// CHECK: scf.for
// CHECK: %[[S:.*]] = tile.dot
// CHECK: %[[D:.*]] = arith.subi %{{.*}}, %{{.*}} : tensor<64x32xi32>
// CHECK: %[[A:.*]] = math.absf %{{.*}} : tensor<64x32xf32>
// CHECK: %[[B:.*]] = arith.mulf %[[A]], %{{.*}} : tensor<64x32xf32>
// CHECK: math.fma %[[S]], %{{.*}}, %[[B]] : tensor<64x32xf32>
// CHECK: %[[MAX:.*]] = tile.reduce "max"
// CHECK-NOT: arith.addf %[[MAX]]
// CHECK: return
module {
attn.flash_fwd @distance {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %d = arith.subi %j, %i : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %a = math.absf %df : f32
  %c = arith.constant -2.500000e-01 : f32
  %bias = arith.mulf %a, %c : f32
  %y = arith.addf %s, %bias : f32
  attn.yield %y : f32
}
}

// -----

// A region that is no named variant (#attn.kernel says "custom"), on the
// batch index: the batch is a splat of pid_bh / heads, an index_cast to i64
// sign-extends the i32 tile, and no position tile is built (q_idx, kv_idx
// unused; no band).
// CHECK-LABEL: func.func @custom(
// CHECK-SAME: %{{.*}}: f32, %{{.*}}: index, %[[PIDBH:arg[0-9]+]]: index)
// CHECK-SAME: attn.kernel = #attn.kernel<{{.*}}, score_mod = "custom">
// CHECK: %[[B:.*]] = arith.divui %[[PIDBH]], %{{.*}} : index
// CHECK: %[[S:.*]] = tile.dot
// CHECK: %[[SPL:.*]] = tile.splat %{{.*}} : f32 -> tensor<64x32xf32>
// CHECK-NOT: tile.iota dim 0
// CHECK: %[[BI:.*]] = arith.index_cast %[[B]] : index to i32
// CHECK: %[[BT:.*]] = tile.splat %[[BI]] : i32 -> tensor<64x32xi32>
// CHECK: %[[C3:.*]] = arith.constant dense<3> : tensor<64x32xi32>
// CHECK: %[[X:.*]] = arith.muli %[[BT]], %[[C3]] : tensor<64x32xi32>
// CHECK: %[[XL:.*]] = arith.extsi %[[X]] : tensor<64x32xi32> to tensor<64x32xi64>
// CHECK: %[[XF:.*]] = arith.sitofp %[[XL]] : tensor<64x32xi64> to tensor<64x32xf32>
// CHECK: %[[Y:.*]] = math.fma %[[S]], %[[SPL]], %[[XF]] : tensor<64x32xf32>
// CHECK-NOT: tile.iota dim 0
// CHECK: return
module {
attn.flash_fwd @custom {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c3 = arith.constant 3 : index
  %x = arith.muli %b, %c3 : index
  %xl = arith.index_cast %x : index to i64
  %xf = arith.sitofp %xl : i64 to f32
  %y = arith.addf %s, %xf : f32
  attn.yield %y : f32
}
}

// -----

// expected-error @+2 {{score_mod: the index constant 4294967296 does not fit in i32 (index values are i32 on tiles)}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 4294967296 : index
  %d = arith.addi %i, %c : index
  %di = arith.index_cast %d : index to i32
  %df = arith.sitofp %di : i32 to f32
  %y = arith.addf %s, %df : f32
  attn.yield %y : f32
}
}

// -----

// expected-error @+4 {{'attn.yield' op expects parent op to be one of 'attn.flash_fwd, attn.flash_bwd'}}
module {
func.func @f(%x: f32) -> f32 {
  "scf.execute_region"() ({
    attn.yield %x : f32
  }) : () -> ()
  return %x : f32
}
}
