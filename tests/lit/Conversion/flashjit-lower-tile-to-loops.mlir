// RUN: flashjit-opt %s --flashjit-lower-tile-to-loops --split-input-file | FileCheck %s

// tile.load: rows past the end are zeros and never read; tile.store skips
// them. Every buffer is an alloca in the entry block.
// CHECK-LABEL: func.func @load_store(
// CHECK-NOT: tensor
// CHECK: %[[T:.*]] = memref.alloca() : memref<4x8xbf16>
// CHECK: scf.for %[[R:.*]] = {{.*}} {
// CHECK:   %[[ROW:.*]] = arith.addi %{{.*}}, %[[R]] : index
// CHECK:   %[[IN:.*]] = arith.cmpi slt, %[[ROW]], %{{.*}} : index
// CHECK:   arith.muli %[[ROW]], %{{.*}} : index
// CHECK:   scf.if %[[IN]] {
// CHECK:     scf.for
// CHECK:       memref.load %{{.*}}[%{{.*}}] : memref<?xbf16>
// CHECK:       memref.store %{{.*}}, %[[T]][%[[R]], %{{.*}}] : memref<4x8xbf16>
// CHECK:   } else {
// CHECK:     scf.for
// CHECK:       memref.store %{{.*}}, %[[T]][%[[R]], %{{.*}}] : memref<4x8xbf16>
// CHECK: scf.for
// CHECK:   arith.cmpi slt
// CHECK:   scf.if
// CHECK:     scf.for
// CHECK:       memref.load %[[T]]
// CHECK:       memref.store %{{.*}}, %{{.*}}[%{{.*}}] : memref<?xbf16>
// CHECK-NOT: tensor
// CHECK: return
func.func @load_store(%A: memref<?xbf16>, %B: memref<?xbf16>, %off: index,
                      %r0: index, %n: index, %s: index) {
  %t = tile.load %A[%off] rows %r0 of %n stride %s
      : memref<?xbf16> -> tensor<4x8xbf16>
  tile.store %t, %B[%off] rows %r0 of %n stride %s
      : tensor<4x8xbf16>, memref<?xbf16>
  return
}

// -----

// tile.atomic_add: memref.atomic_rmw addf per element of the present rows.
// CHECK-LABEL: func.func @atomic_add(
// CHECK-NOT: tensor
// CHECK: memref.load %{{.*}}[%{{.*}}] : memref<?xf32>
// CHECK: scf.if
// CHECK: memref.atomic_rmw addf %{{.*}}, %{{.*}}[%{{.*}}] : (f32, memref<?xf32>) -> f32
// CHECK-NOT: tensor
// CHECK: return
func.func @atomic_add(%A: memref<?xf32>, %D: memref<?xf32>, %off: index,
                      %r0: index, %n: index) {
  %t = tile.load %A[%off] rows %r0 of %n : memref<?xf32> -> tensor<16xf32>
  %u = arith.addf %t, %t : tensor<16xf32>
  tile.atomic_add %u, %D[%off] rows %r0 of %n : tensor<16xf32>, memref<?xf32>
  return
}

// -----

