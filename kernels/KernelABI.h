//===- KernelABI.h - The argument list of a compiled kernel -----*- C++ -*-===//
//
/// \file
/// The tiling pass creates, and the CPU and GPU launchers fill, one argument
/// list for every forward kernel, dense or block-sparse:
///
///   buffers:  q, k, v, o (element type), lse (f32), counts, indices,
///             cu_seqlens_q, cu_seqlens_kv (i32)
///   indices:  the IndexArg values below, in order
///   f32:      scale * log2(e)
///   indices:  pid_m (Q block), pid_bh (batch * heads + head)
///
/// A dense kernel ignores the counts and indices buffers and their strides;
/// a kernel without varlen (AttentionSpec::varlen) ignores cu_seqlens_q and
/// cu_seqlens_kv. With varlen, sequence b of Q (and O) is rows
/// [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of a tensor whose batch stride the
/// kernel does not use (whatever the launchers pass), the same for K and V with
/// cu_seqlens_kv; seq_q and seq_kv are the longest sequences, and lse (and
/// every workspace) keeps its padded [B, H, seq_q] rows.
/// Strides are in elements. Plain C++, shared by compiler and runtime.
///
/// The backward pass (namespace bwd below) is three functions that share one
/// argument list: `@f_preprocess`, `@f` (the main loop) and `@f_dq` (dQ: its
/// conversion from the atomic accumulator, or the deterministic pass).
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_KERNELABI_H
#define FLASHJIT_KERNELS_KERNELABI_H

#include "kernels/AttentionSpec.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace flashjit::abi {

/// A block-sparse layout's entry (indices) lists KV block k as k, or, when
/// the description's mask_mod keeps every element of the block pair (a
/// "full" block: the kernel skips the mask there), as ~k = -k - 1. Kernels
/// without a mask_mod treat both alike.
inline constexpr int32_t fullBlockEntry(int32_t block) { return ~block; }
/// The block of entry \p e, full or not.
inline constexpr int32_t blockOfEntry(int32_t e) { return e < 0 ? ~e : e; }
/// Whether entry \p e marks a full block.
inline constexpr bool isFullEntry(int32_t e) { return e < 0; }

enum Buffer : int {
  Q,
  K,
  V,
  O,
  Lse,
  Counts,
  Indices,
  CuSeqQ,
  CuSeqKV,
  NumBuffers
};

enum IndexArg : int {
  Batch,
  Heads,
  SeqQ,
  SeqKV,
  QStrideB,
  QStrideH,
  QStrideN,
  KStrideB,
  KStrideH,
  KStrideN,
  VStrideB,
  VStrideH,
  VStrideN,
  OStrideB,
  OStrideH,
  OStrideN,
  WindowLeft,
  WindowRight,
  CountsStrideB,
  CountsStrideH,
  IndicesStrideB,
  IndicesStrideH,
  IndicesStrideM,
  NumIndexArgs
};

/// A score modifier's captured tensors (AttentionSpec::captures): f32
/// buffers after every other argument of the tiled function (`capture0`,
/// ...), kernel parameters after the f32 group (and before any tensor map).
/// At most this many per kernel.
constexpr int kMaxCaptures = 8;

/// Argument names, in order, as the tiled IR names them.
inline const char *bufferName(int i) {
  static const char *names[] = {"q",      "k",       "v",
                                "o",      "lse",     "counts",
                                "indices", "cu_seqlens_q", "cu_seqlens_kv"};
  return names[i];
}
inline const char *indexArgName(int i) {
  static const char *names[] = {
      "batch",      "heads",      "seq_q",     "seq_kv",    "q_sb",
      "q_sh",       "q_sn",       "k_sb",      "k_sh",      "k_sn",
      "v_sb",       "v_sh",       "v_sn",      "o_sb",      "o_sh",
      "o_sn",       "win_left",   "win_right", "counts_sb", "counts_sh",
      "indices_sb", "indices_sh", "indices_sm"};
  return names[i];
}

/// Element strides (b, h, n, d) of Q, K, V, O, and of the layout's counts
/// (b, h, m) and indices (b, h, m); the layout's are zero for a dense kernel.
struct TensorStrides {
  std::array<int64_t, 4> q{}, k{}, v{}, o{};
  std::array<int64_t, 3> counts{}, indices{};
};

