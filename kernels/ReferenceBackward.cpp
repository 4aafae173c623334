//===- ReferenceBackward.cpp - The float64 reference of the backward ------===//
//
/// \file
/// The backward's float64 checks of HostTensor.h: referenceBackward (every
/// gradient), referenceBackwardSampled (chosen dQ rows and dK/dV keys, for
/// problems too large for the whole), their comparisons, and checkBackward,
/// which picks one of them within a work bound.
//
//===----------------------------------------------------------------------===//

#include "kernels/HostTensor.h"
#include "kernels/ReferenceInternal.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <map>

namespace flashjit {

using detail::evenlySpaced;
using detail::isVisible;

BackwardReference referenceBackward(const AttentionSpec &spec, const Problem &p,
                                    const AttentionData &d,
                                    const AttentionGrads &g,
                                    const BlockSparseLayout *layout) {
  const int64_t dqk = spec.headDimQK, dv = spec.headDimV;
  const int64_t Nq = p.seqLenQ, Nkv = p.seqLenKV, H = p.heads;
  const int64_t Hkv = p.kvHeads(spec);
  const double scale = p.effectiveScale(spec);
  const double negInf = -std::numeric_limits<double>::infinity();
  const ScoreMod mod = ScoreMod::of(spec).reading(&d.captures);
  auto [left, right] = effectiveWindow(spec, p);
  BackwardReference r;
  r.dq.assign(size_t(p.batch * H * Nq * dqk), 0.0);
  r.dk.assign(size_t(p.batch * Hkv * Nkv * dqk), 0.0);
  r.dv.assign(size_t(p.batch * Hkv * Nkv * dv), 0.0);
  r.captureGrads.resize(d.captures.size());
  for (size_t c = 0; c < d.captures.size(); ++c)
    if ((spec.captureGrads >> c) & 1)
      r.captureGrads[c].assign(d.captures[c].size(), 0.0);
  std::vector<double> kf, vf, qrow(dqk), dorow(dv), s(Nkv), dp(Nkv),
      dmod(Nkv), scaled(Nkv);
  auto widen = [&](uint16_t x) { return double(halfToFloat(spec.dtype, x)); };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t hk = h / spec.gqaGroup;
      if (h % spec.gqaGroup == 0) { // widen this KV head's K and V once
        kf.assign(size_t(Nkv * dqk), 0);
        vf.assign(size_t(Nkv * dv), 0);
        for (int64_t j = 0; j < Nkv; ++j) {
          for (int64_t c = 0; c < dqk; ++c)
            kf[j * dqk + c] = widen(d.k.at(b, hk, j, c));
          for (int64_t c = 0; c < dv; ++c)
            vf[j * dv + c] = widen(d.v.at(b, hk, j, c));
        }
      }
      double *dkHead = &r.dk[size_t((b * Hkv + hk) * Nkv * dqk)];
      double *dvHead = &r.dv[size_t((b * Hkv + hk) * Nkv * dv)];
      for (int64_t i = 0; i < Nq; ++i) {
        for (int64_t c = 0; c < dqk; ++c)
          qrow[c] = widen(d.q.at(b, h, i, c));
        for (int64_t c = 0; c < dv; ++c)
          dorow[c] = widen(g.dO.at(b, h, i, c));
        double m = negInf;
        for (int64_t j = 0; j < Nkv; ++j) {
          s[j] = negInf;
          if (!isVisible(spec, p, layout, left, right, b, h, i, j))
            continue;
          double acc = 0;
          for (int64_t c = 0; c < dqk; ++c)
            acc += qrow[c] * kf[j * dqk + c];
          scaled[j] = acc * scale;
          s[j] = mod.apply(acc * scale, h, i, j, b);
          dmod[j] = mod.derivative(acc * scale, h, i, j, b);
          m = std::max(m, s[j]);
        }
        if (m == negInf)
          continue; // sees no key: P = 0, no gradient flows through the row
        double l = 0;
        for (int64_t j = 0; j < Nkv; ++j)
          if (s[j] != negInf)
            l += std::exp(s[j] - m);
        for (int64_t j = 0; j < Nkv; ++j) {
          if (s[j] == negInf)
            continue;
          s[j] = std::exp(s[j] - m) / l; // now P
          double acc = 0;
          for (int64_t c = 0; c < dv; ++c)
            acc += dorow[c] * vf[j * dv + c];
          dp[j] = acc;
        }
        // D = rowsum(P * dP) = rowsum(dO * O), from the O the backward is
        // given (the forward's, rounded to the element type): see the header.
        double delta = 0;
        for (int64_t c = 0; c < dv; ++c)
          delta += dorow[c] * widen(d.o.at(b, h, i, c));
        double *dq = &r.dq[size_t(((b * H + h) * Nq + i) * dqk)];
        for (int64_t j = 0; j < Nkv; ++j) {
          if (s[j] == negInf)
            continue;
          // dS is the gradient of the scaled score, before the modifier;
          // the captured tensors' take the modified score's.
          double pj = s[j], g = pj * (dp[j] - delta), ds = g * dmod[j];
          if (spec.captureGrads)
            for (const ScoreFunction::CaptureRead &read :
                 mod.captureReads(scaled[j], h, i, j, b))
              if ((spec.captureGrads >> read.capture) & 1)
                r.captureGrads[size_t(read.capture)][size_t(read.index)] +=
                    g * read.derivative;
          for (int64_t c = 0; c < dqk; ++c) {
            dq[c] += scale * ds * kf[j * dqk + c];
            dkHead[j * dqk + c] += scale * ds * qrow[c];
          }
          for (int64_t c = 0; c < dv; ++c)
            dvHead[j * dv + c] += pj * dorow[c];
        }
      }
    }
  return r;
}

