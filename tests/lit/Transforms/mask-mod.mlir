// RUN: flashjit-opt %s --split-input-file --verify-diagnostics --flashjit-tile-attention="block-m=64 block-n=32" | FileCheck %s

// A mask_mod region (a document mask over captured segment ids), inlined
// on the score tile after the raw scores: its loads are gathers at the
// query and key index tiles, its i1 result selects -inf. Without a
// score_mod the scores stay raw (scale_log2e in the exponent). The
// captured tensor is the function's last argument.
// CHECK-LABEL: func.func @document(
// CHECK-SAME: %[[SL2E:arg[0-9]+]]: f32, %{{.*}}: index, %{{.*}}: index, %[[SEG:arg[0-9]+]]: memref<?xf32>)
// CHECK-SAME: attn.kernel = #attn.kernel<{{.*}}, mask_mod = "custom">
// CHECK: scf.for
// CHECK: %[[S:.*]] = tile.dot {{.*}} -> tensor<64x32xf32>
// CHECK: %[[SI:.*]] = tile.gather %[[SEG]][%{{.*}}] : memref<?xf32>, tensor<64x32xi32> -> tensor<64x32xf32>
// CHECK: %[[SJ:.*]] = tile.gather %[[SEG]][%{{.*}}] : memref<?xf32>, tensor<64x32xi32> -> tensor<64x32xf32>
// CHECK: %[[K:.*]] = arith.cmpf oeq, %[[SI]], %[[SJ]] : tensor<64x32xf32>
// CHECK: %[[M:.*]] = arith.select %[[K]], %[[S]], %{{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
// CHECK: tile.reduce "max"
// CHECK: tile.splat %[[SL2E]] : f32 -> tensor<64x32xf32>
// CHECK: return
module {
attn.flash_fwd @document {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  attn.yield %same : i1
}
}

// -----

// With both: the score_mod first (on the scaled scores: its sum with the
// gathered value is one fma with the scaling), then the mask on its
// result; score_mod's captured tensor comes before mask_mod's.
// CHECK-LABEL: func.func @both(
// CHECK-SAME: %[[SLOPES:arg[0-9]+]]: memref<?xf32>, %[[SEG2:arg[0-9]+]]: memref<?xf32>)
// CHECK: %[[X:.*]] = tile.gather %[[SLOPES]]
// CHECK: %[[Y:.*]] = math.fma %{{.*}}, %{{.*}}, %[[X]] : tensor<64x32xf32>
// CHECK: tile.gather %[[SEG2]]
// CHECK: arith.select %{{.*}}, %[[Y]], %{{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
module {
attn.flash_fwd @both {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "causal", sparse_block = 0 : i64} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index, %t: memref<?xf32>):
  %x = memref.load %t[%h] : memref<?xf32>
  %y = arith.addf %s, %x : f32
  attn.yield %y : f32
} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  attn.yield %same : i1
}
}

// -----

// expected-error @+2 {{mask_mod must yield an i1 (keep the score), got 'f32'}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index):
  %c = arith.constant 1.0 : f32
  attn.yield %c : f32
}
}

// -----

// expected-error @+2 {{mask_mod must take (batch: index, head: index, q_idx: index, kv_idx: index), got 3 arguments}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} mask_mod {
^bb0(%b: index, %h: index, %i: index):
  %c = arith.constant true
  attn.yield %c : i1
}
}

// -----

// expected-error @+2 {{mask_mod may hold only arith and math ops, got 'memref.alloc'}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index):
  %m = memref.alloc() : memref<4xf32>
  %c = arith.constant true
  attn.yield %c : i1
}
}

// -----

// A score_mod must not yield a predicate either.
// expected-error @+2 {{score_mod must yield an f32 (the new score), got 'i1'}}
module {
attn.flash_fwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none"} score_mod {
^bb0(%s: f32, %b: index, %h: index, %i: index, %j: index):
  %c = arith.constant true
  attn.yield %c : i1
}
}

// -----

// A mask's captured tensors take no gradient.
// expected-error @+2 {{capture_grads 1 names captured tensors past score_mod's 0 (a mask_mod's captured tensors take no gradient)}}
module {
attn.flash_bwd @a {element_type = bf16, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", capture_grads = 1 : i64} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  attn.yield %same : i1
}
}

// -----