/// The index arguments of a forward kernel, in IndexArg order: one place
/// for every launcher (CPU and GPU).
inline std::array<int64_t, NumIndexArgs>
indexArgs(const AttentionSpec &spec, const Problem &p, const TensorStrides &s) {
  std::array<int64_t, NumIndexArgs> idx{};
  idx[Batch] = p.batch;
  idx[Heads] = p.heads;
  idx[SeqQ] = p.seqLenQ;
  idx[SeqKV] = p.seqLenKV;
  for (int i = 0; i < 3; ++i) {
    idx[QStrideB + i] = s.q[i];
    idx[KStrideB + i] = s.k[i];
    idx[VStrideB + i] = s.v[i];
    idx[OStrideB + i] = s.o[i];
  }
  auto [left, right] = effectiveWindow(spec, p);
  idx[WindowLeft] = left;
  idx[WindowRight] = right;
  idx[CountsStrideB] = s.counts[0];
  idx[CountsStrideH] = s.counts[1];
  idx[IndicesStrideB] = s.indices[0];
  idx[IndicesStrideH] = s.indices[1];
  idx[IndicesStrideM] = s.indices[2];
  return idx;
}

/// The split-KV forward (FlashDecoding): two functions, `@f` (role
/// "forward_split") and `@f_combine` (role "combine"), over one argument
/// list, the forward's with two workspaces and the split count added:
///
///   buffers:  q, k, v, o, lse, counts, indices (as the forward's), then
///             o_part (f32 [S, B, H, Nq, dv], packed) and lse_part (f32
///             [S, B, H, Nq])
///   indices:  the forward's IndexArg values, then kv_splits (S >= 1)
///   f32:      scale * log2(e)
///   indices:  pid_m, pid_bh, pid_split
///
///   @f          pid_split = s in [0, S): the s-th of S equal runs of the
///               KV blocks that its rows see (some may be empty); writes
///               o_part[s] (O of those keys, normalised by their own l; 0
///               where none) and lse_part[s] (their lse; -inf where none).
///               With gqa > 1 and no block-sparse layout the query heads
///               of a KV head share its K/V tiles (GQA packing): pid_bh =
///               b * (H / gqa) + hk, pid_m a block of Br of the Nq * gqa
///               rows, row p being query p / gqa of head hk * gqa + p %
///               gqa; else pid_bh = b * H + h and pid_m a Q block.
///   @f_combine  pid_m = block of bwd::kRowBlockRows rows, pid_bh = b * H
///               + h, pid_split = c in [0, combineChunks(dv)): columns
///               [c * w, (c + 1) * w) (w = dv / chunks) of o, and lse, of
///               its rows from the S partials, each weighted by
///               exp(lse_s - lse); every chunk writes the same lse.
/// Run @f on a grid.z of S, then @f_combine on a grid.z of combineChunks.
namespace split {
enum Buffer : int { OPart = abi::NumBuffers, LsePart, NumBuffers };
/// The index argument after the forward's: the run's split count.
constexpr int KvSplits = abi::NumIndexArgs;
constexpr int NumIndexArgs = abi::NumIndexArgs + 1;
inline constexpr const char *kCombineSuffix = "_combine";
inline const char *bufferName(int i) {
  return i == OPart ? "o_part" : i == LsePart ? "lse_part" : abi::bufferName(i);
}
/// The merge's column chunks for V's head dim \p dv: the most programs a
/// row's merge spreads over such that each takes an equal chunk of at
/// least 32 columns (one per lane of the warp that merges the row): 4 at
/// dv = 128, 1 below 64. A row's merge is latency-bound on one warp (T25:
/// 16.5 us for 132 runs at dv = 128), so more warps per row shorten it.
inline int64_t combineChunks(int64_t dv) {
  for (int64_t k = dv / 32; k > 1; --k)
    if (dv % k == 0)
      return k;
  return 1;
}
/// Whether the split partial of \p spec packs GQA (its rows span the
/// query heads of one KV head): gqa > 1 and no block-sparse layout, whose
/// lists are per query head.
inline bool packsGqa(int64_t gqa, bool blockSparse) {
  return gqa > 1 && !blockSparse;
}
inline bool packsGqa(const AttentionSpec &spec) {
  return packsGqa(spec.gqaGroup, spec.blockSparse);
}
/// The partial's grid (x, y) for \p p with Br = \p blockM: blocks of the
/// Nq * gqa packed rows over batch * KV heads, or Q blocks over batch *
/// heads.
inline std::array<int64_t, 2> splitGrid(const AttentionSpec &spec,
                                        const Problem &p, int64_t blockM) {
  const int64_t g = packsGqa(spec) ? spec.gqaGroup : 1;
  return {(p.seqLenQ * g + blockM - 1) / blockM, p.batch * (p.heads / g)};
}
/// The split count for \p programs partial programs of \p kvBlocks KV
/// blocks each (their most) on \p processors SMs (host threads on the
/// CPU): enough programs for four per processor, each at least one block,
/// at most TileConfig::kMaxSplits; 1 when the grid fills the device. (H200,
/// decode B 16, 32 / 4 heads, Nkv 32K, one-warp programs: 2.4 programs per
/// SM reached 90% of the copy bandwidth, 3.9 100%; bench/NOTES.md, T11.)
inline int64_t chooseKvSplits(int64_t programs, int64_t kvBlocks,
                              int64_t processors) {
  const int64_t want =
      (4 * processors + programs - 1) / std::max<int64_t>(programs, 1);
  return std::max<int64_t>(1,
                           std::min({want, kvBlocks, TileConfig::kMaxSplits}));
}
/// The split count of a launch of the split tiling \p config for \p p:
/// its splits when given, else chooseKvSplits over splitGrid's programs
/// (Br = config.blockM) and the Bc blocks of Nkv, on \p processors (the
/// SMs; the CPU mode: host threads).
inline int64_t launchSplits(const AttentionSpec &spec, const Problem &p,
                            const TileConfig &config, int64_t processors) {
  if (config.splits > 0)
    return config.splits;
  auto [x, y] = splitGrid(spec, p, config.blockM);
  const int64_t bc = std::max<int64_t>(1, config.blockN);
  return chooseKvSplits(x * y, (p.seqLenKV + bc - 1) / bc,
                        std::max<int64_t>(1, processors));
}
} // namespace split

