//===- HostTensor.h - Host-side tensors, layouts and the reference -*- C++ -*-//
//
/// \file
/// Host data for running and checking a kernel: strided (B, H, N, d) views of
/// 16-bit buffers, the block-sparse layout in BCSR form, random inputs, the
/// float64 reference attention and the error measure. No MLIR here.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_HOSTTENSOR_H
#define FLASHJIT_KERNELS_HOSTTENSOR_H

#include "kernels/AttentionSpec.h"
#include "kernels/KernelABI.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace flashjit {

/// A (B, H, N, d) view of a buffer of 16-bit elements (bf16 or fp16 bits).
/// Outer strides are arbitrary (in elements); the innermost must be 1.
struct HalfTensor {
  std::shared_ptr<std::vector<uint16_t>> buffer;
  int64_t offset = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> strides{};

  /// A packed (contiguous) tensor of the given shape.
  static HalfTensor packed(std::array<int64_t, 4> shape);
  uint16_t &at(int64_t b, int64_t h, int64_t n, int64_t d) {
    return (*buffer)[offset + b * strides[0] + h * strides[1] + n * strides[2] +
                     d * strides[3]];
  }
  uint16_t at(int64_t b, int64_t h, int64_t n, int64_t d) const {
    return (*buffer)[offset + b * strides[0] + h * strides[1] + n * strides[2] +
                     d * strides[3]];
  }
  /// Throws SpecError (naming \p what) if the innermost stride is not 1 or
  /// the view reaches outside its buffer.
  void checkLayout(const char *what) const;
};

/// Q, K, V and the outputs of one forward problem.
struct AttentionData {
  HalfTensor q, k, v, o;
  std::vector<float> lse; ///< [B, H, Nq], packed.
  /// The score modifier's captured tensors (AttentionSpec::captures).
  Captures captures;
  /// Varlen (AttentionSpec::varlen): q, o shaped (1, H, total_q, d) and
  /// k, v (1, Hkv, total_kv, d), the sequences one after another; these
  /// are their [B + 1] offsets (kernels/KernelABI.h). Empty otherwise.
  std::vector<int32_t> cuSeqQ, cuSeqKV;
};

/// Throws SpecError naming \p what unless \p cu holds \p batch + 1
/// offsets that start at 0 and never decrease, no sequence longer than
/// \p longest, the last at most \p rows (the packed tensor's).
void checkSeqOffsets(const char *what, const std::vector<int32_t> &cu,
                     int64_t batch, int64_t longest, int64_t rows);

/// Throws SpecError unless \p d suits \p spec and \p p: with varlen, one
/// packed batch per tensor and valid offsets (checkSeqOffsets); without,
/// no offsets.
void checkVarlenData(const AttentionSpec &spec, const Problem &p,
                     const AttentionData &d);

/// How Q, K and V are laid out in memory.
enum class QKVLayout {
  Separate, ///< three packed tensors
  Packed,   ///< one (B, N, 3, H, d) buffer, as a fused qkv projection makes
};

/// The bytes of the file \p path, at most \p maxBytes of them: a missing
/// file, a directory or a longer file (a device such as /dev/zero included:
/// the read stops at the bound) is a SpecError whose message starts with
/// \p what.
std::string readBoundedFile(const std::string &path, const std::string &what,
                            int64_t maxBytes);

/// The largest layout file BlockSparseLayout::readText reads: 64 MiB (about
/// 5,800 x 5,800 blocks of "0 "/"1 ").
constexpr int64_t kMaxLayoutFileBytes = int64_t(64) << 20;

/// Block-sparse layout in BCSR form (as FlexAttention's BlockMask): for each
/// (batch, head, sparse Q block) a count and a list of sparse KV block
/// indices. Batch or heads of 1 broadcast.
struct BlockSparseLayout {
  int64_t batch = 1, heads = 1;
  int64_t qBlocks = 0, kvBlocks = 0;
  std::vector<int32_t> counts;  ///< [batch, heads, qBlocks]
  std::vector<int32_t> indices; ///< [batch, heads, qBlocks, kvBlocks]

