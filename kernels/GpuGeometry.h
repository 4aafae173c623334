//===- GpuGeometry.h - Shapes of the GPU forward kernel ---------*- C++ -*-===//
//
/// \file
/// The one place that derives the GPU kernel's geometry from a spec and a
/// tile config: padded head dims, the O-column split for dv > 256, shared
/// memory layout, threads and grid. The GPU lowering places its kernels by
/// it and records what it placed on each (kernels/KernelLaunch.h), which
/// is what the launcher reads; the config checks (does a tiling fit the
/// device?) use it before anything is compiled, and tests check the
/// records against it. Plain C++.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_GPUGEOMETRY_H
#define FLASHJIT_KERNELS_GPUGEOMETRY_H

#include "kernels/AttentionSpec.h"
#include "kernels/KernelABI.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace flashjit {

inline int64_t roundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t ceilDiv(int64_t x, int64_t m) { return (x + m - 1) / m; }

/// Geometry of one compiled GPU forward kernel.
struct GpuGeometry {
  int64_t threads;     ///< 32 * warps
  int64_t mTiles;      ///< 16-row MMA tiles per warp (Br / (16 * warps))
  int64_t dqkPad;      ///< head_dim_qk rounded up to the MMA k-step (16)
  int64_t dvPad;       ///< head_dim_v rounded up to 16
  int64_t dvChunk;     ///< O columns per program (<= 256)
  int64_t dvChunks;    ///< programs along O's columns (grid.z)
  int64_t qkRowChunks; ///< 16-byte chunks per Q/K row in shared memory
  int64_t vRowChunks;  ///< 16-byte chunks per V row in shared memory
  int64_t qOffset, kOffset, vOffset; ///< shared-memory byte offsets
  int64_t sharedBytes;               ///< dynamic shared memory per block
  /// The tiles Hopper's warpgroup MMAs take (sm_90a, the lowering's wgmma
  /// option): one warpgroup per 64 rows of Q (warps = Br / 16: one 16-row
  /// tile per warp), Bc and both head dims at most 256 (a product's N), no
  /// O-column split. The tiles then use the blocked 128B-swizzle layout.
  bool wgmmaShape;
  /// The K/V ring of the warpgroup-MMA forward (where the target takes it:
  /// usesKvRing, and config.stages >= 2): a producer warpgroup (the block's
  /// last kRingProducerThreads threads) copies K and V of each KV block into
  /// one of `ringStages` stages, each `stageBytes` long after Q (K at
  /// kOffset, V at vOffset of stage 0), and the consumers' warpgroups
  /// compute on the stage that the mbarriers at `barrierOffset` say has
  /// landed (per stage: K full, V full, K empty, V empty; 8 bytes each).
  /// 0 stages: no ring (the loop's own copies: stages = 1, or mma.sync).
  int64_t ringStages = 0;
  int64_t stageBytes = 0, barrierOffset = 0;
  static constexpr int64_t kRingProducerThreads = 128;
  /// The ring takes tilings of two or three consumer warpgroups (8 or 12
  /// warps, Br = 128 or 192): measured on the H200 (bench/NOTES.md, T10),
  /// one consumer warpgroup has no other to overlap with (0.65x the same
  /// tiling without the ring). Three spill at the 128 registers that 512
  /// threads leave unless the lowering moves registers to them (setmaxnreg,
  /// which it does for three).
  static constexpr int64_t kRingConsumerWarps = 8;
  static constexpr int64_t kRingMaxConsumerWarps = 12;
  /// ... and head dims up to 256 (a warpgroup MMA's N): past 128 the
  /// consumers take registers from the producer (setmaxnreg), without
  /// which O and S spill at the 168 registers that 384 threads leave.
  static constexpr int64_t kRingMaxHeadDim = 256;
  static constexpr int64_t kRingBarriersPerStage = 4;
  /// After the stages' barriers: Q's full and empty barriers (Q by a
  /// tensor map, copied by the producer: TileToGPUTma.cpp).
  static constexpr int64_t kRingQueryBarriers = 2;

  /// Grid for a problem: (Q blocks, batch * heads, dv chunks).
  std::array<int64_t, 3> grid(const Problem &p, const TileConfig &c) const {
    return {ceilDiv(p.seqLenQ, c.blockM), p.batch * p.heads, dvChunks};
  }
};

