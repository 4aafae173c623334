//===- Varlen.cpp - Variable-length batches on the host -------------------===//
//
/// \file
/// Implements kernels/Varlen.h: random packed inputs, one sequence as a
/// dense problem of batch 1, and the float64 checks sequence by sequence.
//
//===----------------------------------------------------------------------===//

#include "kernels/Varlen.h"
#include "kernels/KernelABI.h"
#include "kernels/HalfFloat.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>

namespace flashjit {

std::vector<int32_t> offsetsOf(const std::vector<int64_t> &lengths) {
  std::vector<int32_t> cu(1, 0);
  for (int64_t len : lengths)
    cu.push_back(int32_t(cu.back() + len));
  return cu;
}

Problem varlenProblem(const Problem &like, const std::vector<int64_t> &lensQ,
                      const std::vector<int64_t> &lensKV) {
  if (lensQ.size() != lensKV.size() || lensQ.empty())
    throw SpecError(fmt::format("varlen: {} query lengths and {} key lengths; "
                                "expected one of each per sequence",
                                lensQ.size(), lensKV.size()));
  Problem p = like;
  p.batch = int64_t(lensQ.size());
  p.seqLenQ = std::max<int64_t>(1, *std::max_element(lensQ.begin(), lensQ.end()));
  p.seqLenKV =
      std::max<int64_t>(1, *std::max_element(lensKV.begin(), lensKV.end()));
  return p;
}

namespace {

/// A token-major (1, heads, rows, d) view of a fresh (rows, heads, d)
/// buffer.
HalfTensor tokenMajor(int64_t heads, int64_t rows, int64_t d) {
  HalfTensor t;
  t.buffer = std::make_shared<std::vector<uint16_t>>(
      size_t(std::max<int64_t>(1, rows * heads * d)));
  t.shape = {1, heads, rows, d};
  t.strides = {rows * heads * d, d, heads * d, 1};
  return t;
}

/// Rows [start, start + len) of \p t as a tensor of batch 1 (at least one
/// row: a view's shape must be a problem's).
HalfTensor rowsOf(const HalfTensor &t, int64_t start, int64_t len) {
  HalfTensor v = t;
  v.offset = t.offset + start * t.strides[2];
  v.shape[2] = std::max<int64_t>(1, len);
  return v;
}

/// A score function that sees batch \p b where it is given batch 0: the
/// sequence's own batch index, as the kernel passes it.
class ShiftedBatch final : public ScoreFunction {
public:
  ShiftedBatch(std::shared_ptr<const ScoreFunction> base, int64_t b)
      : base(std::move(base)), b(b) {}
  double apply(double score, int64_t batch, int64_t head, int64_t qIdx,
               int64_t kvIdx, const Captures *captures,
               double *dScore) const override {
    return base->apply(score, batch + b, head, qIdx, kvIdx, captures, dScore);
  }
  std::vector<CaptureRead> captureReads(double score, int64_t batch,
                                        int64_t head, int64_t qIdx,
                                        int64_t kvIdx,
                                        const Captures *captures) const override {
    return base->captureReads(score, batch + b, head, qIdx, kvIdx, captures);
  }

private:
  std::shared_ptr<const ScoreFunction> base;
  int64_t b;
};

/// Whether every element of rows [0, len) of \p t is exactly 0.
bool allZero(DType dtype, const HalfTensor &t, int64_t len) {
  for (int64_t h = 0; h < t.shape[1]; ++h)
    for (int64_t i = 0; i < len; ++i)
      for (int64_t c = 0; c < t.shape[3]; ++c)
        if (halfToFloat(dtype, t.at(0, h, i, c)) != 0.0f)
          return false;
  return true;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

} // namespace

AttentionData makeRandomVarlenInputs(const AttentionSpec &spec,
                                     const Problem &p,
                                     const std::vector<int64_t> &lensQ,
                                     const std::vector<int64_t> &lensKV,
                                     std::mt19937_64 &rng) {
  AttentionData d;
  d.cuSeqQ = offsetsOf(lensQ);
  d.cuSeqKV = offsetsOf(lensKV);
  const int64_t totalQ = d.cuSeqQ.back(), totalKV = d.cuSeqKV.back();
  const int64_t hkv = p.kvHeads(spec);
  d.q = tokenMajor(p.heads, totalQ, spec.headDimQK);
  d.k = tokenMajor(hkv, totalKV, spec.headDimQK);
  d.v = tokenMajor(hkv, totalKV, spec.headDimV);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto *buf : {d.q.buffer.get(), d.k.buffer.get(), d.v.buffer.get()})
    for (auto &x : *buf)
      x = floatToHalf(spec.dtype, normal(rng));
  d.o = tokenMajor(p.heads, totalQ, spec.headDimV);
  std::fill(d.o.buffer->begin(), d.o.buffer->end(),
            floatToHalf(spec.dtype, std::nanf("")));
  d.lse.assign(size_t(p.batch * p.heads * p.seqLenQ), std::nanf(""));
  return d;
}

/// Sequence \p b's part of varlen layout \p l: its batch row (or the
/// broadcast one), the first ceil(lenQ / S) Q blocks, and of each the
/// listed blocks below ceil(lenKV / S) (entries and full marks kept).
static BlockSparseLayout sequenceLayout(const BlockSparseLayout &l, int64_t b,
                                        int64_t lenQ, int64_t lenKV,
                                        int64_t sparseBlock) {
  const int64_t qb = (std::max<int64_t>(1, lenQ) + sparseBlock - 1) / sparseBlock;
  const int64_t kvb =
      (std::max<int64_t>(1, lenKV) + sparseBlock - 1) / sparseBlock;
  BlockSparseLayout s;
  s.batch = 1;
  s.heads = l.heads;
  s.qBlocks = qb;
  s.kvBlocks = kvb;
  s.counts.assign(size_t(l.heads * qb), 0);
  s.indices.assign(size_t(l.heads * qb * kvb), 0);
  auto cs = l.countStrides();
  auto is = l.indexStrides();
  const int64_t lb = l.batch == 1 ? 0 : b;
  for (int64_t h = 0; h < l.heads; ++h)
    for (int64_t r = 0; r < qb && r < l.qBlocks; ++r) {
      const int32_t *idx = &l.indices[lb * is[0] + h * is[1] + r * is[2]];
      int32_t n = 0;
      for (int32_t t = 0; t < l.counts[lb * cs[0] + h * cs[1] + r * cs[2]];
           ++t)
        if (abi::blockOfEntry(idx[t]) < kvb)
          s.indices[size_t((h * qb + r) * kvb + n++)] = idx[t];
      s.counts[size_t(h * qb + r)] = n;
    }
  return s;
}

VarlenSequence sequenceOf(const AttentionSpec &spec, const Problem &p,
                          const AttentionData &d, int64_t b,
                          const BlockSparseLayout *layout) {
  VarlenSequence s;
  const int64_t startQ = d.cuSeqQ.at(size_t(b)),
                startKV = d.cuSeqKV.at(size_t(b));
  s.lenQ = d.cuSeqQ.at(size_t(b + 1)) - startQ;
  s.lenKV = d.cuSeqKV.at(size_t(b + 1)) - startKV;
  s.spec = spec;
  s.spec.varlen = false;
  if (spec.scoreFunction)
    s.spec.scoreFunction = std::make_shared<ShiftedBatch>(spec.scoreFunction, b);
  if (spec.maskFunction)
    s.spec.maskFunction = std::make_shared<ShiftedBatch>(spec.maskFunction, b);
  s.problem = p;
  s.problem.batch = 1;
  s.problem.seqLenQ = std::max<int64_t>(1, s.lenQ);
  s.problem.seqLenKV = std::max<int64_t>(1, s.lenKV);
  if (layout && spec.blockSparse)
    s.layout = sequenceLayout(*layout, b, s.lenQ, s.lenKV, spec.sparseBlock);
  s.data.q = rowsOf(d.q, startQ, s.lenQ);
  s.data.o = rowsOf(d.o, startQ, s.lenQ);
  s.data.k = rowsOf(d.k, startKV, s.lenKV);
  s.data.v = rowsOf(d.v, startKV, s.lenKV);
  s.data.captures = d.captures;
  for (int64_t h = 0; h < p.heads; ++h)
    for (int64_t i = 0; i < s.problem.seqLenQ; ++i)
      s.data.lse.push_back(
          d.lse.at(size_t((b * p.heads + h) * p.seqLenQ + i)));
  return s;
}

AttentionGrads sequenceGrads(const AttentionData &d, const AttentionGrads &g,
                             int64_t b) {
  const int64_t startQ = d.cuSeqQ.at(size_t(b)),
                startKV = d.cuSeqKV.at(size_t(b));
  const int64_t lenQ = d.cuSeqQ.at(size_t(b + 1)) - startQ,
                lenKV = d.cuSeqKV.at(size_t(b + 1)) - startKV;
  AttentionGrads s;
  s.dO = rowsOf(g.dO, startQ, lenQ);
  s.dq = rowsOf(g.dq, startQ, lenQ);
  s.dk = rowsOf(g.dk, startKV, lenKV);
  s.dv = rowsOf(g.dv, startKV, lenKV);
  s.captureGrads = g.captureGrads;
  return s;
}

ErrorReport checkVarlenForward(const AttentionSpec &spec, const Problem &p,
                               const AttentionData &d, double maxWork,
                               int64_t *rowsChecked,
                               const BlockSparseLayout *layout) {
  ErrorReport worst;
  int64_t rows = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    VarlenSequence s = sequenceOf(spec, p, d, b, layout);
    if (s.lenQ == 0)
      continue;
    if (s.lenKV == 0) {
      // Every row sees no key: O = 0 and lse = -inf.
      if (!allZero(spec.dtype, s.data.o, s.lenQ))
        worst.oRelErr = kInf;
      for (float x : s.data.lse)
        worst.lseMismatch += !(std::isinf(x) && x < 0);
      rows += int64_t(s.data.lse.size());
      continue;
    }
    ReferenceResult ref =
        referenceForward(s.spec, s.problem, s.data,
                         s.layout ? &*s.layout : nullptr,
                         maxWork / double(p.batch));
    rows += int64_t(ref.rows.size());
    ErrorReport e = compareWithReference(s.spec, s.problem, s.data, ref);
    worst.oRelErr = std::max(worst.oRelErr, e.oRelErr);
    worst.lseRelErr = std::max(worst.lseRelErr, e.lseRelErr);
    worst.nanCount += e.nanCount;
    worst.lseMismatch += e.lseMismatch;
  }
  if (rowsChecked)
    *rowsChecked = rows;
  return worst;
}

