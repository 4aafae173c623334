//===- HostTensor.cpp - Host tensors, layouts, reference, .npy -----------===//

#include "kernels/HostTensor.h"
#include "kernels/HalfFloat.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace flashjit {

float halfToFloat(DType dtype, uint16_t bits) {
  return dtype == DType::BF16 ? bf16ToFloat(bits) : fp16ToFloat(bits);
}

uint16_t floatToHalf(DType dtype, float value) {
  return dtype == DType::BF16 ? floatToBf16(value) : floatToFp16(value);
}

HalfTensor HalfTensor::packed(std::array<int64_t, 4> shape) {
  HalfTensor t;
  t.shape = shape;
  t.strides = {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3],
               1};
  t.buffer = std::make_shared<std::vector<uint16_t>>(
      size_t(shape[0] * shape[1] * shape[2] * shape[3]));
  return t;
}

void HalfTensor::checkLayout(const char *what) const {
  if (strides[3] != 1)
    throw SpecError(
        fmt::format("{}: the innermost (head-dim) stride must be 1, got {}",
                    what, strides[3]));
  int64_t last = offset;
  for (int i = 0; i < 4; ++i) {
    if (strides[i] < 0)
      throw SpecError(fmt::format("{}: negative stride {}", what, strides[i]));
    last += (shape[i] - 1) * strides[i];
  }
  if (offset < 0 || last >= int64_t(buffer->size()))
    throw SpecError(fmt::format("{}: view reaches outside its buffer", what));
}

//===----------------------------------------------------------------------===//
// Block-sparse layout
//===----------------------------------------------------------------------===//

BlockSparseLayout
BlockSparseLayout::fromDense(int64_t batch, int64_t heads, int64_t qBlocks,
                             int64_t kvBlocks,
                             const std::vector<uint8_t> &dense) {
  if (int64_t(dense.size()) != batch * heads * qBlocks * kvBlocks)
    throw SpecError("layout: dense block matrix has the wrong size");
  BlockSparseLayout l;
  l.batch = batch;
  l.heads = heads;
  l.qBlocks = qBlocks;
  l.kvBlocks = kvBlocks;
  l.counts.assign(size_t(batch * heads * qBlocks), 0);
  l.indices.assign(size_t(batch * heads * qBlocks * kvBlocks), 0);
  for (int64_t row = 0; row < batch * heads * qBlocks; ++row) {
    int32_t n = 0;
    for (int64_t kb = 0; kb < kvBlocks; ++kb)
      if (dense[row * kvBlocks + kb])
        l.indices[row * kvBlocks + n++] = int32_t(kb);
    l.counts[row] = n;
  }
  return l;
}

BlockSparseLayout BlockSparseLayout::random(int64_t batch, int64_t heads,
                                            int64_t qBlocks, int64_t kvBlocks,
                                            double density, uint64_t seed) {
  if (!(density >= 0.0 && density <= 1.0))
    throw SpecError(
        fmt::format("block-sparse density must be in [0, 1], got {}", density));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint8_t> dense(size_t(batch * heads * qBlocks * kvBlocks));
  for (auto &d : dense)
    d = u(rng) < density;
  return fromDense(batch, heads, qBlocks, kvBlocks, dense);
}

/// \p token as a message shows it: at most 16 characters, the unprintable
/// ones as \xNN.
static std::string shownToken(const std::string &token) {
  std::string shown;
  for (size_t i = 0; i < token.size() && i < 16; ++i) {
    unsigned char c = static_cast<unsigned char>(token[i]);
    shown += c >= 0x20 && c < 0x7f ? std::string(1, char(c))
                                   : fmt::format("\\x{:02x}", c);
  }
  return token.size() > 16 ? shown + "..." : shown;
}

