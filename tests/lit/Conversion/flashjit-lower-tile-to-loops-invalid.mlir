// RUN: flashjit-opt %s --flashjit-lower-tile-to-loops --split-input-file --verify-diagnostics

// An op on tiles with no lowering is a named error, not a crash.
func.func @unknown_op(%O: memref<?xf32>, %off: index, %n: index) {
  // expected-error @+1 {{flashjit-lower-tile-to-loops: cannot lower 'ub.poison': no lowering of this op on tiles}}
  %p = ub.poison : tensor<4xf32>
  tile.store %p, %O[%off] rows %off of %n : tensor<4xf32>, memref<?xf32>
  return
}

// -----

// A dynamically shaped tensor is no tile.
func.func @dynamic_shape() {
  // expected-error @+1 {{flashjit-lower-tile-to-loops: cannot lower 'ub.poison': type 'tensor<?xf32>' is not a tile (a statically shaped tensor of rank 1 or 2)}}
  %p = ub.poison : tensor<?xf32>
  return
}

// -----

// Rank 3 is no tile either.
func.func @rank3() {
  // expected-error @+1 {{type 'tensor<2x2x2xf32>' is not a tile}}
  %z = arith.constant dense<0.0> : tensor<2x2x2xf32>
  return
}

// -----

// Only splat constant tiles.
func.func @non_splat(%O: memref<?xf32>, %off: index, %n: index) {
  // expected-error @+1 {{cannot lower 'arith.constant': only splat constant tiles are supported}}
  %c = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  tile.store %c, %O[%off] rows %off of %n : tensor<2xf32>, memref<?xf32>
  return
}

// -----

// Tiles live inside a kernel body, never in its signature.
// expected-error @+1 {{flashjit-lower-tile-to-loops: function @tile_arg takes or returns a tensor}}
func.func @tile_arg(%t: tensor<4xf32>) {
  return
}

// -----

// A loop other than scf.for carrying tiles.
func.func @while_loop(%b: i1) {
  %z = arith.constant dense<0.0> : tensor<4xf32>
  // expected-error @+1 {{cannot lower 'scf.while': no lowering of this op on tiles}}
  %r = scf.while (%t = %z) : (tensor<4xf32>) -> tensor<4xf32> {
    scf.condition(%b) %t : tensor<4xf32>
  } do {
  ^bb0(%t: tensor<4xf32>):
    scf.yield %t : tensor<4xf32>
  }
  return
}
