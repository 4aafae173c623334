//===- KernelPlacement.h - What a tiled function's role fixes ---*- C++ -*-===//
//
/// \file
/// KernelPlacement: what the function's role and tiling fix before any op
/// of the tile IR is lowered to the GPU (decided by TileToGPUPlacement.cpp,
/// read by every op family of TileToGPU.h): the threads and the rows every
/// register tile is placed on, the grid, the MMAs, and the sm_90a
/// forward's ring, turns, persistent loop and tensor maps. Internal to
/// compiler/Conversion.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_COMPILER_CONVERSION_KERNELPLACEMENT_H
#define FLASHJIT_COMPILER_CONVERSION_KERNELPLACEMENT_H

#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace flashjit::conversion {

/// What the function's role and tiling fix before any op is lowered
/// (TileToGPUPlacement.cpp).
struct KernelPlacement {
  int64_t threads = 0;
  /// Rows of every register tile (but a transposed product's): Br in the
  /// forward and the dQ pass, Bc in the dK/dV kernel; and the 16-row
  /// m-tiles of them per warp.
  int64_t regRows = 0, mt = 0;
  int64_t maxShared = 0; ///< the dynamic shared memory the launcher gives
  /// The grid (recorded as `attn.grid`, kernels/KernelLaunch.h): pid_m
  /// covers `gridRows` rows of the keys (gridOverKeys) or of the queries;
  /// pid_bh the KV heads (gridKvHeads) or all heads of each batch.
  int64_t gridRows = 0;
  bool gridOverKeys = false, gridKvHeads = false;
  /// A split of output columns over grid.z: a register tile `width` wide
  /// holds `chunk` of its columns per program, over `chunks` programs.
  struct ColumnSplit {
    int64_t width = 0, chunk = 0, chunks = 1;
  };
  /// The forward's (V-wide tiles) and the dQ pass's (dQ-wide); the dK/dV
  /// kernel's dK split, then its dV split: programs z < dK's chunks compute
  /// a chunk of dK (and dQ), the others one of dV.
  llvm::SmallVector<ColumnSplit, 2> splits;
  /// The ABI's argument groups (kernels/KernelABI.h), before pid_m, pid_bh.
  int numBuffers = 0, numIndexArgs = 0, numF32Args = 0;
  /// A score modifier's captured tensors: f32 buffers after the pids
  /// (TileAttention.cpp), kernel parameters after the f32 group; in a
  /// backward with deterministic captured gradients also their i64
  /// accumulators (abi::bwd::fixedPointCaptureGrads), and after all of
  /// them numCaptureSizes index arguments (the tensors' sizes, i64
  /// parameters).
  int numCaptures = 0, numCaptureSizes = 0;
  /// Split-KV (abi::split): a third pid, pid_split = grid.z; and for the
  /// partial (not the combine, whose grid.z is `gridZ`) a grid.z whose size
  /// the launcher chooses (recorded as the grid's `split`).
  bool kvSplit = false, gridSplits = false;
  /// Programs along grid.z of a function that picks its own share by that
  /// pid (the split-KV merge's column chunks); 0: one per column split.
  int64_t gridZ = 0;
  /// Causal: the grid's last Q blocks (the heaviest) start first.
  bool reversePidM = false;
  /// dq_accum pairs by red.global.add.v2.f32 (the `vector-atomics` option).
  bool vectorAtomics = false;
  /// dQ = dS K on warpgroup MMAs added into dq_accum by one bulk reduction
  /// per step (the `bulk-dq` option, GpuBackwardGeometry::bulkDq): each
  /// warpgroup's 64 rows of dqStageCols floats staged in shared memory as
  /// dq_accum lays them out (0: by each thread's red.global.add).
  int64_t dqStageCols = 0;
  /// Warps along the columns of every 2-D register tile (the dK/dV kernel's
  /// 2-D warp grid: 2): warp w holds rows of part w / colParts and columns
  /// of half w % colParts; a product's register lhs then goes through a
  /// staging slot, since each warp holds only part of its k-columns.
  int64_t colParts = 1;
  /// Products on Hopper's warpgroup MMAs (TileToGPUWgmma.cpp): shared tiles
  /// in the blocked 128B-swizzle layout (Wgmma.h), on 1024-byte boundaries.
  bool wgmma = false;
  /// The forward's K/V ring (TileToGPURing.cpp; GpuGeometry::ringStages):
  /// its stages (0: none) and the producer warpgroup's threads, the block's
  /// last ones after the `threads` consumers that every tile is placed on.
  int64_t ringStages = 0, producerThreads = 0;
  /// The ring's consumers' register count (setmaxnreg) where the role
  /// fixes it (0: the forward's rule, TileToGPURing.cpp registerSplit);
  /// the producer takes what the block's launch allocation leaves
  /// (TileToGPURing.cpp registerPool).
  int64_t ringConsumerRegisters = 0;
  /// The tiled function's first argument after the ABI's groups and the
  /// pids (pid_m, pid_bh and, split-KV, pid_split): its first captured
  /// tensor.
  int firstCaptureArg() const {
    return numBuffers + numIndexArgs + numF32Args + (kvSplit ? 3 : 2);
  }
  /// The warpgroups of the `threads` that every tile is placed on.
  int64_t warpgroups() const { return threads / 128; }
  /// With the ring (two or three consumer warpgroups: GpuGeometry::
  /// kRingConsumerWarps): they take turns at the tensor cores, so that one's
  /// softmax runs under the other's MMAs (TileToGPURing.cpp, "ping-pong").
  /// 0: no order; 1: the batches of the loop's first product (S = Q K^T);
  /// 2: every batch of the ring loop; 3: turns at the multi-function unit
  /// instead, each iteration's softmax after its products are issued (the
  /// exponentials and a score modifier's tanh: softcap).
  int64_t pingPong = 0;
  /// Row reductions fold a thread's registers by a pairwise tree instead of
  /// a chain (lowerReduce): taken with the ring, whose consumers have no
  /// block barrier to hide a chain's latency behind (T10: +8% at d = 128;
  /// -2 to -5% measured on the kernels without the ring, which keep the
  /// chain).
  bool treeReductions = false;
  /// With the ring: a persistent kernel (TileToGPUPersistent.cpp). grid.x
  /// is the launch's (the device's SMs; recorded as the grid's
  /// `persistent`) and grid.y 1; each program loops over the tiles
  /// w = blockIdx.x, + gridDim.x, ... of ceil(seq_q / Br) * batch * heads
  /// (forEachTile gives each its pid_m and pid_bh; with reversePidM the
  /// heaviest Q blocks of all heads first), its ring's positions running
  /// on across tiles.
  bool persistent = false;
  /// A persistent kernel whose tiles are uneven (causal): it takes a tile
  /// schedule before its tensor maps (kernels/TileSchedule.h; null: the
  /// fixed stride above) and records `scheduled` on its grid.
  bool scheduled = false;
  /// With the ring: its producer copies K and V (1), and Q too (2), by the
  /// tensor memory accelerator where a tensor map describes them
  /// (TileToGPUTma.cpp): one thread, cp.async.bulk.tensor into the slot,
  /// the full barrier counting the bytes.
  int64_t tma = 0;
  /// The kernel takes the backward's ABI (abi::bwd): its tensor maps name
  /// that ABI's buffers and index arguments (the dK/dV kernel's Q/dO ring
  /// by tensor maps, tma 1).
  bool backwardAbi = false;
  /// Stages of a loop's own double-buffered pipeline
  /// (lowerDoubleBufferedFor): 2, or 3 (the backward's `bwd-stages`): the
  /// copies of step t + S - 1 are issued in step t, and step t waits for
  /// its own with S - 2 groups left in flight.
  int64_t bufferStages = 2;
  /// A warp-level ordering point (GpuBuilder::warpSync) before each
  /// mma.sync product whose lhs is a register tile of this iteration (the
  /// dK/dV kernel's P and dS): the products that do not read it (dP = dO
  /// V^T) stay after it, so that ptxas interleaves P's exponentials with
  /// S's MMAs instead of issuing S's and dP's MMAs first and the
  /// exponentials after them.
  bool orderRegisterProducts = false;
  /// 16-bit register tiles are stored through a shared slot that is dead
  /// by then (TileKernelLowering::storeThroughShared): each warp writes
  /// its rows there, then copies whole rows out 16 bytes at a time. The
  /// forward's roles (its O tile, through Q's slot); needs 16-byte copies.
  bool stagedStores = false;
  /// Bytes of a slot of the forward's own for staging O (Br rows of dv
  /// padded columns, the wgmma layout), after every other, where Q comes by
  /// its tensor map (tma 2): the producer writes the next tile's Q into
  /// Q's slot as soon as the consumers' last S = Q K^T is done, so O
  /// cannot go through it. 0 where the shared memory has no room for it
  /// (O is then stored element by element, as before T30).
  int64_t outputStagingBytes = 0;
  /// Eighths (0..8) of the registers of the softmax's exponential tile
  /// computed by arithmetic on the FMA pipe instead of ex2.approx
  /// (TileToGPUExp2.cpp, kernels/Exp2Emulation.h). The forward's roles.
  int64_t exp2Emulation = 0;
  /// Eighths (0..8) of the registers of a 2-D tile's tanh by a polynomial
  /// on the FMA pipe where the warp's lie in [-1, 1] (TileToGPUTanh.cpp,
  /// kernels/TanhPolynomial.h); tanh.approx elsewhere.
  int64_t tanhPolynomial = 0;
  /// Warpgroup MMAs: each product committed as a group of its own, and a
  /// transposed product (dQ = dS K) issued where it stands in the tile IR
  /// rather than at its reduction (the `split-commits` option; the dK/dV
  /// kernel), so that each reader waits only for the groups it reads.
  bool splitCommits = false;
};

} // namespace flashjit::conversion

#endif // FLASHJIT_COMPILER_CONVERSION_KERNELPLACEMENT_H
