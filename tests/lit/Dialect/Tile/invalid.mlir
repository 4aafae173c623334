// RUN: flashjit-opt %s --split-input-file --verify-diagnostics

func.func @f(%a: memref<?xbf16>, %i: index) {
  // expected-error @+1 {{tile element type 'f32' must be the buffer's ('bf16')}}
  %q = tile.load %a[%i] rows %i of %i stride %i : memref<?xbf16> -> tensor<16x32xf32>
  return
}

// -----

func.func @f(%a: memref<?xbf16>, %i: index) {
  // expected-error @+1 {{a 2-D tile needs a row stride}}
  %q = tile.load %a[%i] rows %i of %i : memref<?xbf16> -> tensor<16x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<16x32xbf16>, %b: tensor<16x16xbf16>) {
  // expected-error @+1 {{contraction dims differ: 32 (lhs) and 16 (rhs)}}
  %s = tile.dot %a, %b {transpose_rhs} : tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
  return
}

// -----

func.func @f(%a: tensor<16x32xbf16>) {
  // expected-error @+1 {{result must be 16x16, got 'tensor<16x8xf32>'}}
  %s = tile.dot %a, %a {transpose_rhs} : tensor<16x32xbf16>, tensor<16x32xbf16> -> tensor<16x8xf32>
  return
}

// -----

func.func @f(%a: tensor<16x32xf32>) {
  // expected-error @+1 {{kind must be "max" or "sum", got "min"}}
  %r = tile.reduce "min" %a dim 1 : tensor<16x32xf32> -> tensor<16xf32>
  return
}

// -----

func.func @f(%a: tensor<16x32xf32>) {
  // expected-error @+1 {{result must be tensor<16xf32>}}
  %r = tile.reduce "max" %a dim 1 : tensor<16x32xf32> -> tensor<32xf32>
  return
}

// -----

func.func @f(%a: tensor<16xf32>) {
  // expected-error @+1 {{cannot broadcast}}
  %r = tile.broadcast %a dim 0 : tensor<16xf32> -> tensor<16x32xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{iota tiles are i32}}
  %r = tile.iota dim 0 : tensor<16x32xf32>
  return
}

// -----

func.func @f(%a: tensor<16x16xbf16>, %b: memref<?xbf16>, %i: index) {
  // expected-error @+1 {{adds f32 tiles}}
  tile.atomic_add %a, %b[%i] rows %i of %i stride %i : tensor<16x16xbf16>, memref<?xbf16>
  return
}

// -----

// expected-error @+1 {{#attn.kernel: mask must be "none", "causal" or "sliding_window", got "causl"}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "forward", head_dim_qk = 64, head_dim_v = 64, element_type = bf16, mask = "causl", gqa = 1, sparse_block = 0, block_m = 64, block_n = 64, deterministic = false>} {
  return
}

// -----

// expected-error @+1 {{#attn.kernel: block_m must be in [1, 1024], got 0}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "forward", head_dim_qk = 64, head_dim_v = 64, element_type = bf16, mask = "none", gqa = 1, sparse_block = 0, block_m = 0, block_n = 64, deterministic = false>} {
  return
}

// -----

// expected-error @+1 {{#attn.kernel: element_type must be bf16 or f16, got 'f32'}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "forward", head_dim_qk = 64, head_dim_v = 64, element_type = f32, mask = "none", gqa = 1, sparse_block = 0, block_m = 64, block_n = 64, deterministic = false>} {
  return
}

// -----

// expected-error @+1 {{attn.kernel must be an #attn.kernel<...>, got "hello"}}
func.func @attention() attributes {attn.kernel = "hello"} {
  return
}

// -----

// A missing field (head_dim_qk) is a parse error, never a default (only
// score_mod may be left out: none).
// expected-error @+1 {{struct is missing required parameter: head_dim_qk}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "forward", head_dim_v = 64, element_type = bf16, mask = "none", gqa = 1, sparse_block = 0, block_m = 64, block_n = 64, deterministic = false>} {
  return
}

// -----

// expected-error @+1 {{role "dq" (the separate dQ pass) needs deterministic = true}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "dq", head_dim_qk = 64, head_dim_v = 64, element_type = bf16, mask = "none", gqa = 1, sparse_block = 0, block_m = 64, block_n = 64, deterministic = false>} {
  return
}

// -----