// tile.dot: operands extended to f32, one accumulator per element starting
// from acc, the products added in k order (j innermost); the transposed rhs
// is staged once as K x N f32.
// CHECK-LABEL: func.func @dot(
// CHECK-NOT: tensor
// CHECK: memref.alloca() : memref<8x4xbf16>
// CHECK: memref.alloca() : memref<2x8xbf16>
// CHECK: %[[ACC:.*]] = memref.alloca() : memref<4x2xf32>
// CHECK: %[[OUT:.*]] = memref.alloca() : memref<4x2xf32>
// CHECK: %[[RT:.*]] = memref.alloca() : memref<8x2xf32>
// CHECK: %[[INIT:.*]] = memref.load %[[ACC]][%[[I:.*]], %[[J:.*]]] : memref<4x2xf32>
// CHECK-NEXT: memref.store %[[INIT]], %[[OUT]][%[[I]], %[[J]]]
// CHECK: %[[R:.*]] = memref.load %{{.*}}[%[[RJ:.*]], %[[RK:.*]]] : memref<2x8xbf16>
// CHECK-NEXT: %[[RF:.*]] = arith.extf %[[R]] : bf16 to f32
// CHECK-NEXT: memref.store %[[RF]], %[[RT]][%[[RK]], %[[RJ]]]
// CHECK: scf.for %[[I2:[^ ]*]] =
// CHECK-NEXT: scf.for %[[K:[^ ]*]] =
// CHECK:     %[[A:.*]] = memref.load %{{.*}}[%[[K]], %[[I2]]] : memref<8x4xbf16>
// CHECK:     %[[AF:.*]] = arith.extf %[[A]] : bf16 to f32
// CHECK:     scf.for %[[J2:[^ ]*]] =
// CHECK:       %[[B:.*]] = memref.load %[[RT]][%[[K]], %[[J2]]] : memref<8x2xf32>
// CHECK:       %[[P:.*]] = arith.mulf %[[AF]], %[[B]] : f32
// CHECK:       %[[S:.*]] = memref.load %[[OUT]][%[[I2]], %[[J2]]]
// CHECK:       %[[S2:.*]] = arith.addf %[[S]], %[[P]] : f32
// CHECK:       memref.store %[[S2]], %[[OUT]][%[[I2]], %[[J2]]]
// CHECK-NOT: tensor
// CHECK: return
func.func @dot(%A: memref<?xbf16>, %C: memref<?xf32>, %off: index,
               %n: index, %s: index) {
  %a = tile.load %A[%off] rows %off of %n stride %s
      : memref<?xbf16> -> tensor<8x4xbf16>
  %b = tile.load %A[%off] rows %off of %n stride %s
      : memref<?xbf16> -> tensor<2x8xbf16>
  %acc = tile.load %C[%off] rows %off of %n stride %s
      : memref<?xf32> -> tensor<4x2xf32>
  %d = tile.dot %a, %b acc %acc : tensor<4x2xf32> {transpose_lhs, transpose_rhs}
      : tensor<8x4xbf16>, tensor<2x8xbf16> -> tensor<4x2xf32>
  tile.store %d, %C[%off] rows %off of %n stride %s
      : tensor<4x2xf32>, memref<?xf32>
  // %acc lives on: the dot cannot accumulate in its buffer.
  tile.store %acc, %C[%off] rows %off of %n stride %s
      : tensor<4x2xf32>, memref<?xf32>
  return
}

// -----

// A dot whose acc dies there accumulates in acc's buffer (no copy); an
// elementwise op whose operand dies there writes in place.
// CHECK-LABEL: func.func @in_place(
// CHECK: memref.alloca() : memref<4x4xf32>
// CHECK-NEXT: %[[ACC:.*]] = memref.alloca() : memref<4x4xf32>
// CHECK-NOT: memref.alloca() : memref<4x4xf32>
// CHECK: arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK: memref.load %[[ACC]]
// CHECK: arith.addf
// CHECK: memref.store %{{.*}}, %[[ACC]]
// CHECK: %[[X:.*]] = memref.load %[[ACC]]
// CHECK: %[[E:.*]] = math.exp2 %[[X]] : f32
// CHECK: memref.store %[[E]], %[[ACC]]
// CHECK: return
func.func @in_place(%A: memref<?xf32>, %off: index, %n: index, %s: index) {
  %a = tile.load %A[%off] rows %off of %n stride %s
      : memref<?xf32> -> tensor<4x4xf32>
  %acc = tile.load %A[%off] rows %off of %n stride %s
      : memref<?xf32> -> tensor<4x4xf32>
  %d = tile.dot %a, %a acc %acc : tensor<4x4xf32>
      : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %e = math.exp2 %d : tensor<4x4xf32>
  tile.store %e, %A[%off] rows %off of %n stride %s
      : tensor<4x4xf32>, memref<?xf32>
  return
}

// -----

// Tiles inside scalar control flow: the loop stays, its body is lowered.
// CHECK-LABEL: func.func @scalar_loop(
// CHECK-NOT: tensor
// CHECK: memref.alloca() : memref<4xf32>
// CHECK: scf.for
// CHECK:   scf.for
// CHECK:     memref.load %{{.*}} : memref<?xf32>
// CHECK:   scf.for
// CHECK:     memref.store %{{.*}} : memref<?xf32>
// CHECK-NOT: tensor
// CHECK: return
func.func @scalar_loop(%A: memref<?xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %n step %c1 {
    %r0 = arith.muli %i, %c4 : index
    %t = tile.load %A[%c0] rows %r0 of %n : memref<?xf32> -> tensor<4xf32>
    tile.store %t, %A[%c0] rows %r0 of %n : tensor<4xf32>, memref<?xf32>
  }
  return
}

// -----