/// Whether \p config would take the K/V ring for \p spec on a target with
/// it (\p kvRing; the geometry's wgmmaShape and stages >= 2 aside): 8 or
/// 12 warps and head dims up to 256 (GpuGeometry::kRingConsumerWarps).
inline bool takesKvRing(const AttentionSpec &spec, const TileConfig &config,
                        bool kvRing) {
  return kvRing &&
         (config.warps == GpuGeometry::kRingConsumerWarps ||
          config.warps == GpuGeometry::kRingMaxConsumerWarps) &&
         std::max(spec.headDimQK, spec.headDimV) <=
             GpuGeometry::kRingMaxHeadDim;
}

/// Derives the geometry; rows of Q, K, V in shared memory are padded to a
/// multiple of 8 chunks of 16 bytes so that the XOR swizzle (chunk ^ row % 8)
/// stays inside the row.
///
/// \p kvRing: the target runs the products on warpgroup MMAs (sm_90a) where
/// wgmmaShape holds and takes their K/V ring (usesKvRing); config.stages >=
/// 2 with kRingConsumerWarps warps then gives the ring.
inline GpuGeometry gpuGeometry(const AttentionSpec &spec,
                               const TileConfig &config, bool kvRing = false) {
  GpuGeometry g;
  g.threads = 32 * config.warps;
  g.mTiles = config.blockM / (16 * config.warps);
  g.dqkPad = roundUp(spec.headDimQK, 16);
  g.dvPad = roundUp(spec.headDimV, 16);
  g.dvChunks = ceilDiv(g.dvPad, 256);
  g.dvChunk = roundUp(ceilDiv(g.dvPad, g.dvChunks), 16);
  g.qkRowChunks = roundUp(g.dqkPad / 8, 8);
  g.vRowChunks = roundUp(g.dvChunk / 8, 8);
  g.wgmmaShape = config.blockM % 64 == 0 &&
                 config.warps * 16 == config.blockM && config.blockN <= 256 &&
                 g.dqkPad <= 256 && g.dvChunks == 1;
  g.qOffset = 0;
  g.kOffset = config.blockM * g.qkRowChunks * 16;
  g.vOffset = g.kOffset + config.blockN * g.qkRowChunks * 16;
  g.sharedBytes = g.vOffset + config.blockN * g.vRowChunks * 16;
  if (takesKvRing(spec, config, kvRing) && g.wgmmaShape && config.stages >= 2) {
    // Every tile starts on a 1024-byte boundary (the 128B swizzle's).
    g.kOffset = roundUp(g.kOffset, 1024);
    g.vOffset = roundUp(g.kOffset + config.blockN * g.qkRowChunks * 16, 1024);
    g.ringStages = config.stages;
    g.stageBytes =
        roundUp(g.vOffset + config.blockN * g.vRowChunks * 16, 1024) -
        g.kOffset;
    g.barrierOffset = g.kOffset + g.ringStages * g.stageBytes;
    g.sharedBytes =
        g.barrierOffset + (g.ringStages * GpuGeometry::kRingBarriersPerStage +
                           GpuGeometry::kRingQueryBarriers) *
                              8;
    g.threads += GpuGeometry::kRingProducerThreads;
  }
  return g;
}

/// "" if \p value (the tiling field \p name) is a multiple of 16 * warps,
/// else why not, ending with \p where.
inline std::string warpMultipleProblem(const char *name, int64_t value,
                                       int64_t warps, const char *where) {
  if (value % (16 * warps) == 0)
    return "";
  return std::string(name) + " (" + std::to_string(value) +
         ") must be a multiple of 16 * warps (" + std::to_string(16 * warps) +
         ")" + where;
}

/// "" if \p need bytes of shared memory (for \p what) fit \p max.
inline std::string sharedMemoryProblem(const char *what, int64_t need,
                                       int64_t max) {
  if (need <= max)
    return "";
  return std::string(what) + " need " + std::to_string(need) +
         " bytes of shared memory, the device allows " + std::to_string(max);
}