std::string readBoundedFile(const std::string &path, const std::string &what,
                            int64_t maxBytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw SpecError(fmt::format("{}: cannot open '{}': {}", what, path,
                                ec ? ec.message() : "no such file"));
  if (fs::is_directory(st))
    throw SpecError(fmt::format("{}: '{}' is a directory, not a {} file", what,
                                path, what));
  if (fs::is_regular_file(st)) {
    uintmax_t size = fs::file_size(path, ec);
    if (!ec && size > uintmax_t(maxBytes))
      throw SpecError(fmt::format(
          "{}: '{}' is {} bytes; a {} file may hold at most {} bytes", what,
          path, size, what, maxBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw SpecError(fmt::format("{}: cannot open '{}'", what, path));
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
    text.append(chunk, size_t(in.gcount()));
    if (text.size() > size_t(maxBytes))
      throw SpecError(fmt::format(
          "{}: '{}' holds more than {} bytes, the most a {} file may hold "
          "(not a regular file: read stopped there)",
          what, path, maxBytes, what));
  }
  if (in.bad())
    throw SpecError(fmt::format("{}: cannot read '{}'", what, path));
  return text;
}

/// The text of the layout file \p path, read with a bound: a directory, a
/// missing file or one past kMaxLayoutFileBytes (a device such as /dev/zero
/// included, whose read stops there) is a SpecError.
static std::string readLayoutFile(const std::string &path) {
  return readBoundedFile(path, "layout", kMaxLayoutFileBytes);
}

BlockSparseLayout BlockSparseLayout::readText(const std::string &path) {
  std::istringstream in(readLayoutFile(path));
  std::vector<uint8_t> dense;
  int64_t rows = 0, cols = -1;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#')
      continue;
    std::istringstream ss(line);
    int64_t n = 0;
    std::string tok;
    while (ss >> tok) {
      if (tok != "0" && tok != "1")
        throw SpecError(
            fmt::format("layout: '{}' line {}: expected 0 or 1, got '{}'", path,
                        rows + 1, shownToken(tok)));
      dense.push_back(tok == "1");
      ++n;
    }
    if (cols >= 0 && n != cols)
      throw SpecError(fmt::format(
          "layout: '{}' line {} has {} blocks, the first line has {}", path,
          rows + 1, n, cols));
    cols = n;
    ++rows;
  }
  if (rows == 0 || cols <= 0)
    throw SpecError(fmt::format("layout: '{}' holds no block rows", path));
  return fromDense(1, 1, rows, cols, dense);
}

bool BlockSparseLayout::contains(int64_t b, int64_t h, int64_t qb,
                                 int64_t kb) const {
  auto cs = countStrides();
  auto is = indexStrides();
  int64_t n = counts[b * cs[0] + h * cs[1] + qb * cs[2]];
  const int32_t *idx = &indices[b * is[0] + h * is[1] + qb * is[2]];
  return std::find(idx, idx + n, int32_t(kb)) != idx + n;
}

std::array<int64_t, 3> BlockSparseLayout::countStrides() const {
  return {batch == 1 ? 0 : heads * qBlocks, heads == 1 ? 0 : qBlocks, 1};
}

std::array<int64_t, 3> BlockSparseLayout::indexStrides() const {
  return {batch == 1 ? 0 : heads * qBlocks * kvBlocks,
          heads == 1 ? 0 : qBlocks * kvBlocks, kvBlocks};
}

void BlockSparseLayout::checkFits(const Problem &p, int64_t sparseBlock) const {
  int64_t needQ = (p.seqLenQ + sparseBlock - 1) / sparseBlock;
  int64_t needKV = (p.seqLenKV + sparseBlock - 1) / sparseBlock;
  if (batch != 1 && batch != p.batch)
    throw SpecError(fmt::format("layout: batch {} does not broadcast to {}",
                                batch, p.batch));
  if (heads != 1 && heads != p.heads)
    throw SpecError(fmt::format("layout: heads {} does not broadcast to {}",
                                heads, p.heads));
  if (qBlocks != needQ || kvBlocks != needKV)
    throw SpecError(fmt::format(
        "layout: {}x{} blocks given, the problem needs {}x{} blocks of {}",
        qBlocks, kvBlocks, needQ, needKV, sparseBlock));
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] < 0 || counts[i] > kvBlocks)
      throw SpecError("layout: a block count is out of range");
  if (counts.size() != size_t(batch * heads * qBlocks) ||
      indices.size() != counts.size() * size_t(kvBlocks))
    throw SpecError(fmt::format(
        "layout: {} counts and {} indices given, a {}x{}x{}x{} layout has {} "
        "and {}",
        counts.size(), indices.size(), batch, heads, qBlocks, kvBlocks,
        batch * heads * qBlocks, batch * heads * qBlocks * kvBlocks));
  for (int32_t v : indices)
    if (v < 0 || v >= kvBlocks)
      throw SpecError("layout: a KV block index is out of range");
  // A KV block listed twice would count twice in the forward's softmax (lse
  // high by ln 2): refused, as transposed() refuses it for the backward.
  std::vector<int64_t> lastRow(size_t(kvBlocks), -1);
  for (size_t row = 0; row < counts.size(); ++row) {
    const int32_t *idx = &indices[row * size_t(kvBlocks)];
    for (int32_t j = 0; j < counts[row]; ++j) {
      if (lastRow[size_t(idx[j])] == int64_t(row)) {
        int64_t qb = int64_t(row) % qBlocks, bh = int64_t(row) / qBlocks;
        throw SpecError(fmt::format(
            "layout: KV block {} is listed twice for batch {}, head {}, Q "
            "block {}",
            idx[j], bh / heads, bh % heads, qb));
      }
      lastRow[size_t(idx[j])] = int64_t(row);
    }
  }
}