  /// From a dense block matrix [batch][heads][qBlocks][kvBlocks]: 0 not
  /// listed, 1 listed, 2 listed as full (abi::fullBlockEntry: a mask_mod
  /// keeps all its elements, so the kernel does not evaluate it there).
  static BlockSparseLayout fromDense(int64_t batch, int64_t heads,
                                     int64_t qBlocks, int64_t kvBlocks,
                                     const std::vector<uint8_t> &dense);
  /// Each block kept with probability \p density (per batch and head).
  static BlockSparseLayout random(int64_t batch, int64_t heads, int64_t qBlocks,
                                  int64_t kvBlocks, double density,
                                  uint64_t seed);
  /// Reads the text format: one line per sparse Q block, whitespace-
  /// separated 0/1/2 (2: full) per KV block; broadcast over batch and
  /// heads. Throws
  /// SpecError for a directory, a missing file or one that holds more than
  /// kMaxLayoutFileBytes (read no further: /dev/zero is refused at once).
  static BlockSparseLayout readText(const std::string &path);
  /// Is KV block \p kb listed (full or not) for (b, h, qb)?
  bool contains(int64_t b, int64_t h, int64_t qb, int64_t kb) const;
  /// Element strides of counts (b, h, qb); 0 where broadcast.
  std::array<int64_t, 3> countStrides() const;
  /// Element strides of indices (b, h, qb); the last dim is contiguous.
  std::array<int64_t, 3> indexStrides() const;
  /// Throws SpecError if it cannot serve \p problem at \p sparseBlock: its
  /// shape, a count or index out of range, or a KV block listed twice in a
  /// row (the forward would count it twice; the backward's transposed()
  /// refuses it too).
  void checkFits(const Problem &problem, int64_t sparseBlock) const;
  double density() const;
  /// The KV-major layout the backward's main loop walks: row kb lists, in
  /// increasing order, the Q blocks whose rows list kb. Its qBlocks field
  /// counts KV blocks and kvBlocks Q blocks; batch and heads as here.
  /// Throws SpecError if a row lists a KV block twice; indices must be in
  /// range (checkFits).
  BlockSparseLayout transposed() const;
};

/// Throws SpecError unless \p spec's mask_mod can classify blocks for
/// \p problem into a \p batch x \p heads layout (kernels/KernelABI.h
/// abi::blocks): block-sparse with a mask_mod region, and each of batch,
/// heads the problem's or 1 (varlen: batch the sequences').
void checkMaskBlocksArgs(const AttentionSpec &spec, const Problem &problem,
                         int64_t batch, int64_t heads);
/// A classification of a \p batch x \p heads layout of \p problem
/// (kernels/KernelABI.h abi::blocks), the same on the CPU and the GPU: the
/// layout's dims (no storage), the index arguments (the problem with the
/// layout's batch, heads and strides) and the programs along grid.x of
/// @f_blocks (Q blocks x groups of kRows KV blocks) and of @f_blocks_list
/// (groups of kRows Q blocks); grid.y is batch * heads. SpecError as
/// checkMaskBlocksArgs, and for a layout past 2^31 entries (the
/// classification addresses it in i32).
struct MaskBlocksLaunch {
  BlockSparseLayout shape;
  std::array<int64_t, abi::NumIndexArgs> index{};
  int64_t classPrograms = 0, listPrograms = 0;
  /// The layout of shape, counts and indices zero: what it fills.
  BlockSparseLayout layout() const;
};
MaskBlocksLaunch maskBlocksLaunch(const AttentionSpec &spec,
                                  const Problem &problem, int64_t batch,
                                  int64_t heads);

/// The float64 reference's classification of \p spec's mask_mod (its
/// maskFunction, with \p captures) on every element of every block pair of
/// a \p batch x \p heads layout of \p problem: listed where it keeps an
/// element, full where it keeps all. Varlen: sequence b's blocks from
/// \p cuSeqQ, \p cuSeqKV (AttentionData's), its positions its own; none
/// past its end. Cost: batch * heads * Nq * Nkv evaluations.
BlockSparseLayout referenceMaskBlocks(const AttentionSpec &spec,
                                      const Problem &problem,
                                      const Captures &captures, int64_t batch,
                                      int64_t heads,
                                      const std::vector<int32_t> &cuSeqQ = {},
                                      const std::vector<int32_t> &cuSeqKV = {});
/// Whether \p a and \p b have the same shape, counts and entries up to
/// each count (what a kernel reads).
bool sameListedBlocks(const BlockSparseLayout &a, const BlockSparseLayout &b);

/// Fresh random inputs: normal(0, 1) rounded to the dtype; outputs poisoned
/// with NaN so that an element the kernel never writes fails the check.
AttentionData makeRandomInputs(const AttentionSpec &spec,
                               const Problem &problem, QKVLayout layout,
                               std::mt19937_64 &rng);

