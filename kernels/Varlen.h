//===- Varlen.h - Variable-length batches on the host -----------*- C++ -*-===//
//
/// \file
/// Host-side helpers of variable-length packing (AttentionSpec::varlen):
/// the sequences of a batch one after another in (total_tokens, heads, d)
/// tensors, with [B + 1] offsets. Random inputs in that layout, each
/// sequence as a dense problem of its own (views into the packed tensors),
/// and the float64 checks of the forward and the backward, one sequence at
/// a time. Plain C++, shared by the tests, the CLI and the C API's checks.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_VARLEN_H
#define FLASHJIT_KERNELS_VARLEN_H

#include "kernels/HostTensor.h"

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace flashjit {

/// The offsets [0, l0, l0 + l1, ...] of sequences of lengths \p lengths.
std::vector<int32_t> offsetsOf(const std::vector<int64_t> &lengths);

/// The problem of a varlen batch of sequences of \p lensQ queries and
/// \p lensKV keys (one entry per sequence, the same count): batch B, the
/// longest of each (at least 1), \p heads, scale and window from \p like.
Problem varlenProblem(const Problem &like, const std::vector<int64_t> &lensQ,
                      const std::vector<int64_t> &lensKV);

/// Fresh random inputs of a varlen batch: q, k, v token-major (1, H,
/// total, d) views of (total, H, d) buffers, normal(0, 1) rounded to the
/// dtype; o token-major and lse ([B, H, longest] padded) poisoned with
/// NaN; the offsets in cuSeqQ, cuSeqKV.
AttentionData makeRandomVarlenInputs(const AttentionSpec &spec,
                                     const Problem &problem,
                                     const std::vector<int64_t> &lensQ,
                                     const std::vector<int64_t> &lensKV,
                                     std::mt19937_64 &rng);

/// Sequence \p b of a varlen batch as a dense problem of batch 1.
struct VarlenSequence {
  int64_t lenQ = 0, lenKV = 0;
  AttentionSpec spec; ///< the varlen spec without varlen
  Problem problem;    ///< batch 1, the sequence's lengths (if both >= 1)
  /// Views of the sequence's rows of q, k, v, o; its rows of lse (copied).
  AttentionData data;
  /// With a block-sparse layout: the sequence's (its batch row, its
  /// blocks; blocks the layout lists past its keys dropped, full marks
  /// kept). A varlen layout is [B, H, ceil(max_q / S), ceil(max_kv / S)],
  /// blocks counted from each sequence's start.
  std::optional<BlockSparseLayout> layout;
};
VarlenSequence sequenceOf(const AttentionSpec &spec, const Problem &p,
                          const AttentionData &d, int64_t b,
                          const BlockSparseLayout *layout = nullptr);
/// The gradients' views of sequence \p b (dO, dq like q; dk, dv like k).
AttentionGrads sequenceGrads(const AttentionData &d, const AttentionGrads &g,
                             int64_t b);

/// The forward's float64 check, sequence by sequence: the largest errors
/// of any sequence (compareWithReference). A sequence without keys must
/// give O = 0 and lse = -inf (else counted in lseMismatch / oRelErr inf).
/// Each sequence's reference is bounded by \p maxWork / B
/// (referenceForward's budget: past it, sampled rows); \p rowsChecked, if
/// given, receives the rows compared.
ErrorReport checkVarlenForward(const AttentionSpec &spec, const Problem &p,
                               const AttentionData &d, double maxWork = 1e300,
                               int64_t *rowsChecked = nullptr,
                               const BlockSparseLayout *layout = nullptr);

/// The backward's float64 check, sequence by sequence (checkBackward, each
/// within \p maxWork / B): the largest errors of dQ, dK, dV; nanCount over
/// every sequence's gradients. A sequence without keys must give dQ = 0,
/// one without queries dK = dV = 0 (else an error of inf). The captured
/// tensors' gradients (spec.captureGrads), which sum over the sequences,
/// are compared with the sum of the sequences' float64 ones when every
/// sequence's whole reference fits \p maxWork (capturesChecked).
BackwardErrorReport checkVarlenBackward(const AttentionSpec &spec,
                                        const Problem &p,
                                        const AttentionData &d,
                                        const AttentionGrads &g,
                                        double maxWork = 1e300,
                                        const BlockSparseLayout *layout = nullptr);

} // namespace flashjit

#endif // FLASHJIT_KERNELS_VARLEN_H