// tile.reduce: max folds maxnumf from -inf along a row; sum along a column
// adds into the result in row order.
// CHECK-LABEL: func.func @reduce(
// CHECK-NOT: tensor
// CHECK: %[[NINF:.*]] = arith.constant 0xFF800000 : f32
// CHECK: scf.for
// CHECK:   %[[M:.*]] = scf.for {{.*}} iter_args(%[[ACC:.*]] = %[[NINF]]) -> (f32) {
// CHECK:     %[[X:.*]] = memref.load
// CHECK:     %[[MX:.*]] = arith.maxnumf %[[ACC]], %[[X]] : f32
// CHECK:     scf.yield %[[MX]] : f32
// CHECK:   memref.store %[[M]], %{{.*}} : memref<4xf32>
// CHECK: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK: memref.store %[[ZERO]], %{{.*}} : memref<8xf32>
// CHECK: scf.for
// CHECK:   scf.for
// CHECK:     arith.addf
// CHECK-NOT: tensor
// CHECK: return
func.func @reduce(%A: memref<?xf32>, %off: index, %n: index, %s: index) {
  %x = tile.load %A[%off] rows %off of %n stride %s
      : memref<?xf32> -> tensor<4x8xf32>
  %m = tile.reduce "max" %x dim 1 : tensor<4x8xf32> -> tensor<4xf32>
  %l = tile.reduce "sum" %x dim 0 : tensor<4x8xf32> -> tensor<8xf32>
  tile.store %m, %A[%off] rows %off of %n : tensor<4xf32>, memref<?xf32>
  tile.store %l, %A[%off] rows %off of %n : tensor<8xf32>, memref<?xf32>
  return
}

// -----

// A causal mask: iota, splat, broadcast, elementwise compare and select, and
// the rounding to bf16 (scalar truncf per element). Splats feed elementwise
// ops as scalars.
// CHECK-LABEL: func.func @mask(
// CHECK-NOT: tensor
// CHECK: arith.index_cast %{{.*}} : index to i32
// CHECK: memref.store %{{.*}} : memref<4x8xi32>
// CHECK: %[[RI:.*]] = memref.load %{{.*}} : memref<4x8xi32>
// CHECK: arith.addi %[[RI]], %{{.*}} : i32
// CHECK: arith.cmpi sle
// CHECK: memref.store %{{.*}} : memref<4x8xi1>
// CHECK: memref.load %{{.*}} : memref<4xf32>
// CHECK: memref.store %{{.*}} : memref<4x8xf32>
// CHECK: %[[C:.*]] = memref.load %{{.*}} : memref<4x8xi1>
// CHECK: arith.select %[[C]], %{{.*}}, %{{.*}} : f32
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK: memref.store %{{.*}} : memref<4x8xbf16>
// CHECK-NOT: tensor
// CHECK: return
func.func @mask(%L: memref<?xf32>, %O: memref<?xbf16>, %off: index, %n: index,
                %s: index, %q0: i32) {
  %rows = tile.iota dim 0 : tensor<4x8xi32>
  %cols = tile.iota dim 1 : tensor<4x8xi32>
  %q0t = tile.splat %q0 : i32 -> tensor<4x8xi32>
  %qi = arith.addi %rows, %q0t : tensor<4x8xi32>
  %keep = arith.cmpi sle, %cols, %qi : tensor<4x8xi32>
  %v = tile.load %L[%off] rows %off of %n : memref<?xf32> -> tensor<4xf32>
  %vb = tile.broadcast %v dim 1 : tensor<4xf32> -> tensor<4x8xf32>
  %ninf = arith.constant dense<0xFF800000> : tensor<4x8xf32>
  %m = arith.select %keep, %vb, %ninf : tensor<4x8xi1>, tensor<4x8xf32>
  %e = math.exp2 %m : tensor<4x8xf32>
  %b = arith.truncf %e : tensor<4x8xf32> to tensor<4x8xbf16>
  tile.store %b, %O[%off] rows %off of %n stride %s
      : tensor<4x8xbf16>, memref<?xbf16>
  return
}

// -----