/// Why \p config cannot run on the GPU for \p spec ("" if it can), given the
/// device's opt-in shared memory per block.
/// \p kvRing as for gpuGeometry: a warpgroup-MMA forward that takes the ring
/// (takesKvRing) takes 1 to 4 stages (1: the loop's own copies, no
/// producer warpgroup), every other forward 2 (or 1 with \p kvRing: the
/// same copies).
inline std::string gpuConfigProblem(const AttentionSpec &spec,
                                    const TileConfig &config,
                                    int64_t maxSharedBytes,
                                    bool kvRing = false) {
  if (std::string p = warpMultipleProblem("block_m", config.blockM,
                                          config.warps, " on the GPU");
      !p.empty())
    return p;
  if (config.blockN % 16 != 0)
    return "block_n (" + std::to_string(config.blockN) +
           ") must be a multiple of 16 on the GPU";
  if (config.splits && spec.headDimV > 256)
    return "split-KV (--kv-splits) takes head_dim_v up to 256 on the GPU "
           "(grid.z holds the splits), got " +
           std::to_string(spec.headDimV);
  const GpuGeometry geo = gpuGeometry(spec, config, kvRing);
  if (config.overlapSoftmax &&
      (!geo.ringStages || config.warps != GpuGeometry::kRingConsumerWarps))
    return "overlap-softmax needs the K/V ring on the GPU with two consumer "
           "warpgroups (sm_90a, 8 warps, block_m 128, head dims up to 256, "
           "stages 2 to 4): the softmax overlaps an asynchronous warpgroup "
           "MMA whose K the producer warpgroup copies";
  if (geo.wgmmaShape && takesKvRing(spec, config, kvRing)) {
    if (config.stages < 1 || config.stages > 4)
      return "stages (" + std::to_string(config.stages) +
             ") must be 1 to 4 on warpgroup MMAs: the depth of the K/V ring "
             "that a producer warpgroup fills (1: no ring, the loop's own "
             "copies)";
    if (geo.ringStages) {
      std::string what =
          "Q and a K/V ring of " + std::to_string(geo.ringStages) + " stages";
      std::string p =
          sharedMemoryProblem(what.c_str(), geo.sharedBytes, maxSharedBytes);
      return p.empty() ? p
                       : p + " (fewer stages, a smaller block_n, or stages 1: "
                             "no ring)";
    }
  } else if (config.stages != 2 && !(kvRing && config.stages == 1)) {
    // On a target with the ring, stages 1 (no ring) is as valid for the
    // tilings that never take it.
    return "stages (" + std::to_string(config.stages) + ") must be 2" +
           (kvRing ? " (or 1: no ring)" : "") +
           " on the GPU: K of the next block loads during P V and V during S "
           "(other depths: the K/V ring on warpgroup MMAs, sm_90a, 8 or 12 "
           "warps, block_m 16 * warps, head dims up to 256)";
  }
  return sharedMemoryProblem("the tiles", geo.sharedBytes, maxSharedBytes);
}

/// The split-KV tiling for decode and short queries on the GPU, or none:
/// when the Nq * gqa query rows of a KV head (GQA-packed, abi::split::
/// packsGqa; else Nq) fit one tile of at most 64 rows and there are at
/// least 1024 keys, the one-pass grid cannot fill the device (one program
/// per row block and head), so the keys are split instead: one 16-row
/// tile per warp (16 rows: one warp; else 64 rows on 4 warps), 128 keys
/// per step up to d = 64, 64 up to 128, 32 past it (spill-free on sm_90a
/// with one warp), the split count chosen at launch.
/// None past d = 256 (grid.z holds the splits) or where Br and Bc do not
/// divide the sparse block.
inline std::optional<TileConfig> decodeGpuConfig(const AttentionSpec &spec,
                                                 const Problem &p) {
  const int64_t d = std::max(spec.headDimQK, spec.headDimV);
  const int64_t rows =
      p.seqLenQ * (abi::split::packsGqa(spec) ? spec.gqaGroup : 1);
  if (spec.direction != Direction::Forward || rows > 64 || p.seqLenKV < 1024 ||
      spec.headDimV > 256)
    return std::nullopt;
  TileConfig c;
  c.blockM = rows <= 16 ? 16 : 64;
  c.warps = c.blockM / 16;
  c.blockN = d <= 64 ? 128 : d <= 128 ? 64 : 32;
  c.splits = TileConfig::kAutoSplits;
  if (spec.blockSparse &&
      (spec.sparseBlock % c.blockM != 0 || spec.sparseBlock % c.blockN != 0))
    return std::nullopt;
  return c;
}

