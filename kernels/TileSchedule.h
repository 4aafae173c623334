//===- TileSchedule.h - The persistent forward's tile schedule --*- C++ -*-===//
//
/// \file
/// Which (Q block, batch * head) tiles each program of a persistent
/// forward takes, and in which order: computed on the host once per
/// problem and launch (rt::ForwardKernel::tileSchedule), read by a
/// scheduled kernel (KernelLaunch::scheduled, the lowering's
/// TileToGPUPersistent.cpp) at the start of each tile. A causal problem's
/// tiles are uneven (Q block m visits about m + 1 KV blocks), so a fixed
/// stride over one order either balances the programs and runs every head
/// side by side (their K and V do not fit L2), or keeps a few heads
/// together and leaves some programs the heavy tiles (tools/scripts/
/// tile-order-model.py). The schedule does what a dynamic scheduler would
/// over an L2-friendly order: heads in groups whose K and V fit in L2, the
/// heaviest Q blocks of a group first, each tile to the program the cost
/// model says is free first (longest processing time first). Plain C++.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_TILESCHEDULE_H
#define FLASHJIT_KERNELS_TILESCHEDULE_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashjit {

/// A persistent forward's tiles by program: words[p] .. words[p + 1]
/// (p < programs) index the tiles of program p in words[programs + 1 ..],
/// in the order it runs them; a tile is w = pid_bh * blocks + pid_m.
struct TileSchedule {
  int64_t programs = 0; ///< the launch's grid.x
  int64_t blocks = 0;   ///< Q blocks per (batch, head): ceil(seq_q / Br)
  int64_t heads = 0;    ///< batch * heads
  std::vector<int32_t> words;
  /// The busiest program's modelled cost over the mean (1: balanced).
  double imbalance = 1;

  /// Program \p p's tiles, in order (for tests and tools).
  std::vector<int32_t> tilesOf(int64_t p) const {
    return {words.begin() + (programs + 1) + words[std::size_t(p)],
            words.begin() + (programs + 1) + words[std::size_t(p) + 1]};
  }
};

/// The modelled cost of each Q block of a causal problem (bottom-right
/// aligned, as the kernels are): the KV blocks of \p blockN keys it visits
/// plus \p fixed (the tile's prologue and epilogue, in KV blocks).
std::vector<double> causalBlockCosts(int64_t seqQ, int64_t seqKV,
                                     int64_t blockM, int64_t blockN,
                                     double fixed);

/// Query heads per group: as many as keep their K and V (\p seqKV rows of
/// \p headDimQK + \p headDimV elements of \p elementBytes, shared by \p gqa
/// query heads) within \p l2Bytes; at least 1.
int64_t l2GroupHeads(int64_t seqKV, int64_t headDimQK, int64_t headDimV,
                     int64_t gqa, int64_t elementBytes, int64_t l2Bytes);

/// The schedule of costs.size() Q blocks x \p heads tiles over
/// min(\p programs, tiles) programs: heads in groups of at most
/// \p groupHeads consecutive pid_bh (as many groups as that takes, their
/// sizes as even as possible), a group's tiles by Q block, heaviest
/// first, its heads side by side; each tile to the program whose modelled
/// load is least (the lowest program on a tie), appended to its list.
TileSchedule scheduleTiles(const std::vector<double> &costs, int64_t heads,
                           int64_t programs, int64_t groupHeads);

} // namespace flashjit

#endif // FLASHJIT_KERNELS_TILESCHEDULE_H
