// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=128 block-n=64" --flashjit-lower-tiled-to-gpu="warps=4 copy-bytes=16" | FileCheck %s
// RUN: flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=64 block-n=32" --flashjit-lower-tiled-to-gpu="warps=4 copy-bytes=2" | FileCheck %s --check-prefix=NARROW
// RUN: not flashjit-opt %s --split-input-file --flashjit-tile-attention="block-m=48 block-n=32" --flashjit-lower-tiled-to-gpu="warps=4" 2>&1 | FileCheck %s --check-prefix=BAD

// The tiled program becomes one gpu.func kernel: the tiled func is gone,
// the kernel takes the same buffers and scalars minus pid_m / pid_bh (they
// are block ids), Q and K(first) are staged by cp.async before the KV loop,
// and the loop carries O, m and l in registers (iter_args).
// CHECK-LABEL: gpu.module @flashjit_kernels
// CHECK: llvm.mlir.global external @flashjit_smem() {addr_space = 3 : i32
// CHECK: gpu.func @causal(%{{.*}}: !llvm.ptr
// CHECK-SAME: %{{.*}}: f32) kernel
// CHECK-SAME: attn.shared_bytes = 65536
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK: gpu.block_id  x
// Causal: the heaviest Q blocks first (pid_m reversed with the grid size).
// CHECK: gpu.grid_dim  x
// CHECK: llvm.call_intrinsic "llvm.nvvm.cp.async.cg.shared.global.16.s"
// CHECK: llvm.call_intrinsic "llvm.nvvm.cp.async.commit.group"
// CHECK: scf.for {{.*}} iter_args(
// CHECK: llvm.call_intrinsic "llvm.nvvm.cp.async.wait.all"
// CHECK: gpu.barrier
// CHECK: llvm.call_intrinsic "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16"
// CHECK: llvm.call_intrinsic "llvm.nvvm.mma.m16n8k16.row.col.bf16"
// Only blocks straddling the band or Nkv are masked.
// CHECK: scf.if
// CHECK: llvm.call_intrinsic "llvm.nvvm.shfl.sync.bfly.f32"
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f32"
// The rescale of O runs when a row max moved in the warp.
// CHECK: llvm.call_intrinsic "llvm.nvvm.vote.any.sync"
// CHECK: llvm.call_intrinsic "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16"
// CHECK: scf.yield
// CHECK: llvm.call_intrinsic "llvm.nvvm.lg2.approx.ftz.f"
// CHECK: gpu.return
// CHECK-NOT: func.func @causal
// NARROW: llvm.load %{{.*}} : !llvm.ptr<1> -> i16
// BAD: block_m (48) must be a multiple of 16 * warps (64) on the GPU
module {
attn.flash_fwd @causal {element_type = bf16, gqa = 1 : i64, head_dim_qk = 128 : i64, head_dim_v = 128 : i64, mask = "causal", sparse_block = 0 : i64}
}

// -----

// fp16 and dv > 256: the fp16 MMA, and O's columns split into chunks of
// at most 256 (grid.z picks the chunk: block_id z).
// CHECK-LABEL: gpu.module @flashjit_kernels
// CHECK: gpu.block_id  z
// CHECK: llvm.call_intrinsic "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"
module {
attn.flash_fwd @wide {element_type = f16, gqa = 1 : i64, head_dim_qk = 64 : i64, head_dim_v = 320 : i64, mask = "none", sparse_block = 0 : i64}
}