// With a block-sparse layout, a listed entry ~k (< 0) marks block k full:
// the block's start decodes the entry (e ^ (e >> 31)) and the mask_mod runs
// only where the entry is >= 0 (scf.if around its select). A mask that
// reads captured tensors is not bounded: the layout alone decides.
// CHECK-LABEL: func.func @sparse(
// CHECK: scf.for
// CHECK: %[[E:.*]] = memref.load %{{.*}} : memref<?xi32>
// CHECK: %[[SIGN:.*]] = arith.shrsi %[[E]], %{{.*}} : i32
// CHECK: arith.xori %[[E]], %[[SIGN]] : i32
// CHECK: %[[E2:.*]] = memref.load %{{.*}} : memref<?xi32>
// CHECK: %[[FULL:.*]] = arith.cmpi slt, %[[E2]], %{{.*}} : i32
// CHECK: %[[PARTIAL:.*]] = arith.xori %[[FULL]], %{{.*}} : i1
// CHECK: scf.if %[[PARTIAL]] -> (tensor<64x32xf32>)
// CHECK: tile.gather
// CHECK: arith.select %{{.*}} : tensor<64x32xi1>, tensor<64x32xf32>
//
// Beside it, the layout's classification (TileAttentionBlocks.cpp): the
// class of 4 KV blocks of one Q block per program (the keys 64 at a time,
// the mask on positions clamped into the problem, any / all per row),
// stored at the blocks' places in the list; then the lists compacted in
// place, 4 Q blocks per program: each kept block at its row's running
// count (~kb when full), and the counts.
// CHECK-LABEL: func.func @sparse_blocks(
// CHECK-SAME: role = "mask_blocks"
// CHECK: scf.for %{{.*}} iter_args(%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (tensor<4x64xf32>, tensor<4x64xf32>)
// CHECK: arith.minsi %{{.*}} : tensor<4x64xi32>
// CHECK: tile.gather %{{.*}} : memref<?xf32>, tensor<4x64xi32> -> tensor<4x64xf32>
// CHECK: arith.maxnumf %{{.*}} : tensor<4x64xf32>
// CHECK: tile.reduce "max" %{{.*}} dim 1 : tensor<4x64xf32> -> tensor<4xf32>
// CHECK: tile.reduce "max" %{{.*}} dim 1 : tensor<4x64xf32> -> tensor<4xf32>
// CHECK: tile.store %{{.*}}, %{{.*}}[%{{.*}}] rows %{{.*}} of %{{.*}} : tensor<4xi32>, memref<?xi32>
// CHECK-LABEL: func.func @sparse_blocks_list(
// CHECK-SAME: role = "mask_blocks_list"
// CHECK: %[[CNT:.*]] = scf.for %{{.*}} iter_args(%{{.*}} = %{{.*}}) -> (tensor<4xi32>)
// CHECK: tile.gather %{{.*}} : memref<?xi32>, tensor<4xi32> -> tensor<4xi32>
// CHECK: arith.xori %{{.*}}, %{{.*}} : tensor<4xi32>
// CHECK: tile.scatter %{{.*}}, %{{.*}}[%{{.*}}] if %{{.*}} : tensor<4xi32>, memref<?xi32>, tensor<4xi32>, tensor<4xi1>
// CHECK: tile.store %[[CNT]], %{{.*}}[%{{.*}}] rows %{{.*}} of %{{.*}} : tensor<4xi32>, memref<?xi32>
module {
attn.flash_fwd @sparse {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 64 : i64} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index, %seg: memref<?xf32>):
  %si = memref.load %seg[%i] : memref<?xf32>
  %sj = memref.load %seg[%j] : memref<?xf32>
  %same = arith.cmpf oeq, %si, %sj : f32
  attn.yield %same : i1
}
}

// -----

// A mask of positions only is bounded on each block pair
// (MaskModBounds.cpp): j <= i holds for the whole block where its last key
// is at most its first query, so the mask runs only where not n0 + Bc - 1
// <= m0, with no layout.
// CHECK-LABEL: func.func @bounded(
// CHECK: scf.for
// CHECK: %[[N0:.*]] = arith.muli %{{.*}}, %{{.*}} : index
// CHECK: %[[LAST:.*]] = arith.addi %[[N0]], %{{.*}} : index
// CHECK: %[[FULL:.*]] = arith.cmpi sle, %[[LAST]], %{{.*}} : index
// CHECK: %[[PART:.*]] = arith.xori %[[FULL]], %{{.*}} : i1
// CHECK: scf.if %[[PART]] -> (tensor<64x32xf32>)
// CHECK: arith.cmpi sle, %{{.*}}, %{{.*}} : tensor<64x32xi32>
module {
attn.flash_fwd @bounded {element_type = bf16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 64 : i64, mask = "none", sparse_block = 0 : i64} mask_mod {
^bb0(%b: index, %h: index, %i: index, %j: index):
  %le = arith.cmpi sle, %j, %i : index
  attn.yield %le : i1
}
}