/// Float64 reference of the forward pass on the (rounded) inputs, for the
/// rows it checks: every row, or for large problems an even sample.
struct ReferenceResult {
  std::vector<int64_t> rows; ///< checked rows, as (b * H + h) * Nq + i
  std::vector<double> o;     ///< [rows, dv]
  std::vector<double> lse;   ///< [rows]; -inf for rows that see no key
};
/// \p maxWork bounds rows * Nkv * (dqk + dv) summed over the checked rows;
/// past it, up to 4 (batch, head) pairs and evenly spaced rows (always the
/// first and last) are checked.
ReferenceResult referenceForward(const AttentionSpec &spec,
                                 const Problem &problem,
                                 const AttentionData &data,
                                 const BlockSparseLayout *layout,
                                 double maxWork = 1e300);

/// ||out - ref|| / ||ref|| over O and the finite lse entries (the larger of
/// the two); +inf if any output is NaN or lse's -inf pattern differs.
struct ErrorReport {
  double oRelErr = 0, lseRelErr = 0;
  int64_t nanCount = 0, lseMismatch = 0;
  double relErr() const;
};
ErrorReport compareWithReference(const AttentionSpec &spec,
                                 const Problem &problem,
                                 const AttentionData &data,
                                 const ReferenceResult &ref);
/// The backward's gradients and its incoming gradient dO. dq is shaped as
/// q, dk as k, dv as v and dO as o.
struct AttentionGrads {
  HalfTensor dO, dq, dk, dv;
  /// The gradients of the captured tensors that the backward spec's
  /// captureGrads names (each the size of its tensor; added into, so zero
  /// them first); empty for the others.
  Captures captureGrads;
};

/// Fresh random dO (normal(0, 1) rounded to the dtype) and dq, dk, dv
/// poisoned with NaN; zeroed gradients of the captured tensors that
/// spec.captureGrads names. When q, k and v are views of one packed qkv buffer,
/// dq, dk and dv are views of one such buffer too (as a fused projection's
/// gradient is).
AttentionGrads makeRandomGrads(const AttentionSpec &spec,
                               const Problem &problem,
                               const AttentionData &data, std::mt19937_64 &rng);

/// Float64 gradients of the naive attention on the (rounded) inputs:
/// S = scale Q K^T masked, P = softmax(S) (rows that see no key: P = 0),
/// dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D),
/// dQ = scale dS K, dK = scale dS^T Q; GQA sums dK and dV over the query
/// heads of a group. D = rowsum(P * dP) for the exact O; the reference takes
/// it from data.o, the O the backward is given (the forward's output rounded
/// to the element type, as a user has it), since that rounding alone moves
/// dS = P * (dP - D) by up to ~1e-2 relative at small head dims where P is
/// peaked (dP - D is small there). So data.o must hold the forward's output.
/// Packed: dq [B, H, Nq, dqk], dk [B, Hkv, Nkv, dqk], dv [B, Hkv, Nkv, dv].
/// Costs B * H * Nq * Nkv * 2 (dqk + dv) multiply-adds.
struct BackwardReference {
  std::vector<double> dq, dk, dv;
  /// The gradients of the captured tensors spec.captureGrads names (each
  /// its tensor's size; empty for the others): sum over the visible scores
  /// of G * d(score')/d(element) at each element a load read, G = P (dP -
  /// D) the gradient of the modified score.
  std::vector<std::vector<double>> captureGrads;
};
BackwardReference referenceBackward(const AttentionSpec &spec,
                                    const Problem &problem,
                                    const AttentionData &data,
                                    const AttentionGrads &grads,
                                    const BlockSparseLayout *layout);

/// ||out - ref|| / ||ref|| of each gradient; relErr() is the largest, +inf
/// if any gradient element is NaN.
struct BackwardErrorReport {
  double dqRelErr = 0, dkRelErr = 0, dvRelErr = 0;
  /// The largest of the captured tensors' gradients' (0 without any), and
  /// whether they were compared (a sampled check does not).
  double captureRelErr = 0;
  bool capturesChecked = false;
  int64_t nanCount = 0;
  double relErr() const;
};
BackwardErrorReport compareBackward(const AttentionSpec &spec,
                                    const Problem &problem,
                                    const AttentionGrads &grads,
                                    const BackwardReference &ref);
/// The captured tensors' part of compareBackward: \p got against \p want
/// (BackwardReference::captureGrads; empty entries are not compared) into
/// \p e's captureRelErr (the largest), capturesChecked and nanCount.
void compareCaptureGrads(const Captures &got,
                         const std::vector<std::vector<double>> &want,
                         BackwardErrorReport &e);