/// Geometry of the GPU backward (three kernels, kernels/KernelABI.h abi::bwd).
/// Both main kernels run one template: "resident" tiles loaded once per
/// program and "streamed" tiles double-buffered along its loop.
///   dK/dV kernel (`attention`): a program per (Bc keys, batch * KV head,
///     output chunk); resident K, V (Bc rows, warps split the keys),
///     streamed Q, dO (Br rows) of every query head of the group.
///   dQ kernel (`attention_dq`): a program per (dqRows rows, batch * head,
///     dQ chunk); resident Q, dO (warps split the rows), streamed K, V
///     (dqKeys keys). Br rows and Bc keys, except where Br gives each warp
///     one 16-row tile and dQ fits (dqChunk <= 128, at most 4 warps): then
///     two 16-row tiles per warp and 32 keys per step, so that every K/V
///     fragment feeds two MMAs and the accumulators stay in registers
///     (H200, N = 16K: d = 128 241 -> 257 TFLOP/s, d = 96 216 -> 235).
///   preprocess (`attention_preprocess`): delta = rowsum(dO * O), a program
///     per kPreprocessRows rows.
/// Output columns: when dqk + dv (padded) <= 256, one dK/dV program computes
/// both; else dK and dV are split into chunks of <= 256 columns (multiples
/// of 64), one chunk of one of them per program (grid.z), each recomputing
/// P (and dP for dK) in full.
struct GpuBackwardGeometry {
  /// Rows per program of the preprocessing and the dQ conversion: the
  /// tiled row kernels' (kernels/KernelABI.h).
  static constexpr int64_t kPreprocessRows = abi::bwd::kRowBlockRows;
  static constexpr int64_t kPreprocessThreads = 128;
  int64_t threads; ///< 32 * warps
  /// dK/dV kernel: warps along the Br queries of S^T and dP^T. 1: every
  /// warp computes all Br queries of its keys, and P^T, dS^T stay in
  /// registers as the A operands of dV and dK. 2 (atomic dQ, one program
  /// for dK and dV): a 2-D warp grid (warps / 2 along the keys, 2 along the
  /// queries); P^T and dS^T go through shared memory, and each warp
  /// accumulates its keys' dK and dV over half of the columns (FA-2's
  /// layout: fewer shared-memory reads per MMA).
  int64_t kvQuerySplit;
  /// The dK/dV kernel can run on Hopper's warpgroup MMAs (the lowering's
  /// `wgmma` option, sm_90a): atomic dQ, one program for dK and dV (any
  /// head dims with dqk + dv <= 256 padded to 16), Br = 64 and one
  /// warpgroup per 64 keys (warps = Bc / 16). Its tiles then use the
  /// blocked 128B-swizzle layout and start on 1024-byte boundaries (the
  /// statistics padded).
  bool wgmmaShape;
  /// With warpgroup MMAs and dQ's columns a multiple of 16, dQ may be added
  /// into dq_accum by bulk reductions (the lowering's `bulk-dq` option):
  /// each warpgroup stages its 64 rows of dqStageCols columns in shared
  /// memory (Smem::dqStage, laid out as in dq_accum), and one thread adds
  /// the step's tile by the tensor memory accelerator.
  bool bulkDq;
  int64_t dqStageCols;
  int64_t keyTiles;          ///< 16-key MMA tiles per warp (dK/dV kernel)
  int64_t rowTiles;          ///< 16-row MMA tiles per warp (dQ kernel)
  int64_t dqRows, dqKeys;    ///< dQ kernel: rows per program, keys per step
  int64_t dqkPad, dvPad;     ///< head dims rounded up to 16
  int64_t qkCols, vCols;     ///< columns copied (every chunk's columns)
  int64_t qkRowChunks;       ///< 16-byte chunks per Q/K/dQ row in smem
  int64_t vRowChunks;        ///< 16-byte chunks per V/dO row in smem
  bool kvCombined;           ///< one dK/dV program computes dK and dV
  int64_t dkChunk, dkChunks; ///< dK columns per program, programs (split)
  int64_t dvChunk, dvChunks; ///< dV columns per program, programs (split)
  int64_t dqChunk, dqChunks; ///< dQ columns per program, programs
  /// dQ by atomics (dqAccumulation(spec)): the dK/dV kernel also adds dS K
  /// into dq_accum, and the third kernel only scales and converts it.
  bool atomicDq;
  int64_t dsRowChunks; ///< 16-byte chunks per key row of dS^T and P^T
  /// Shared memory of one main kernel: the resident QK-wide and V-wide
  /// tiles, then two stages of the streamed ones (each stage: the QK tile,
  /// the V tile and, in the dK/dV kernel, the streamed rows' statistics:
  /// -lse * log2(e) and delta, f32), then (atomic dQ, dK/dV kernel) dS^T
  /// and (kvQuerySplit 2) P^T: Bc keys x Br queries of the element type,
  /// then (bulkDq, 1024-byte aligned) the warpgroups' dQ rows.
  struct Smem {
    int64_t residentQK, residentV, streamQK, streamV, streamStats, stageBytes,
        dsTile, pTile, dqStage, total;
  };
  Smem kvSmem, dqSmem;

