// RUN: flashjit-opt %s | flashjit-opt | FileCheck %s

// Every tile op prints and parses back.
// CHECK-LABEL: func.func @ops
// CHECK: tile.load %arg0[%arg2] rows %arg3 of %arg4 stride %arg5 : memref<?xbf16> -> tensor<16x32xbf16>
// CHECK: tile.load %arg1[%arg2] rows %arg3 of %arg4 : memref<?xf32> -> tensor<16xf32>
// CHECK: tile.dot %{{.*}}, %{{.*}} {transpose_rhs} : tensor<16x32xbf16>, tensor<16x32xbf16> -> tensor<16x16xf32>
// CHECK: tile.dot %{{.*}}, %{{.*}} acc %{{.*}} : tensor<16x16xf32> {transpose_lhs} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
// CHECK: tile.reduce "max" %{{.*}} dim 1 : tensor<16x16xf32> -> tensor<16xf32>
// CHECK: tile.broadcast %{{.*}} dim 1 : tensor<16xf32> -> tensor<16x16xf32>
// CHECK: tile.splat %arg6 : f32 -> tensor<16x16xf32>
// CHECK: tile.iota dim 0 : tensor<16x16xi32>
// CHECK: tile.store %{{.*}}, %arg1[%arg2] rows %arg3 of %arg4 : tensor<16xf32>, memref<?xf32>
// CHECK: tile.atomic_add %{{.*}}, %arg7[%arg2] rows %arg3 of %arg4 stride %arg5 : tensor<16x16xf32>, memref<?xf32>
func.func @ops(%a: memref<?xbf16>, %l: memref<?xf32>, %off: index, %r0: index,
               %n: index, %s: index, %x: f32, %acc: memref<?xf32>) {
  %q = tile.load %a[%off] rows %r0 of %n stride %s : memref<?xbf16> -> tensor<16x32xbf16>
  %m = tile.load %l[%off] rows %r0 of %n : memref<?xf32> -> tensor<16xf32>
  %p = tile.dot %q, %q {transpose_rhs} : tensor<16x32xbf16>, tensor<16x32xbf16> -> tensor<16x16xf32>
  %p2 = tile.dot %p, %p acc %p : tensor<16x16xf32> {transpose_lhs} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  %mx = tile.reduce "max" %p2 dim 1 : tensor<16x16xf32> -> tensor<16xf32>
  %b = tile.broadcast %mx dim 1 : tensor<16xf32> -> tensor<16x16xf32>
  %sp = tile.splat %x : f32 -> tensor<16x16xf32>
  %io = tile.iota dim 0 : tensor<16x16xi32>
  tile.store %m, %l[%off] rows %r0 of %n : tensor<16xf32>, memref<?xf32>
  tile.atomic_add %b, %acc[%off] rows %r0 of %n stride %s : tensor<16x16xf32>, memref<?xf32>
  return
}

// A captured tensor's gather, and its gradient's scatter_add.
// CHECK-LABEL: func.func @captured
// CHECK: %[[G:.*]] = tile.gather %arg0[%arg1] : memref<?xf32>, tensor<16x16xi32> -> tensor<16x16xf32>
// CHECK: tile.scatter_add %[[G]], %arg2[%arg1] : tensor<16x16xf32>, memref<?xf32>, tensor<16x16xi32>
func.func @captured(%t: memref<?xf32>, %idx: tensor<16x16xi32>, %dt: memref<?xf32>) {
  %g = tile.gather %t[%idx] : memref<?xf32>, tensor<16x16xi32> -> tensor<16x16xf32>
  tile.scatter_add %g, %dt[%idx] : tensor<16x16xf32>, memref<?xf32>, tensor<16x16xi32>
  return
}

// A deterministic gradient's fixed-point word: i64 adds into an i64 buffer,
// which a row kernel later reads back with tile.load.
// CHECK-LABEL: func.func @fixed_point
// CHECK: tile.scatter_add %arg0, %arg1[%arg2] : tensor<16x16xi64>, memref<?xi64>, tensor<16x16xi32>
// CHECK: tile.load %arg1[%arg3] rows %arg3 of %arg3 stride %arg3 : memref<?xi64> -> tensor<64x32xi64>
func.func @fixed_point(%w: tensor<16x16xi64>, %acc: memref<?xi64>, %idx: tensor<16x16xi32>, %n: index) {
  tile.scatter_add %w, %acc[%idx] : tensor<16x16xi64>, memref<?xi64>, tensor<16x16xi32>
  %a = tile.load %acc[%n] rows %n of %n stride %n : memref<?xi64> -> tensor<64x32xi64>
  return
}

// A masked store at each element's own index (a mask's block list).
// CHECK-LABEL: func.func @listed
// CHECK: tile.scatter %arg0, %arg1[%arg2] if %arg3 : tensor<4xi32>, memref<?xi32>, tensor<4xi32>, tensor<4xi1>
func.func @listed(%e: tensor<4xi32>, %list: memref<?xi32>, %at: tensor<4xi32>, %kept: tensor<4xi1>) {
  tile.scatter %e, %list[%at] if %kept : tensor<4xi32>, memref<?xi32>, tensor<4xi32>, tensor<4xi1>
  return
}