BackwardErrorReport checkVarlenBackward(const AttentionSpec &spec,
                                        const Problem &p,
                                        const AttentionData &d,
                                        const AttentionGrads &g,
                                        double maxWork,
                                        const BlockSparseLayout *layout) {
  BackwardErrorReport worst;
  // The captured tensors' gradients sum over the sequences: compared with
  // the sum of every sequence's float64 ones, when every sequence's whole
  // reference fits the budget (a sampled one has none).
  double work = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    work += double(d.cuSeqQ.at(size_t(b + 1)) - d.cuSeqQ.at(size_t(b))) *
            double(d.cuSeqKV.at(size_t(b + 1)) - d.cuSeqKV.at(size_t(b))) *
            double(p.heads * std::max(spec.headDimQK, spec.headDimV));
  const bool captures = spec.captureGrads != 0 && work <= maxWork;
  std::vector<std::vector<double>> captureSum;
  for (int64_t b = 0; b < p.batch; ++b) {
    VarlenSequence s = sequenceOf(spec, p, d, b, layout);
    AttentionGrads sg = sequenceGrads(d, g, b);
    if (captures && s.lenQ && s.lenKV) {
      BackwardReference ref = referenceBackward(
          s.spec, s.problem, s.data, sg, s.layout ? &*s.layout : nullptr);
      BackwardErrorReport e = compareBackward(s.spec, s.problem, sg, ref);
      worst.dqRelErr = std::max(worst.dqRelErr, e.dqRelErr);
      worst.dkRelErr = std::max(worst.dkRelErr, e.dkRelErr);
      worst.dvRelErr = std::max(worst.dvRelErr, e.dvRelErr);
      worst.nanCount += e.nanCount;
      captureSum.resize(ref.captureGrads.size());
      for (size_t c = 0; c < ref.captureGrads.size(); ++c) {
        captureSum[c].resize(ref.captureGrads[c].size());
        for (size_t i = 0; i < ref.captureGrads[c].size(); ++i)
          captureSum[c][i] += ref.captureGrads[c][i];
      }
      continue;
    }
    if (s.lenQ == 0 || s.lenKV == 0) {
      // No query sees a key: zero gradients of the sequence's rows.
      if (s.lenQ && !allZero(spec.dtype, sg.dq, s.lenQ))
        worst.dqRelErr = kInf;
      if (s.lenKV && (!allZero(spec.dtype, sg.dk, s.lenKV) ||
                      !allZero(spec.dtype, sg.dv, s.lenKV)))
        worst.dkRelErr = kInf;
      continue;
    }
    BackwardErrorReport e =
        checkBackward(s.spec, s.problem, s.data, sg,
                      s.layout ? &*s.layout : nullptr,
                      maxWork / double(p.batch))
            .err;
    worst.dqRelErr = std::max(worst.dqRelErr, e.dqRelErr);
    worst.dkRelErr = std::max(worst.dkRelErr, e.dkRelErr);
    worst.dvRelErr = std::max(worst.dvRelErr, e.dvRelErr);
    worst.nanCount += e.nanCount;
  }
  if (captures) {
    // Sequences without a query or a key add nothing: zeros.
    captureSum.resize(g.captureGrads.size());
    for (size_t c = 0; c < g.captureGrads.size(); ++c)
      if ((spec.captureGrads >> c) & 1)
        captureSum[c].resize(g.captureGrads[c].size());
    compareCaptureGrads(g.captureGrads, captureSum, worst);
  }
  return worst;
}

} // namespace flashjit