double BackwardErrorReport::relErr() const {
  if (nanCount)
    return std::numeric_limits<double>::infinity();
  return std::max({dqRelErr, dkRelErr, dvRelErr, captureRelErr});
}

/// ||x - y|| / ||y|| of the rows \p rows of \p t (as (b * H + h) * N + i
/// for its (B, H, N, d) shape; every row in order when null) against
/// \p want ([rows, d]); NaN outputs are counted in \p nanCount, not summed.
static double gradientRelErr(DType dtype, const HalfTensor &t,
                             const std::vector<int64_t> *rows,
                             const std::vector<double> &want,
                             int64_t &nanCount) {
  const int64_t heads = t.shape[1], n = t.shape[2], width = t.shape[3];
  const int64_t count = rows ? int64_t(rows->size()) : t.shape[0] * heads * n;
  double num = 0, den = 0;
  for (int64_t r = 0; r < count; ++r) {
    int64_t row = rows ? (*rows)[size_t(r)] : r;
    int64_t bh = row / n, i = row % n;
    for (int64_t c = 0; c < width; ++c) {
      double x = halfToFloat(dtype, t.at(bh / heads, bh % heads, i, c));
      double y = want[size_t(r * width + c)];
      if (std::isnan(x)) {
        ++nanCount;
        continue;
      }
      num += (x - y) * (x - y);
      den += y * y;
    }
  }
  // A reference of all zeros (every row masked) is matched by exact zeros.
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

BackwardErrorReport compareBackward(const AttentionSpec &spec, const Problem &,
                                    const AttentionGrads &g,
                                    const BackwardReference &ref) {
  BackwardErrorReport e;
  e.dqRelErr = gradientRelErr(spec.dtype, g.dq, nullptr, ref.dq, e.nanCount);
  e.dkRelErr = gradientRelErr(spec.dtype, g.dk, nullptr, ref.dk, e.nanCount);
  e.dvRelErr = gradientRelErr(spec.dtype, g.dv, nullptr, ref.dv, e.nanCount);
  compareCaptureGrads(g.captureGrads, ref.captureGrads, e);
  return e;
}

void compareCaptureGrads(const Captures &got,
                         const std::vector<std::vector<double>> &want,
                         BackwardErrorReport &e) {
  for (size_t c = 0; c < want.size(); ++c) {
    if (want[c].empty())
      continue;
    e.capturesChecked = true;
    if (c >= got.size() || got[c].size() != want[c].size())
      throw SpecError(fmt::format("the gradient of captured tensor {} is "
                                  "missing or of another size",
                                  c));
    double num = 0, den = 0;
    for (size_t i = 0; i < want[c].size(); ++i) {
      const double x = got[c][i];
      if (std::isnan(x)) {
        ++e.nanCount;
        continue;
      }
      num += (x - want[c][i]) * (x - want[c][i]);
      den += want[c][i] * want[c][i];
    }
    e.captureRelErr = std::max(e.captureRelErr,
                               den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
}

namespace {

/// Rows of (b, h) of a view widened to float64 once, [N, d] packed.
std::vector<double> widenHead(DType dtype, const HalfTensor &t, int64_t b,
                              int64_t h) {
  std::vector<double> out;
  out.reserve(size_t(t.shape[2] * t.shape[3]));
  for (int64_t n = 0; n < t.shape[2]; ++n)
    for (int64_t c = 0; c < t.shape[3]; ++c)
      out.push_back(halfToFloat(dtype, t.at(b, h, n, c)));
  return out;
}

double dot(const double *a, const double *b, int64_t n) {
  double acc = 0;
  for (int64_t c = 0; c < n; ++c)
    acc += a[c] * b[c];
  return acc;
}

/// One query head's float64 inputs of the sampled reference: Q, dO, D and
/// lse of its rows.
struct QueryHead {
  std::vector<double> q, dO, delta;
  const float *lse;
  int64_t batch;
  QueryHead(const AttentionSpec &spec, const Problem &p, const AttentionData &d,
            const AttentionGrads &g, int64_t b, int64_t h)
      : q(widenHead(spec.dtype, d.q, b, h)),
        dO(widenHead(spec.dtype, g.dO, b, h)),
        lse(&d.lse[size_t((b * p.heads + h) * p.seqLenQ)]), batch(b) {
    std::vector<double> o = widenHead(spec.dtype, d.o, b, h);
    for (int64_t i = 0; i < p.seqLenQ; ++i)
      delta.push_back(dot(&dO[size_t(i * spec.headDimV)],
                          &o[size_t(i * spec.headDimV)], spec.headDimV));
  }
};

/// The positions of \p entries grouped by head (entry / \p n), in order.
std::map<int64_t, std::vector<size_t>>
groupByHead(const std::vector<int64_t> &entries, int64_t n) {
  std::map<int64_t, std::vector<size_t>> groups;
  for (size_t e = 0; e < entries.size(); ++e)
    groups[entries[e] / n].push_back(e);
  return groups;
}

} // namespace

SampledBackwardReference
referenceBackwardSampled(const AttentionSpec &spec, const Problem &p,
                         const AttentionData &d, const AttentionGrads &g,
                         const BlockSparseLayout *layout,
                         std::vector<int64_t> rows, std::vector<int64_t> keys) {
  const int64_t dqk = spec.headDimQK, dv = spec.headDimV;
  const int64_t Nq = p.seqLenQ, Nkv = p.seqLenKV, G = spec.gqaGroup;
  const int64_t Hkv = p.kvHeads(spec);
  const double scale = p.effectiveScale(spec);
  const ScoreMod mod = ScoreMod::of(spec).reading(&d.captures);
  auto [left, right] = effectiveWindow(spec, p);
  SampledBackwardReference r;
  r.rows = std::move(rows);
  r.keys = std::move(keys);
  r.dq.assign(r.rows.size() * size_t(dqk), 0.0);
  r.dk.assign(r.keys.size() * size_t(dqk), 0.0);
  r.dv.assign(r.keys.size() * size_t(dv), 0.0);
  // Adds what query row i of \p qh contributes through key (kj, vj) to dQ_i
  // (\p dq) or to dK_j and dV_j (\p dk, \p dvOut): the terms of
  // referenceBackward with P = exp(S - lse).
  auto accumulate = [&](const QueryHead &qh, const double *kj, const double *vj,
                        int64_t h, int64_t i, int64_t j, double *dq, double *dk,
                        double *dvOut) {
    if (!std::isfinite(qh.lse[i]))
      return; // the row sees no key: no gradient flows through it
    const double *qi = &qh.q[size_t(i * dqk)], *doi = &qh.dO[size_t(i * dv)];
    const double sc = scale * dot(qi, kj, dqk);
    double pij = std::exp(mod.apply(sc, h, i, j, qh.batch) - double(qh.lse[i]));
    double ds = pij * (dot(doi, vj, dv) - qh.delta[size_t(i)]) *
                mod.derivative(sc, h, i, j, qh.batch);
    for (int64_t c = 0; c < dqk; ++c) {
      if (dq)
        dq[c] += scale * ds * kj[c];
      if (dk)
        dk[c] += scale * ds * qi[c];
    }
    if (dvOut)
      for (int64_t c = 0; c < dv; ++c)
        dvOut[c] += pij * doi[c];
  };

  // Each head's tensors are widened once for all of its entries.
  for (const auto &[bh, members] : groupByHead(r.rows, Nq)) {
    int64_t b = bh / p.heads, h = bh % p.heads;
    QueryHead qh(spec, p, d, g, b, h);
    std::vector<double> kf = widenHead(spec.dtype, d.k, b, h / G);
    std::vector<double> vf = widenHead(spec.dtype, d.v, b, h / G);
    for (size_t ri : members) {
      int64_t i = r.rows[ri] % Nq;
      for (int64_t j = 0; j < Nkv; ++j)
        if (isVisible(spec, p, layout, left, right, b, h, i, j))
          accumulate(qh, &kf[size_t(j * dqk)], &vf[size_t(j * dv)], h, i, j,
                     &r.dq[ri * size_t(dqk)], nullptr, nullptr);
    }
  }
  for (const auto &[bhk, members] : groupByHead(r.keys, Nkv)) {
    int64_t b = bhk / Hkv, hk = bhk % Hkv;
    std::vector<double> kf = widenHead(spec.dtype, d.k, b, hk);
    std::vector<double> vf = widenHead(spec.dtype, d.v, b, hk);
    // dK and dV of a KV head sum over the query heads of its group.
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
      QueryHead qh(spec, p, d, g, b, h);
      for (size_t ki : members) {
        int64_t j = r.keys[ki] % Nkv;
        for (int64_t i = 0; i < Nq; ++i)
          if (isVisible(spec, p, layout, left, right, b, h, i, j))
            accumulate(qh, &kf[size_t(j * dqk)], &vf[size_t(j * dv)], h, i,
                       j, nullptr, &r.dk[ki * size_t(dqk)],
                       &r.dv[ki * size_t(dv)]);
      }
    }
  }
  return r;
}

BackwardErrorReport
compareBackwardSampled(const AttentionSpec &spec, const Problem &,
                       const AttentionGrads &g,
                       const SampledBackwardReference &ref) {
  BackwardErrorReport e;
  e.dqRelErr = gradientRelErr(spec.dtype, g.dq, &ref.rows, ref.dq, e.nanCount);
  e.dkRelErr = gradientRelErr(spec.dtype, g.dk, &ref.keys, ref.dk, e.nanCount);
  e.dvRelErr = gradientRelErr(spec.dtype, g.dv, &ref.keys, ref.dv, e.nanCount);
  return e;
}

BackwardCheck checkBackward(const AttentionSpec &spec, const Problem &p,
                            const AttentionData &d, const AttentionGrads &g,
                            const BlockSparseLayout *layout, double maxWork) {
  const int64_t G = spec.gqaGroup;
  const double width = double(std::max(spec.headDimQK, spec.headDimV));
  const double perHead = double(p.seqLenQ) * double(p.seqLenKV) * width;
  BackwardCheck c;
  if (perHead * double(p.batch * p.heads) <= maxWork) {
    c.err =
        compareBackward(spec, p, g, referenceBackward(spec, p, d, g, layout));
    c.checkedHeads = p.batch * p.heads;
  } else if (perHead * double(G) <= maxWork) {
    // A problem of its own: batch 0, KV head 0, query heads 0..G-1, as
    // views of the same buffers (b = 0 and h < G index them, and the
    // layout, as in the whole problem).
    Problem sub = p;
    sub.batch = 1;
    sub.heads = G;
    AttentionData sd = d;
    AttentionGrads sg = g;
    for (HalfTensor *t : {&sd.q, &sd.o, &sg.dO, &sg.dq})
      t->shape = {1, G, t->shape[2], t->shape[3]};
    for (HalfTensor *t : {&sd.k, &sd.v, &sg.dk, &sg.dv})
      t->shape = {1, 1, t->shape[2], t->shape[3]};
    sd.lse.resize(size_t(G * p.seqLenQ));
    c.err = compareBackward(spec, sub, sg,
                            referenceBackward(spec, sub, sd, sg, layout));
    // A captured tensor's gradient sums over every head and row (a slope
    // per head, a bias shared by the batch): the group's reference holds
    // only its own part, so it is not compared here.
    c.err.captureRelErr = 0;
    c.err.capturesChecked = false;
    c.checkedHeads = G;
  } else {
    // In that group: a sampled row costs Nkv * d, a sampled key G * Nq * d;
    // half the budget each.
    double perRow = double(p.seqLenKV) * width;
    double perKey = double(G * p.seqLenQ) * width;
    int64_t rowsPerHead =
        std::max<int64_t>(2, int64_t(maxWork / 2 / perRow / double(G)));
    std::vector<int64_t> rows;
    for (int64_t h = 0; h < G; ++h)
      for (int64_t i : evenlySpaced(p.seqLenQ, rowsPerHead))
        rows.push_back(h * p.seqLenQ + i);
    std::vector<int64_t> keys = evenlySpaced(
        p.seqLenKV, std::max<int64_t>(2, int64_t(maxWork / 2 / perKey)));
    c.sampledRows = int64_t(rows.size());
    c.sampledKeys = int64_t(keys.size());
    c.err = compareBackwardSampled(
        spec, p, g,
        referenceBackwardSampled(spec, p, d, g, layout, std::move(rows),
                                 std::move(keys)));
    c.checkedHeads = G;
  }
  c.err.nanCount = countNaN(spec.dtype, g.dq) + countNaN(spec.dtype, g.dk) +
                   countNaN(spec.dtype, g.dv);
  return c;
}

} // namespace flashjit