// expected-error @+1 {{#attn.kernel: score_mod must be "custom" or a named variant: score modifier 'alibi:0': expected alibi:H with the head count H an integer in [1, 1048576]}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "forward", head_dim_qk = 64, head_dim_v = 64, element_type = bf16, mask = "none", gqa = 1, sparse_block = 0, block_m = 64, block_n = 64, deterministic = false, score_mod = "alibi:0">} {
  return
}

// -----

// expected-error @+1 {{#attn.kernel: score_mod must be "custom" or a named variant: score modifier 'relpos:2': unknown; the named variants are softcap:C and alibi:H}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "forward", head_dim_qk = 64, head_dim_v = 64, element_type = bf16, mask = "none", gqa = 1, sparse_block = 0, block_m = 64, block_n = 64, deterministic = false, score_mod = "relpos:2">} {
  return
}

// -----

// The backward's functions carry their description's modifier, checked alike.
// expected-error @+1 {{#attn.kernel: score_mod must be "custom" or a named variant: score modifier 'softcap:0': expected softcap:C with a finite C > 0}}
func.func @attention() attributes {attn.kernel = #attn.kernel<role = "main", head_dim_qk = 64, head_dim_v = 64, element_type = bf16, mask = "none", gqa = 1, sparse_block = 0, block_m = 64, block_n = 64, deterministic = false, score_mod = "softcap:0">} {
  return
}

// -----

func.func @f(%g: tensor<16x16xf32>, %dt: memref<?xf32>, %idx: tensor<16x8xi32>) {
  // expected-error @+1 {{the value must be the index tile's shape in the buffer's element type}}
  tile.scatter_add %g, %dt[%idx] : tensor<16x16xf32>, memref<?xf32>, tensor<16x8xi32>
  return
}

// -----

func.func @f(%g: tensor<16x16xf32>, %dt: memref<?xi64>, %idx: tensor<16x16xi32>) {
  // expected-error @+1 {{the value must be the index tile's shape in the buffer's element type}}
  tile.scatter_add %g, %dt[%idx] : tensor<16x16xf32>, memref<?xi64>, tensor<16x16xi32>
  return
}

// -----

func.func @f(%g: tensor<16x16xi32>, %dt: memref<?xi32>, %idx: tensor<16x16xi32>) {
  // expected-error @+1 {{operand #1 must be 1D memref of 32-bit float or 64-bit signless integer values}}
  tile.scatter_add %g, %dt[%idx] : tensor<16x16xi32>, memref<?xi32>, tensor<16x16xi32>
  return
}

// -----

func.func @f(%g: tensor<16x16xf32>, %dt: memref<?xf32>, %idx: tensor<16x16xi64>) {
  // expected-error @+1 {{indices are i32}}
  tile.scatter_add %g, %dt[%idx] : tensor<16x16xf32>, memref<?xf32>, tensor<16x16xi64>
  return
}

// -----

func.func @f(%e: tensor<4xi32>, %list: memref<?xi32>, %at: tensor<4xi32>, %kept: tensor<4xi32>) {
  // expected-error @+1 {{the mask is i1}}
  tile.scatter %e, %list[%at] if %kept : tensor<4xi32>, memref<?xi32>, tensor<4xi32>, tensor<4xi32>
  return
}

// -----

func.func @f(%e: tensor<4xf32>, %list: memref<?xi32>, %at: tensor<4xi32>, %kept: tensor<4xi1>) {
  // expected-error @+1 {{the value and the mask must be the index tile's shape, the value in the buffer's element type}}
  tile.scatter %e, %list[%at] if %kept : tensor<4xf32>, memref<?xi32>, tensor<4xi32>, tensor<4xi1>
  return
}

// -----

// quad_order permutes whole 16-column groups of 2-D rows.
func.func @f(%a: tensor<16x24xf32>, %b: memref<?xf32>, %i: index) {
  // expected-error @+1 {{quad_order takes a 2-D tile of whole 16-column groups, got 'tensor<16x24xf32>'}}
  tile.atomic_add %a, %b[%i] rows %i of %i stride %i {quad_order} : tensor<16x24xf32>, memref<?xf32>
  return
}

// -----

func.func @f(%b: memref<?xf32>, %i: index) {
  // expected-error @+1 {{quad_order takes a 2-D tile of whole 16-column groups, got 'tensor<64xf32>'}}
  %l = tile.load %b[%i] rows %i of %i {quad_order} : memref<?xf32> -> tensor<64xf32>
  return
}