  /// Shared memory of the dK/dV kernel on warpgroup MMAs with a third
  /// stage of the streamed tiles (the `bwd-stages` option): the two
  /// stages' bytes up to dS^T's end (warpgroup MMAs stage no P^T tile),
  /// or with \p bulkDq up to the dQ staging's end, and one stage more.
  int64_t kvThreeStageBytes(bool bulkDq) const {
    return (bulkDq ? kvSmem.total : kvSmem.pTile) + kvSmem.stageBytes;
  }

  /// Programs along grid.z of the dK/dV kernel.
  int64_t kvPrograms() const { return kvCombined ? 1 : dkChunks + dvChunks; }
  std::array<int64_t, 3> preprocessGrid(const Problem &p) const {
    return {ceilDiv(p.seqLenQ, kPreprocessRows), p.batch * p.heads, 1};
  }
  std::array<int64_t, 3> kvGrid(const Problem &p, const TileConfig &c,
                                int64_t gqa) const {
    return {ceilDiv(p.seqLenKV, c.blockN), p.batch * (p.heads / gqa),
            kvPrograms()};
  }
  /// The third kernel's grid: the dQ pass, or (atomic dQ) the conversion of
  /// dq_accum, a warp per row like the preprocess.
  std::array<int64_t, 3> dqGrid(const Problem &p) const {
    if (atomicDq)
      return preprocessGrid(p);
    return {ceilDiv(p.seqLenQ, dqRows), p.batch * p.heads, dqChunks};
  }
  int64_t dqThreads() const { return atomicDq ? kPreprocessThreads : threads; }
  int64_t dqSharedBytes() const { return atomicDq ? 0 : dqSmem.total; }
};

/// How the warps of the dK/dV kernel split dQ = dS K (atomic dQ): the Br
/// rows go in rowSplit parts (warp / (warps / rowSplit)); within a part
/// (warp % (warps / rowSplit)), the columns go in groups of 64, `cols` warps
/// split each group into contiguous pieces of colWidth, and `groups` warp
/// phases take the groups round robin.
struct DqWarps {
  int64_t rowSplit, cols, groups, colWidth;
};
inline DqWarps dqWarps(int64_t warps, int64_t rowSplit) {
  int64_t perPart = warps / rowSplit;
  int64_t cols = perPart % 4 == 0 ? 4 : perPart % 2 == 0 ? 2 : 1;
  return {rowSplit, cols, perPart / cols, 64 / cols};
}

/// The dynamic shared memory of one sm_90 thread block (227 KiB).
inline constexpr int64_t kSm90MaxSharedBytes = 232448;

/// The staging slot of O in the K/V ring's forward with Q by its tensor map
/// (tma = 2), in bytes: Q's slot is refilled for the next tile there, so O
/// takes a slot of its own, Br x dv, at the first 1 KiB boundary after
/// \p geo's slots, where it is one column chunk and fits the block's
/// shared memory; else 0 (O is then stored element by element).
inline int64_t queryMapOutputSlotBytes(const GpuGeometry &geo,
                                       const TileConfig &config) {
  const int64_t bytes = config.blockM * geo.vRowChunks * 16;
  return geo.dvChunks == 1 &&
                 roundUp(geo.sharedBytes, 1024) + bytes <= kSm90MaxSharedBytes
             ? bytes
             : 0;
}
/// The shared memory of that forward: \p geo's, and O's slot where it has
/// one (queryMapOutputSlotBytes).
inline int64_t queryMapSharedBytes(const GpuGeometry &geo,
                                   const TileConfig &config) {
  const int64_t slot = queryMapOutputSlotBytes(geo, config);
  return slot ? roundUp(geo.sharedBytes, 1024) + slot : geo.sharedBytes;
}

