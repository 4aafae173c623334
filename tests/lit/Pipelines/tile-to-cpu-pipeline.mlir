// RUN: flashjit-opt %s --pass-pipeline='builtin.module(flashjit-tile-to-cpu-pipeline)' | FileCheck %s
// RUN: flashjit-opt %s --pass-pipeline='builtin.module(flashjit-tile-to-cpu-pipeline)' | FileCheck %s --check-prefix=ENTRY

// The tile IR ends in the LLVM dialect: no tensor, scf, memref or math left;
// the buffers are static allocas of the entry block, the atomic add an
// atomicrmw fadd.
// CHECK: llvm.func @kernel(
// CHECK-NOT: tensor
// CHECK-NOT: scf.
// CHECK-NOT: memref.
// CHECK-NOT: math.
// CHECK: llvm.alloca
// CHECK: llvm.intr.exp2
// CHECK: llvm.atomicrmw fadd
// CHECK: llvm.return
// No alloca outside the entry block (the loop would grow the stack).
// ENTRY: llvm.alloca
// ENTRY: ^bb
// ENTRY-NOT: llvm.alloca
func.func @kernel(%A: memref<?xbf16>, %D: memref<?xf32>, %off: index,
                  %n: index, %s: index, %T: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %a = tile.load %A[%off] rows %c0 of %n stride %s
      : memref<?xbf16> -> tensor<8x16xbf16>
  %z = arith.constant dense<0.0> : tensor<8x8xf32>
  %r = scf.for %t = %c0 to %T step %c1 iter_args(%o = %z)
      -> (tensor<8x8xf32>) {
    %d = tile.dot %a, %a acc %o : tensor<8x8xf32> {transpose_rhs}
        : tensor<8x16xbf16>, tensor<8x16xbf16> -> tensor<8x8xf32>
    %e = math.exp2 %d : tensor<8x8xf32>
    scf.yield %e : tensor<8x8xf32>
  }
  tile.atomic_add %r, %D[%off] rows %c0 of %n stride %s
      : tensor<8x8xf32>, memref<?xf32>
  return
}