/// The block classification of a mask_mod region, built beside the
/// forward of a block-sparse description with a mask_mod
/// (dialects/Attn/Transforms/TileAttentionBlocks.cpp): two functions of
/// the forward's arguments (not the split ABI's) that read only the index
/// arguments and the captured tensors and write the layout, for each (b,
/// h) of the launch's batch x heads (the layout's: 1 where it broadcasts,
/// the mask then evaluated at 0), run one after the other:
///   @f_blocks       (role "mask_blocks") pid_m = qb * ceil(KB / kRows) +
///                   chunk: the class of KV blocks chunk * kRows + r of Q
///                   block qb, 0 (no element kept), 1 (some) or 2 (all),
///                   written to indices[b, h, qb, kb]; grid.x = QB *
///                   ceil(KB / kRows) (the launch's, recorded rows 1);
///   @f_blocks_list  (role "mask_blocks_list") pid_m = a group of kRows Q
///                   blocks: each row's classes compacted in place into the
///                   list of the KV blocks with a kept element, ascending,
///                   ~k for a full one (fullBlockEntry), and counts[b, h,
///                   qb]; the entries past a count keep their classes.
///                   grid.x = ceil(QB / kRows) (the launch's, recorded
///                   rows 1).
/// pid_bh = b * heads + h for both (kernels/HostTensor.h MaskBlocksLaunch
/// holds the index arguments and both program counts).
namespace blocks {
inline constexpr const char *kSuffix = "_blocks";
inline constexpr const char *kListSuffix = "_blocks_list";
/// KV blocks (@f_blocks) or Q blocks (@f_blocks_list) per program: one per
/// warp on the GPU.
constexpr int64_t kRows = 4;
/// Keys per tile of the evaluation (a block's keys in chunks of these).
constexpr int64_t kMaxColumns = 128;
} // namespace blocks