double BlockSparseLayout::density() const {
  double listed = 0;
  for (int32_t c : counts)
    listed += c;
  return counts.empty() ? 0.0 : listed / double(counts.size() * kvBlocks);
}

BlockSparseLayout BlockSparseLayout::transposed() const {
  BlockSparseLayout t;
  t.batch = batch;
  t.heads = heads;
  t.qBlocks = kvBlocks;
  t.kvBlocks = qBlocks;
  t.counts.assign(size_t(batch * heads * kvBlocks), 0);
  t.indices.assign(size_t(batch * heads * kvBlocks * qBlocks), 0);
  auto cs = countStrides();
  auto is = indexStrides();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t qb = 0; qb < qBlocks; ++qb) {
        int64_t n = counts[b * cs[0] + h * cs[1] + qb * cs[2]];
        const int32_t *idx = &indices[b * is[0] + h * is[1] + qb * is[2]];
        for (int64_t t2 = 0; t2 < n; ++t2) {
          int64_t row = (b * heads + h) * kvBlocks + idx[t2];
          // Q blocks are visited in increasing order: lists stay sorted, and
          // a KV block listed twice by one Q block shows as qb already last
          // (it would overflow the row of qBlocks entries).
          int32_t &count = t.counts[row];
          if (count > 0 && t.indices[row * qBlocks + count - 1] == qb)
            throw SpecError(fmt::format(
                "layout: KV block {} is listed twice for batch {}, head {}, Q "
                "block {}",
                idx[t2], b, h, qb));
          t.indices[row * qBlocks + count++] = int32_t(qb);
        }
      }
  return t;
}

//===----------------------------------------------------------------------===//
// Inputs and reference
//===----------------------------------------------------------------------===//

AttentionData makeRandomInputs(const AttentionSpec &spec, const Problem &p,
                               QKVLayout layout, std::mt19937_64 &rng) {
  AttentionData d;
  int64_t hkv = p.kvHeads(spec);
  if (layout == QKVLayout::Packed && spec.headDimQK == spec.headDimV &&
      p.seqLenQ == p.seqLenKV && hkv == p.heads) {
    // One (B, N, 3, H, d) buffer; q, k, v are strided views into it.
    int64_t dd = spec.headDimQK, H = p.heads, N = p.seqLenQ;
    auto buf = std::make_shared<std::vector<uint16_t>>(
        size_t(p.batch * N * 3 * H * dd));
    std::array<int64_t, 4> strides{N * 3 * H * dd, dd, 3 * H * dd, 1};
    for (int i = 0; i < 3; ++i) {
      HalfTensor &t = i == 0 ? d.q : i == 1 ? d.k : d.v;
      t.buffer = buf;
      t.offset = i * H * dd;
      t.shape = {p.batch, H, N, dd};
      t.strides = strides;
    }
  } else {
    d.q = HalfTensor::packed({p.batch, p.heads, p.seqLenQ, spec.headDimQK});
    d.k = HalfTensor::packed({p.batch, hkv, p.seqLenKV, spec.headDimQK});
    d.v = HalfTensor::packed({p.batch, hkv, p.seqLenKV, spec.headDimV});
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto *buf : {d.q.buffer.get(), d.k.buffer.get(), d.v.buffer.get()})
    for (auto &x : *buf)
      x = floatToHalf(spec.dtype, normal(rng));
  d.o = HalfTensor::packed({p.batch, p.heads, p.seqLenQ, spec.headDimV});
  uint16_t nan16 = floatToHalf(spec.dtype, std::nanf(""));
  std::fill(d.o.buffer->begin(), d.o.buffer->end(), nan16);
  d.lse.assign(size_t(p.batch * p.heads * p.seqLenQ), std::nanf(""));
  return d;
}