/// The bias product (dialects/Attn/Transforms/BiasProduct.h: ALiBi's bias
/// as one more step of Q K^T in the overlapped loop) reads a constant
/// 16 x Bc bf16 operand from a shared slot of its own after every other
/// (compiler/Conversion/TileToGPUConstants.cpp). Rings of up to this many
/// stages leave room for it at the head dims it takes (up to 128; 196 KiB
/// with O's slot at Bc = 128), deeper ones keep the bias an fma a score.
inline constexpr int64_t kBiasProductMaxStages = 2;
/// Whether \p config's forward takes the bias product where its score
/// modifier allows it (the tiling option bias-product).
inline bool usesBiasProduct(const TileConfig &config) {
  return config.overlapSoftmax && config.stages <= kBiasProductMaxStages;
}

/// The columns of dQ = dS K that each of \p groups warpgroups holds (the
/// dK/dV kernel on warpgroup MMAs, \p cols dQ's columns padded to 16): a
/// 64-wide block each where they split evenly so, else all of them (the
/// warpgroups then split the keys, each adding its keys' share).
inline int64_t dqWarpgroupCols(int64_t cols, int64_t groups) {
  return (cols / groups) % 64 == 0 ? cols / groups : cols;
}

/// Splits \p pad columns into chunks of at most \p maxChunk (a multiple of
/// 64 when there is more than one).
inline void splitColumns(int64_t pad, int64_t maxChunk, int64_t &chunk,
                         int64_t &chunks) {
  chunks = ceilDiv(pad, maxChunk);
  chunk = chunks == 1 ? pad : roundUp(ceilDiv(pad, chunks), 64);
  chunks = ceilDiv(pad, chunk);
}

/// The separate dQ pass's tiles (deterministic dQ): Br rows and Bc keys,
/// except where Br gives each warp one 16-row tile and dQ fits (dqChunk <=
/// 128, at most 4 warps): then two 16-row tiles per warp and 32 keys per
/// step, so that every K/V fragment feeds two MMAs and the accumulators
/// stay in registers. The tiling pass makes the dQ function with these
/// tiles (its `warps` option), so the CPU runs what the GPU runs.
struct DqPassTiles {
  int64_t rows, keys;
};
inline DqPassTiles dqPassTiles(int64_t headDimQK, int64_t sparseBlock,
                               const TileConfig &config) {
  int64_t chunk = 0, chunks = 0;
  splitColumns(roundUp(headDimQK, 16), 256, chunk, chunks);
  const int64_t wideRows = 32 * config.warps;
  bool wide = config.blockM < wideRows && chunk <= 128 && config.warps <= 4 &&
              (sparseBlock == 0 ||
               (sparseBlock % wideRows == 0 && sparseBlock % 32 == 0));
  return wide ? DqPassTiles{wideRows, 32}
              : DqPassTiles{config.blockM, config.blockN};
}