/// The backward kernels' argument list, shared by its three functions:
///
///   buffers:  q, k, v, o, do (element type; do shaped as o),
///             lse (f32 [B, H, Nq], from the forward; -inf: the row sees no
///             key), delta (f32 [2, B, H, Nq] workspace: rowsum(do * o),
///             then -lse * log2(e), -inf where lse = -inf; on both
///             targets),
///             dq_accum (f32 [B, H, Nq, dqk] workspace, row-major, logical
///             dqk, no padding; after delta in one workspace: atomic dQ
///             only, see below; a deterministic backward neither reads nor
///             writes it), dq, dk, dv (element type; shaped
///             as q, k, v), counts, indices (the forward's BCSR layout,
///             Q-major), kv_counts, kv_indices (the same layout transposed:
///             for each (b, h, sparse KV block) the sparse Q blocks that
///             list it), cu_seqlens_q, cu_seqlens_kv (i32, varlen only:
///             as the forward's; lse, delta and dq_accum keep their padded
///             rows)
///   indices:  the IndexArg values below, in order
///   f32:      scale * log2(e), scale
///   indices:  pid_m, pid_bh
///
/// lse, delta and dq_accum are packed. dQ comes in two modes, the
/// attn.flash_bwd's `deterministic` (AttentionSpec::deterministic,
/// dqAccumulation()), recorded with every function's role and tiling in its
/// `attn.kernel` (`deterministic`). What pid_m and pid_bh mean depends on
/// the function:
///   @f_preprocess  (role "preprocess") pid_m = block of kRowBlockRows
///                  rows, pid_bh = b * H + h: writes both halves of delta
///                  for those rows; atomic mode: also dq_accum[b, h, q,
///                  0 .. dqk) = 0.
///   @f             (role "main") pid_m = KV block of Bc keys,
///                  pid_bh = b * (H / gqa) + hk: walks the Q blocks that see
///                  the block, for every query head of the group, and writes
///                  dK and dV of its keys; atomic mode: also, for each row q
///                  of those blocks, dq_accum[b, h, q, :] += sum over its
///                  keys of dS[q, key] * K[key, :] (f32 atomic adds;
///                  unscaled; dS rounded to the element type, as for dK).
///   @f_dq          atomic mode (role "dq_convert"): pid_m = block of
///                  kRowBlockRows rows, pid_bh = b * H + h: dQ[b, h, q, c] =
///                  element_type(dq_accum[b, h, q, c] * scale) of its rows.
///                  Deterministic (role "dq"): pid_m = Q block of the
///                  function's own block_m rows (the pass's dq-block-m,
///                  block-m by default), pid_bh = b * H + h; walks the KV
///                  blocks its rows see and writes dQ of its rows (dQ by a
///                  separate pass over Q blocks: bit-identical run to run).
/// Run the grids in that order: @f_preprocess, @f, @f_dq.
namespace bwd {

enum Buffer : int {
  Q,
  K,
  V,
  O,
  DO,
  Lse,
  Delta,
  DqAccum,
  DQ,
  DK,
  DV,
  Counts,
  Indices,
  KvCounts,
  KvIndices,
  CuSeqQ,
  CuSeqKV,
  NumBuffers
};

enum IndexArg : int {
  Batch,
  Heads,
  SeqQ,
  SeqKV,
  QStrideB,
  QStrideH,
  QStrideN,
  KStrideB,
  KStrideH,
  KStrideN,
  VStrideB,
  VStrideH,
  VStrideN,
  OStrideB,
  OStrideH,
  OStrideN,
  DOStrideB,
  DOStrideH,
  DOStrideN,
  DQStrideB,
  DQStrideH,
  DQStrideN,
  DKStrideB,
  DKStrideH,
  DKStrideN,
  DVStrideB,
  DVStrideH,
  DVStrideN,
  WindowLeft,
  WindowRight,
  CountsStrideB,
  CountsStrideH,
  IndicesStrideB,
  IndicesStrideH,
  IndicesStrideM,
  KvCountsStrideB,
  KvCountsStrideH,
  KvIndicesStrideB,
  KvIndicesStrideH,
  KvIndicesStrideM,
  NumIndexArgs
};

/// The f32 arguments after the index arguments, then pid_m and pid_bh.
enum ScalarArg : int { ScaleLog2e, Scale, NumF32Args };

/// Rows per program of the row kernels: @f_preprocess and atomic dQ's
/// conversion (role "dq_convert"), whatever the tiling; on both targets
/// (GpuBackwardGeometry::kPreprocessRows is this), so that their grid is
/// ceil(Nq / kRowBlockRows) x (B * H).
constexpr int64_t kRowBlockRows = 64;

/// Suffixes of the three functions' names (the main one has none).
inline constexpr const char *kPreprocessSuffix = "_preprocess";
inline constexpr const char *kDqSuffix = "_dq";

/// Deterministic gradients of captured tensors (`deterministic` with
/// capture_grads: fixedPointCaptureGrads). Every function then takes, after
/// the captured tensors and their gradient buffers, two i64 accumulators
/// per captured tensor (`capture_hi<c>` of captureWords(size) elements,
/// `capture_lo<c>` of one more: element captureWords(size) counts the
/// contributions that were NaN or infinite; zero before the call) and then
/// each tensor's size (`capture_size<c>`, index). The main function splits each
/// contribution v exactly into hi = roundeven(v * 2^kCaptureHiBits) and
/// lo = roundeven((v - hi * 2^-kCaptureHiBits) * 2^kCaptureLoBits) and adds
/// them with integer adds, whose sum is the same bits in any order; then
/// `@f_capture_grad<c>` (role "capture_convert", one per captured tensor
/// with a gradient; pid_m = block of kRowBlockRows x kCaptureColumns
/// elements, pid_bh = 0) adds fma(float(hi), 2^-kCaptureHiBits, float(lo) *
/// 2^-kCaptureLoBits) into the gradient, or NaN into every element when a
/// contribution was not finite (the integer sums cannot carry a NaN).
/// Range: |gradient| < 2^38 (a larger word saturates); resolution 2^-56.
constexpr int kCaptureHiBits = 24;
constexpr int kCaptureLoBits = 56;
constexpr int64_t kCaptureColumns = 32;
inline constexpr const char *kCaptureGradSuffix = "_capture_grad";

/// Whether \p spec's captured gradients are summed in fixed point.
inline bool fixedPointCaptureGrads(const AttentionSpec &spec) {
  return spec.deterministic && spec.captureGrads != 0;
}
/// Where dq_accum starts in the backward's workspace, in bytes: after
/// delta's 2 * \p rows floats (rows = B * H * Nq), rounded up to 16 bytes
/// so that its rows (a multiple of 4 floats) are 16-byte aligned wherever
/// the workspace is, as the dK/dV kernel's bulk reductions want them.
inline int64_t dqAccumOffsetBytes(int64_t rows) {
  return (2 * rows * 4 + 15) / 16 * 16;
}
/// Elements of each accumulator word of a captured tensor of \p size
/// elements: whole rows of kCaptureColumns, which the conversion reads.
inline int64_t captureWords(int64_t size) {
  return (size + kCaptureColumns - 1) / kCaptureColumns * kCaptureColumns;
}
/// Programs of `@f_capture_grad<c>` for a tensor of \p size elements.
inline int64_t captureConvertPrograms(int64_t size) {
  return (captureWords(size) / kCaptureColumns + kRowBlockRows - 1) /
         kRowBlockRows;
}
/// Where the words live in one device workspace: captured tensor c's hi
/// words at hi[c] bytes (its lo words and their non-finite count right
/// after them), for each c with a gradient, in order, 256-byte aligned;
/// \p bytes in all.
struct CaptureWordLayout {
  std::array<int64_t, kMaxCaptures> hi{};
  int64_t bytes = 0;
};
inline CaptureWordLayout captureWordLayout(const AttentionSpec &spec,
                                           const int64_t *sizes) {
  CaptureWordLayout l;
  for (int64_t c = 0; fixedPointCaptureGrads(spec) && c < spec.captures; ++c)
    if ((spec.captureGrads >> c) & 1) {
      l.hi[size_t(c)] = l.bytes;
      l.bytes += (8 * (2 * captureWords(sizes[c]) + 1) + 255) / 256 * 256;
    }
  return l;
}

inline const char *bufferName(int i) {
  static const char *names[] = {"q",       "k",         "v",         "o",
                                "do",      "lse",       "delta",     "dq_accum",
                                "dq",      "dk",        "dv",        "counts",
                                "indices", "kv_counts", "kv_indices",
                                "cu_seqlens_q", "cu_seqlens_kv"};
  return names[i];
}
inline const char *indexArgName(int i) {
  static const char *names[] = {
      "batch",        "heads",         "seq_q",         "seq_kv",
      "q_sb",         "q_sh",          "q_sn",          "k_sb",
      "k_sh",         "k_sn",          "v_sb",          "v_sh",
      "v_sn",         "o_sb",          "o_sh",          "o_sn",
      "do_sb",        "do_sh",         "do_sn",         "dq_sb",
      "dq_sh",        "dq_sn",         "dk_sb",         "dk_sh",
      "dk_sn",        "dv_sb",         "dv_sh",         "dv_sn",
      "win_left",     "win_right",     "counts_sb",     "counts_sh",
      "indices_sb",   "indices_sh",    "indices_sm",    "kv_counts_sb",
      "kv_counts_sh", "kv_indices_sb", "kv_indices_sh", "kv_indices_sm"};
  return names[i];
}
inline const char *f32ArgName(int i) {
  static const char *names[] = {"scale_log2e", "scale"};
  return names[i];
}

/// Element strides of the backward's tensors (b, h, n, d) and of the
/// layout's arrays (b, h, m), both orientations; zero for a dense kernel.
struct BackwardStrides {
  std::array<int64_t, 4> q{}, k{}, v{}, o{}, dO{}, dq{}, dk{}, dv{};
  std::array<int64_t, 3> counts{}, indices{}, kvCounts{}, kvIndices{};
};

/// The tensors' strides of \p q .. \p dv: anything with a `strides`
/// (b, h, n, d) array (host or device tensors); the layout's stay zero.
template <typename Tensor>
BackwardStrides tensorStrides(const Tensor &q, const Tensor &k, const Tensor &v,
                              const Tensor &o, const Tensor &dO,
                              const Tensor &dq, const Tensor &dk,
                              const Tensor &dv) {
  BackwardStrides s;
  s.q = q.strides;
  s.k = k.strides;
  s.v = v.strides;
  s.o = o.strides;
  s.dO = dO.strides;
  s.dq = dq.strides;
  s.dk = dk.strides;
  s.dv = dv.strides;
  return s;
}

/// The index arguments of the backward kernels, in IndexArg order: one
/// place for the CPU and GPU launchers.
inline std::array<int64_t, NumIndexArgs> indexArgs(const AttentionSpec &spec,
                                                   const Problem &p,
                                                   const BackwardStrides &s) {
  std::array<int64_t, NumIndexArgs> idx{};
  idx[Batch] = p.batch;
  idx[Heads] = p.heads;
  idx[SeqQ] = p.seqLenQ;
  idx[SeqKV] = p.seqLenKV;
  const std::array<int64_t, 4> *tensors[] = {&s.q,  &s.k,  &s.v,  &s.o,
                                             &s.dO, &s.dq, &s.dk, &s.dv};
  for (int t = 0; t < 8; ++t)
    for (int i = 0; i < 3; ++i)
      idx[QStrideB + 3 * t + i] = (*tensors[t])[i];
  auto [left, right] = effectiveWindow(spec, p);
  idx[WindowLeft] = left;
  idx[WindowRight] = right;
  idx[CountsStrideB] = s.counts[0];
  idx[CountsStrideH] = s.counts[1];
  idx[IndicesStrideB] = s.indices[0];
  idx[IndicesStrideH] = s.indices[1];
  idx[IndicesStrideM] = s.indices[2];
  idx[KvCountsStrideB] = s.kvCounts[0];
  idx[KvCountsStrideH] = s.kvCounts[1];
  idx[KvIndicesStrideB] = s.kvIndices[0];
  idx[KvIndicesStrideH] = s.kvIndices[1];
  idx[KvIndicesStrideM] = s.kvIndices[2];
  return idx;
}

} // namespace bwd

} // namespace flashjit::abi

#endif // FLASHJIT_KERNELS_KERNELABI_H