/// Does query row \p i of (b, h) see key \p j? The band (\p left, \p right
/// from effectiveWindow, bottom-right aligned), then the layout if any.
static bool isVisible(const AttentionSpec &spec, const Problem &p,
                      const BlockSparseLayout *layout, int64_t left,
                      int64_t right, int64_t b, int64_t h, int64_t i,
                      int64_t j) {
  int64_t diag = i + (p.seqLenKV - p.seqLenQ);
  if (j < diag - left || j > diag + right)
    return false;
  return !layout ||
         layout->contains(b % layout->batch, h % layout->heads,
                          i / spec.sparseBlock, j / spec.sparseBlock);
}

/// Up to \p count indices spread evenly over [0, n), increasing, the first
/// and the last included.
static std::vector<int64_t> evenlySpaced(int64_t n, int64_t count) {
  count = std::clamp<int64_t>(count, 1, n);
  std::vector<int64_t> out;
  for (int64_t k = 0; k < count; ++k) {
    int64_t at = count == 1 ? 0 : k * (n - 1) / (count - 1);
    if (out.empty() || out.back() != at)
      out.push_back(at);
  }
  return out;
}

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
  const ScoreMod mod = ScoreMod::parse(spec.scoreMod);
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
      s[j] = mod.apply(acc * scale, h, i, j);
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

AttentionGrads makeRandomGrads(const AttentionSpec &spec, const Problem &,
                               const AttentionData &d, std::mt19937_64 &rng) {
  AttentionGrads g;
  g.dO = HalfTensor::packed(d.o.shape);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto &x : *g.dO.buffer)
    x = floatToHalf(spec.dtype, normal(rng));
  bool packedQKV = d.q.buffer == d.k.buffer && d.k.buffer == d.v.buffer;
  if (packedQKV) {
    // The same (B, N, 3, H, d) arrangement as q, k, v.
    g.dq = d.q;
    g.dk = d.k;
    g.dv = d.v;
    auto buf = std::make_shared<std::vector<uint16_t>>(d.q.buffer->size());
    g.dq.buffer = g.dk.buffer = g.dv.buffer = buf;
  } else {
    g.dq = HalfTensor::packed(d.q.shape);
    g.dk = HalfTensor::packed(d.k.shape);
    g.dv = HalfTensor::packed(d.v.shape);
  }
  uint16_t nan16 = floatToHalf(spec.dtype, std::nanf(""));
  for (auto *buf : {g.dq.buffer.get(), g.dk.buffer.get(), g.dv.buffer.get()})
    std::fill(buf->begin(), buf->end(), nan16);
  return g;
}

BackwardReference referenceBackward(const AttentionSpec &spec, const Problem &p,
                                    const AttentionData &d,
                                    const AttentionGrads &g,
                                    const BlockSparseLayout *layout) {
  const int64_t dqk = spec.headDimQK, dv = spec.headDimV;
  const int64_t Nq = p.seqLenQ, Nkv = p.seqLenKV, H = p.heads;
  const int64_t Hkv = p.kvHeads(spec);
  const double scale = p.effectiveScale(spec);
  const double negInf = -std::numeric_limits<double>::infinity();
  auto [left, right] = effectiveWindow(spec, p);
  BackwardReference r;
  r.dq.assign(size_t(p.batch * H * Nq * dqk), 0.0);
  r.dk.assign(size_t(p.batch * Hkv * Nkv * dqk), 0.0);
  r.dv.assign(size_t(p.batch * Hkv * Nkv * dv), 0.0);
  std::vector<double> kf, vf, qrow(dqk), dorow(dv), s(Nkv), dp(Nkv);
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
          s[j] = acc * scale;
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
          double pj = s[j], ds = pj * (dp[j] - delta);
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
  return std::max({dqRelErr, dkRelErr, dvRelErr});
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
  return e;
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
  QueryHead(const AttentionSpec &spec, const Problem &p, const AttentionData &d,
            const AttentionGrads &g, int64_t b, int64_t h)
      : q(widenHead(spec.dtype, d.q, b, h)),
        dO(widenHead(spec.dtype, g.dO, b, h)),
        lse(&d.lse[size_t((b * p.heads + h) * p.seqLenQ)]) {
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
                        int64_t i, double *dq, double *dk, double *dvOut) {
    if (!std::isfinite(qh.lse[i]))
      return; // the row sees no key: no gradient flows through it
    const double *qi = &qh.q[size_t(i * dqk)], *doi = &qh.dO[size_t(i * dv)];
    double pij = std::exp(scale * dot(qi, kj, dqk) - double(qh.lse[i]));
    double ds = pij * (dot(doi, vj, dv) - qh.delta[size_t(i)]);
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
          accumulate(qh, &kf[size_t(j * dqk)], &vf[size_t(j * dv)], i,
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
            accumulate(qh, &kf[size_t(j * dqk)], &vf[size_t(j * dv)], i,
                       nullptr, &r.dk[ki * size_t(dqk)],
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

int64_t countNaN(DType dtype, const HalfTensor &t) {
  int64_t n = 0;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t i = 0; i < t.shape[2]; ++i)
        for (int64_t c = 0; c < t.shape[3]; ++c)
          n += std::isnan(halfToFloat(dtype, t.at(b, h, i, c)));
  return n;
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

std::vector<float> widenToFloat(DType dtype, const HalfTensor &t) {
  std::vector<float> out;
  out.reserve(size_t(t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]));
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t n = 0; n < t.shape[2]; ++n)
        for (int64_t c = 0; c < t.shape[3]; ++c)
          out.push_back(halfToFloat(dtype, t.at(b, h, n, c)));
  return out;
}

double errorBound(DType dtype) { return dtype == DType::BF16 ? 1e-2 : 5e-3; }

//===----------------------------------------------------------------------===//
// .npy output
//===----------------------------------------------------------------------===//

/// Writes a version 1.0 .npy file holding \p bytes of \p descr elements.
static void writeNpy(const std::string &path, const char *descr,
                     const std::vector<int64_t> &shape, const void *bytes,
                     size_t size) {
  std::string dims;
  for (int64_t s : shape)
    dims += std::to_string(s) + ",";
  if (shape.size() > 1)
    dims.pop_back();
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                  descr, dims);
  // Magic (6) + version (2) + header length (2) + header + '\n', padded to 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  auto fail = [&](int err) {
    throw SpecError(
        fmt::format("cannot write '{}': {}", path, std::strerror(err)));
  };
  errno = 0;
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    fail(errno);
  uint16_t hlen = uint16_t(header.size());
  bool ok = std::fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8;
  ok &= std::fwrite(&hlen, 2, 1, f) == 1;
  ok &= std::fwrite(header.data(), 1, header.size(), f) == header.size();
  ok &= std::fwrite(bytes, 1, size, f) == size;
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok)
    fail(err ? err : EIO);
}