inline GpuBackwardGeometry gpuBackwardGeometry(const AttentionSpec &spec,
                                               const TileConfig &config) {
  GpuBackwardGeometry g;
  g.threads = 32 * config.warps;
  g.dqkPad = roundUp(spec.headDimQK, 16);
  g.dvPad = roundUp(spec.headDimV, 16);
  g.kvCombined = g.dqkPad + g.dvPad <= 256;
  g.atomicDq = dqAccumulation(spec) == DqAccumulation::Atomic;
  // The grid needs whole 16-wide halves of the columns and whole 16-key
  // tiles per warp. Only at Br = 64 (32 queries per warp): at Br = 128 its
  // S^T tiles spill (H200, N = 16K, run B15: d = 128 +4%, causal +2%,
  // d = 96 -1%, d = 64 at 128 x 128 -4%).
  const bool grid = g.atomicDq && g.kvCombined && config.warps % 2 == 0 &&
                    config.blockM == 64 &&
                    config.blockN % (8 * config.warps) == 0 &&
                    g.dqkPad % 32 == 0 && g.dvPad % 32 == 0;
  g.kvQuerySplit = grid ? 2 : 1;
  g.keyTiles = config.blockN * g.kvQuerySplit / (16 * config.warps);
  g.wgmmaShape = g.atomicDq && g.kvCombined && config.blockM == 64 &&
                 config.blockN % 64 == 0 && config.warps * 16 == config.blockN;
  splitColumns(g.dqkPad, 256, g.dkChunk, g.dkChunks);
  splitColumns(g.dvPad, 256, g.dvChunk, g.dvChunks);
  splitColumns(g.dqkPad, 256, g.dqChunk, g.dqChunks);
  DqPassTiles dqTiles = dqPassTiles(
      spec.headDimQK, spec.blockSparse ? spec.sparseBlock : 0, config);
  g.rowTiles = dqTiles.rows / (16 * config.warps);
  g.dqRows = dqTiles.rows;
  g.dqKeys = dqTiles.keys;
  // Rows cover every chunk's columns (the last chunk may pass the head dim;
  // those columns are zero-filled and never stored).
  g.qkCols =
      std::max({g.dqkPad, g.dkChunk * g.dkChunks, g.dqChunk * g.dqChunks});
  g.vCols = std::max(g.dvPad, g.dvChunk * g.dvChunks);
  g.qkRowChunks = roundUp(g.qkCols / 8, 8);
  g.vRowChunks = roundUp(g.vCols / 8, 8);
  g.dsRowChunks = roundUp(config.blockM / 8, 8);
  auto smem = [&](int64_t residentRows, int64_t streamRows, int64_t statsBytes,
                  int64_t dsBytes, int64_t pBytes) {
    GpuBackwardGeometry::Smem s;
    s.residentQK = 0;
    s.residentV = residentRows * g.qkRowChunks * 16;
    s.streamQK = s.residentV + residentRows * g.vRowChunks * 16;
    s.streamV = s.streamQK + streamRows * g.qkRowChunks * 16;
    s.streamStats = s.streamV + streamRows * g.vRowChunks * 16;
    s.stageBytes = s.streamStats + statsBytes - s.streamQK;
    s.dsTile = s.streamQK + 2 * s.stageBytes;
    s.pTile = s.dsTile + dsBytes;
    s.total = s.pTile + pBytes;
    s.dqStage = s.total;
    return s;
  };
  const int64_t keyTileBytes = config.blockN * g.dsRowChunks * 16;
  const int64_t statsBytes = 2 * config.blockM * 4;
  g.kvSmem = smem(config.blockN, config.blockM,
                  g.wgmmaShape ? roundUp(statsBytes, 1024) : statsBytes,
                  g.atomicDq ? keyTileBytes : 0, grid ? keyTileBytes : 0);
  g.dqSmem = smem(g.dqRows, g.dqKeys, 0, 0, 0);
  // The staging tile where it fits in an sm_90 block's 227 KiB (the
  // tiling keeps the threads' reductions where they do not).
  const int64_t groups = std::max<int64_t>(config.warps / 4, 1);
  g.dqStageCols = dqWarpgroupCols(g.dqkPad, groups);
  g.kvSmem.dqStage = roundUp(g.kvSmem.total, 1024);
  const int64_t staged = g.kvSmem.dqStage + groups * 64 * g.dqStageCols * 4;
  g.bulkDq =
      g.wgmmaShape && spec.headDimQK % 16 == 0 && staged <= kSm90MaxSharedBytes;
  if (g.bulkDq)
    g.kvSmem.total = staged;
  else
    g.kvSmem.dqStage = g.kvSmem.total;
  return g;
}

/// Why \p config cannot run the GPU backward of \p spec ("" if it can).
inline std::string gpuBackwardConfigProblem(const AttentionSpec &spec,
                                            const TileConfig &config,
                                            int64_t maxSharedBytes) {
  // With atomic dQ there is no dQ kernel: Br only needs whole MMA tiles.
  const bool atomic = dqAccumulation(spec) == DqAccumulation::Atomic;
  for (auto [name, value, warps, where] :
       {std::tuple("block_m", config.blockM, atomic ? 1 : config.warps,
                   atomic ? " for the GPU backward (16-row MMA tiles)"
                          : " for the GPU backward (the dQ kernel's warps "
                            "split the rows)"),
        std::tuple("block_n", config.blockN, config.warps,
                   " for the GPU backward (the dK/dV kernel's warps split the "
                   "keys)")})
    if (std::string p = warpMultipleProblem(name, value, warps, where);
        !p.empty())
      return p;
  if (config.stages != 2)
    return "stages (" + std::to_string(config.stages) +
           ") must be 2 on the GPU (double-buffered tiles)";
  GpuBackwardGeometry g = gpuBackwardGeometry(spec, config);
  return sharedMemoryProblem("the backward's tiles",
                             std::max(g.kvSmem.total, g.dqSharedBytes()),
                             maxSharedBytes);
}

} // namespace flashjit

#endif // FLASHJIT_KERNELS_GPUGEOMETRY_H