/// A float64 check of chosen gradient entries, for problems too large for
/// referenceBackward: dQ of the query rows \p rows (as (b * H + h) * Nq + i)
/// and dK, dV of the keys \p keys (as (b * Hkv + hk) * Nkv + j), each at
/// O(N * d) cost instead of O(N^2 * d) for the whole. P = exp(S - lse) takes
/// lse from data.lse, the forward's f32 output (every row's softmax is the
/// full O(N^2 d)): it checks the backward on the forward's outputs, the
/// forward being checked on its own. D = rowsum(dO * O) from data.o, as
/// referenceBackward takes it.
struct SampledBackwardReference {
  std::vector<int64_t> rows, keys;
  std::vector<double> dq, dk, dv; ///< [rows, dqk], [keys, dqk], [keys, dv]
};
SampledBackwardReference
referenceBackwardSampled(const AttentionSpec &spec, const Problem &problem,
                         const AttentionData &data, const AttentionGrads &grads,
                         const BlockSparseLayout *layout,
                         std::vector<int64_t> rows, std::vector<int64_t> keys);

/// compareBackward over the sampled entries only (nanCount counts NaN among
/// them).
BackwardErrorReport compareBackwardSampled(const AttentionSpec &spec,
                                           const Problem &problem,
                                           const AttentionGrads &grads,
                                           const SampledBackwardReference &ref);

/// What a bounded float64 check of the backward covered.
struct BackwardCheck {
  BackwardErrorReport err;  ///< nanCount over every gradient element
  int64_t checkedHeads = 0; ///< query heads whose gradients were compared
  /// When sampled: the dQ rows and dK/dV keys compared (else all of them).
  std::optional<int64_t> sampledRows, sampledKeys;
};

/// Checks the gradients against float64 within about \p maxWork
/// multiply-adds, counting work as heads * Nq * Nkv * max(dqk, dv): every
/// head (referenceBackward); else batch 0's first KV head with its query
/// heads, whose gradients depend on that group only (referenceBackward on
/// that sub-problem); else, in that group, an even sample of query rows
/// (dQ) and keys (dK, dV) (referenceBackwardSampled). NaN is counted over
/// every gradient element either way. Captured tensors' gradients (sums
/// over every head and row) are compared only in the first scope
/// (err.capturesChecked).
BackwardCheck checkBackward(const AttentionSpec &spec, const Problem &problem,
                            const AttentionData &data,
                            const AttentionGrads &grads,
                            const BlockSparseLayout *layout, double maxWork);

/// NaN elements of a (B, H, N, d) view.
int64_t countNaN(DType dtype, const HalfTensor &t);

/// A (B, H, N, d) view widened to float32, packed (for .npy output).
std::vector<float> widenToFloat(DType dtype, const HalfTensor &t);

/// The accepted relative error for \p dtype.
double errorBound(DType dtype);

/// Element conversions for \p dtype.
float halfToFloat(DType dtype, uint16_t bits);
uint16_t floatToHalf(DType dtype, float value);

/// Writes \p t, widened to float32 in logical (B, H, N, d) order, as .npy.
void writeHalfNpy(const std::string &path, DType dtype, const HalfTensor &t);

/// --dump-io: q, k, v, o, lse and (if any) the layout's counts and indices
/// as q.npy, ..., layout_counts.npy, layout_indices.npy in \p dir (made if
/// missing).
void dumpForwardIO(const std::string &dir, const AttentionSpec &spec,
                   const Problem &problem, const AttentionData &data,
                   const BlockSparseLayout *layout);

/// Makes \p dir (and its parents) if missing and checks that a file can be
/// made in it; throws SpecError ("--dump-io: ...", with the system's reason)
/// otherwise. dumpForwardIO calls it; the CLI also calls it before a run.
void prepareDumpDirectory(const std::string &dir);

/// Writes a float32 / int32 .npy file; throws SpecError (a
/// std::runtime_error) naming the path and the system's reason on failure,
/// a full disk included.
void writeNpyF32(const std::string &path, const std::vector<int64_t> &shape,
                 const std::vector<float> &values);
void writeNpyI32(const std::string &path, const std::vector<int64_t> &shape,
                 const std::vector<int32_t> &values);

/// Reads a .npy file (version 1.x or 2.x, C order, little-endian float32,
/// float64, int32 or int64, any shape) as float32 values in C order, e.g.
/// a captured tensor of `run --capture`; an integer must be exact in f32
/// (|x| <= 2^24). Throws SpecError naming the path and what is wrong.
std::vector<float> readNpyAsF32(const std::string &path);

} // namespace flashjit

#endif // FLASHJIT_KERNELS_HOSTTENSOR_H