void prepareDumpDirectory(const std::string &dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw SpecError(fmt::format("--dump-io: cannot create the directory '{}': "
                                "{}",
                                dir, ec.message()));
  if (!std::filesystem::is_directory(dir, ec))
    throw SpecError(
        fmt::format("--dump-io: '{}' exists and is not a directory", dir));
  // Writable? (Found now, before the run, not after it.)
  std::string probe = dir + "/.flashjit-dump-probe";
  errno = 0;
  FILE *f = std::fopen(probe.c_str(), "wb");
  if (!f)
    throw SpecError(fmt::format("--dump-io: cannot write into '{}': {}", dir,
                                std::strerror(errno)));
  std::fclose(f);
  std::filesystem::remove(probe, ec);
}

void writeHalfNpy(const std::string &path, DType dtype, const HalfTensor &t) {
  writeNpyF32(path, std::vector<int64_t>(t.shape.begin(), t.shape.end()),
              widenToFloat(dtype, t));
}

void dumpForwardIO(const std::string &dir, const AttentionSpec &spec,
                   const Problem &p, const AttentionData &d,
                   const BlockSparseLayout *layout) {
  prepareDumpDirectory(dir);
  writeHalfNpy(dir + "/q.npy", spec.dtype, d.q);
  writeHalfNpy(dir + "/k.npy", spec.dtype, d.k);
  writeHalfNpy(dir + "/v.npy", spec.dtype, d.v);
  writeHalfNpy(dir + "/o.npy", spec.dtype, d.o);
  writeNpyF32(dir + "/lse.npy", {p.batch, p.heads, p.seqLenQ}, d.lse);
  if (layout) {
    writeNpyI32(dir + "/layout_counts.npy",
                {layout->batch, layout->heads, layout->qBlocks},
                layout->counts);
    writeNpyI32(
        dir + "/layout_indices.npy",
        {layout->batch, layout->heads, layout->qBlocks, layout->kvBlocks},
        layout->indices);
  }
}

void writeNpyF32(const std::string &path, const std::vector<int64_t> &shape,
                 const std::vector<float> &values) {
  writeNpy(path, "<f4", shape, values.data(), values.size() * 4);
}

void writeNpyI32(const std::string &path, const std::vector<int64_t> &shape,
                 const std::vector<int32_t> &values) {
  writeNpy(path, "<i4", shape, values.data(), values.size() * 4);
}

} // namespace flashjit
