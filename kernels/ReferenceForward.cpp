//===- ReferenceForward.cpp - The float64 reference of the forward --------===//
//
/// \file
/// referenceForward (every row, or an even sample within a work bound) and
/// compareWithReference of HostTensor.h, with the visibility test and the
/// even sampling that the backward's reference shares (ReferenceInternal.h).
//
//===----------------------------------------------------------------------===//

#include "kernels/HostTensor.h"
#include "kernels/ReferenceInternal.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashjit {

namespace detail {

bool isVisible(const AttentionSpec &spec, const Problem &p,
               const BlockSparseLayout *layout, int64_t left, int64_t right,
               int64_t b, int64_t h, int64_t i, int64_t j) {
  int64_t diag = i + (p.seqLenKV - p.seqLenQ);
  if (j < diag - left || j > diag + right)
    return false;
  return !layout ||
         layout->contains(b % layout->batch, h % layout->heads,
                          i / spec.sparseBlock, j / spec.sparseBlock);
}

std::vector<int64_t> evenlySpaced(int64_t n, int64_t count) {
  count = std::clamp<int64_t>(count, 1, n);
  std::vector<int64_t> out;
  for (int64_t k = 0; k < count; ++k) {
    int64_t at = count == 1 ? 0 : k * (n - 1) / (count - 1);
    if (out.empty() || out.back() != at)
      out.push_back(at);
  }
  return out;
}

} // namespace detail

using detail::evenlySpaced;
using detail::isVisible;

/// The rows the reference checks: all of them, or a sample within maxWork.
static std::vector<int64_t> checkedRows(const AttentionSpec &spec,
                                        const Problem &p, double maxWork) {
  const int64_t bhCount = p.batch * p.heads, nq = p.seqLenQ;
  double perRow = double(p.seqLenKV) * double(spec.headDimQK + spec.headDimV);
  std::vector<int64_t> rows;
  if (double(bhCount * nq) * perRow <= maxWork) {
    for (int64_t r = 0; r < bhCount * nq; ++r)
      rows.push_back(r);
    return rows;
  }
  int64_t pairs = std::min<int64_t>(bhCount, 4);
  int64_t perPair = std::max<int64_t>(
      2, std::min<int64_t>(nq, int64_t(maxWork / perRow / double(pairs))));
  for (int64_t bh : evenlySpaced(bhCount, pairs))
    for (int64_t i : evenlySpaced(nq, perPair))
      rows.push_back(bh * nq + i);
  return rows;
}

ReferenceResult referenceForward(const AttentionSpec &spec, const Problem &p,
                                 const AttentionData &d,
                                 const BlockSparseLayout *layout,
                                 double maxWork) {
  const int64_t dqk = spec.headDimQK, dv = spec.headDimV;
  const int64_t Nq = p.seqLenQ, Nkv = p.seqLenKV;
  const double scale = p.effectiveScale(spec);
  auto [left, right] = effectiveWindow(spec, p);
  const ScoreMod mod = ScoreMod::of(spec).reading(&d.captures);
  ReferenceResult r;
  r.rows = checkedRows(spec, p, maxWork);
  r.o.assign(r.rows.size() * size_t(dv), 0.0);
  r.lse.assign(r.rows.size(), -std::numeric_limits<double>::infinity());
  std::vector<double> qrow(dqk), s(Nkv), kf, vf;
  int64_t widenedBH = -1;
  for (size_t ri = 0; ri < r.rows.size(); ++ri) {
    int64_t bh = r.rows[ri] / Nq, i = r.rows[ri] % Nq;
    int64_t b = bh / p.heads, h = bh % p.heads, hk = h / spec.gqaGroup;
    if (bh != widenedBH) { // widen this head's K and V once
      widenedBH = bh;
      kf.assign(size_t(Nkv * dqk), 0);
      vf.assign(size_t(Nkv * dv), 0);
      for (int64_t j = 0; j < Nkv; ++j) {
        for (int64_t c = 0; c < dqk; ++c)
          kf[j * dqk + c] = halfToFloat(spec.dtype, d.k.at(b, hk, j, c));
        for (int64_t c = 0; c < dv; ++c)
          vf[j * dv + c] = halfToFloat(spec.dtype, d.v.at(b, hk, j, c));
      }
    }
    for (int64_t c = 0; c < dqk; ++c)
      qrow[c] = halfToFloat(spec.dtype, d.q.at(b, h, i, c));
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < Nkv; ++j) {
      if (!isVisible(spec, p, layout, left, right, b, h, i, j)) {
        s[j] = -std::numeric_limits<double>::infinity();
        continue;
      }
      double acc = 0;
      for (int64_t c = 0; c < dqk; ++c)
        acc += qrow[c] * kf[j * dqk + c];
      s[j] = mod.apply(acc * scale, h, i, j, b);
      m = std::max(m, s[j]);
    }
    if (m == -std::numeric_limits<double>::infinity())
      continue; // sees no key: O = 0, lse = -inf
    double l = 0;
    double *o = &r.o[ri * dv];
    for (int64_t j = 0; j < Nkv; ++j) {
      if (s[j] == -std::numeric_limits<double>::infinity())
        continue;
      double pj = std::exp(s[j] - m);
      l += pj;
      for (int64_t c = 0; c < dv; ++c)
        o[c] += pj * vf[j * dv + c];
    }
    for (int64_t c = 0; c < dv; ++c)
      o[c] /= l;
    r.lse[ri] = m + std::log(l);
  }
  return r;
}

double ErrorReport::relErr() const {
  if (nanCount || lseMismatch)
    return std::numeric_limits<double>::infinity();
  return std::max(oRelErr, lseRelErr);
}

ErrorReport compareWithReference(const AttentionSpec &spec, const Problem &p,
                                 const AttentionData &d,
                                 const ReferenceResult &ref) {
  ErrorReport e;
  const int64_t dv = spec.headDimV;
  double num = 0, den = 0, lnum = 0, lden = 0;
  for (size_t ri = 0; ri < ref.rows.size(); ++ri) {
    int64_t row = ref.rows[ri];
    int64_t bh = row / p.seqLenQ, i = row % p.seqLenQ;
    for (int64_t c = 0; c < dv; ++c) {
      double x =
          halfToFloat(spec.dtype, d.o.at(bh / p.heads, bh % p.heads, i, c));
      double y = ref.o[ri * dv + c];
      if (std::isnan(x)) {
        ++e.nanCount;
        continue;
      }
      num += (x - y) * (x - y);
      den += y * y;
    }
    double x = d.lse[row], y = ref.lse[ri];
    if (std::isnan(x)) {
      ++e.nanCount;
      continue;
    }
    if (std::isinf(y) || std::isinf(x)) {
      if (x != y)
        ++e.lseMismatch;
      continue;
    }
    lnum += (x - y) * (x - y);
    lden += y * y;
  }
  // A reference of all zeros (every row masked) is matched by exact zeros.
  e.oRelErr = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  e.lseRelErr = lden > 0 ? std::sqrt(lnum / lden) : std::sqrt(lnum);
  return e;
}

} // namespace flashjit