// scf.for carrying tiles: one buffer per tile iter_arg, the init copied in
// before the loop, the yield copied back at the end of the body; the swap
// of %a and %b goes through a temporary. The scalar iter_arg stays.
// CHECK-LABEL: func.func @loop(
// CHECK-NOT: tensor
// CHECK: memref.alloca() : memref<4xf32>
// CHECK-NEXT: memref.alloca() : memref<4xf32>
// CHECK-NEXT: %[[BA:.*]] = memref.alloca() : memref<4xf32>
// CHECK-NEXT: %[[BB:.*]] = memref.alloca() : memref<4xf32>
// CHECK-NEXT: %[[TMP:.*]] = memref.alloca() : memref<4xf32>
// CHECK-NOT: memref.alloca
// CHECK: %[[R:.*]] = scf.for {{.*}} iter_args(%[[X:.*]] = %{{.*}}) -> (f32) {
// CHECK:   arith.addf %[[X]], %[[X]] : f32
// CHECK:   memref.load %[[BA]]
// CHECK:   memref.store %{{.*}}, %[[TMP]]
// CHECK:   memref.load %[[BB]]
// CHECK:   memref.store %{{.*}}, %[[BA]]
// CHECK:   memref.load %[[TMP]]
// CHECK:   memref.store %{{.*}}, %[[BB]]
// CHECK:   scf.yield %{{.*}} : f32
// CHECK: memref.load %[[BA]]
// CHECK-NOT: tensor
// CHECK: return
func.func @loop(%A: memref<?xf32>, %off: index, %n: index, %x0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %a0 = tile.load %A[%off] rows %off of %n : memref<?xf32> -> tensor<4xf32>
  %b0 = arith.negf %a0 : tensor<4xf32>
  %r:3 = scf.for %i = %c0 to %c3 step %c1 iter_args(%a = %a0, %b = %b0, %x = %x0)
      -> (tensor<4xf32>, tensor<4xf32>, f32) {
    %x2 = arith.addf %x, %x : f32
    scf.yield %b, %a, %x2 : tensor<4xf32>, tensor<4xf32>, f32
  }
  tile.store %r#0, %A[%off] rows %off of %n : tensor<4xf32>, memref<?xf32>
  return %r#2 : f32
}

// -----

// scf.if yielding a tile: a result buffer written in each branch.
// CHECK-LABEL: func.func @if_tile(
// CHECK-NOT: tensor
// CHECK-DAG: %[[RES:.*]] = memref.alloca() : memref<4xf32>
// CHECK: scf.if %{{.*}} {
// CHECK:   memref.store %{{.*}}, %[[RES]]
// CHECK: } else {
// CHECK:   memref.store %{{.*}}, %[[RES]]
// CHECK: }
// CHECK: memref.load %[[RES]]
// CHECK-NOT: tensor
// CHECK: return
func.func @if_tile(%A: memref<?xf32>, %off: index, %n: index, %c: i1) {
  %a = tile.load %A[%off] rows %off of %n : memref<?xf32> -> tensor<4xf32>
  %t = scf.if %c -> (tensor<4xf32>) {
    %e = math.exp %a : tensor<4xf32>
    scf.yield %e : tensor<4xf32>
  } else {
    scf.yield %a : tensor<4xf32>
  }
  tile.store %t, %A[%off] rows %off of %n : tensor<4xf32>, memref<?xf32>
  return
}

// -----

// Scalar code (today's tiled IR) is left unchanged.
// CHECK-LABEL: func.func @scalar(
// CHECK: %[[A:.*]] = memref.alloca() : memref<16xf32>
// CHECK-NEXT: scf.for
// CHECK-NEXT:   memref.store %{{.*}}, %[[A]]
// CHECK-NEXT: }
// CHECK-NEXT: return
func.func @scalar(%x: f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %a = memref.alloca() : memref<16xf32>
  scf.for %i = %c0 to %c16 step %c1 {
    memref.store %x, %a[%i] : memref<16xf32>
  }
  return
}

// -----

// tile.scatter_add: each element added atomically at its own index (the
// host threads of the CPU grid add at once).
// CHECK-LABEL: func.func @scatter_add(
// CHECK-NOT: tensor
// CHECK: scf.for
// CHECK:   scf.for
// CHECK:     %[[I:.*]] = arith.index_cast %{{.*}} : i32 to index
// CHECK:     memref.atomic_rmw addf %{{.*}}, %arg2[%[[I]]] : (f32, memref<?xf32>) -> f32
func.func @scatter_add(%t: memref<?xf32>, %x: f32, %dt: memref<?xf32>) {
  %idx = tile.iota dim 1 : tensor<4x8xi32>
  %g = tile.gather %t[%idx] : memref<?xf32>, tensor<4x8xi32> -> tensor<4x8xf32>
  tile.scatter_add %g, %dt[%idx] : tensor<4x8xf32>, memref<?xf32>, tensor<4x8xi32>
  return
}
