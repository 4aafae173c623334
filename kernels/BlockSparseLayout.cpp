//===- BlockSparseLayout.cpp - The block-sparse layout and its text file --===//
//
/// \file
/// BlockSparseLayout of HostTensor.h: built from a dense 0/1 block matrix,
/// at random or from the text format, its checks against a problem, and the
/// KV-major transpose the backward walks; with readBoundedFile, the bounded
/// file read the layout's text format (and the CLI's --input) goes through.
//
//===----------------------------------------------------------------------===//

#include "kernels/HostTensor.h"
#include "kernels/KernelABI.h"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <sstream>

namespace flashjit {

/// A layout of the given shape that lists no block: every count and index
/// 0, with room for every KV block of every Q block.
static BlockSparseLayout emptyLayout(int64_t batch, int64_t heads,
                                     int64_t qBlocks, int64_t kvBlocks) {
  BlockSparseLayout l;
  l.batch = batch;
  l.heads = heads;
  l.qBlocks = qBlocks;
  l.kvBlocks = kvBlocks;
  l.counts.assign(size_t(batch * heads * qBlocks), 0);
  l.indices.assign(size_t(batch * heads * qBlocks * kvBlocks), 0);
  return l;
}

BlockSparseLayout
BlockSparseLayout::fromDense(int64_t batch, int64_t heads, int64_t qBlocks,
                             int64_t kvBlocks,
                             const std::vector<uint8_t> &dense) {
  if (int64_t(dense.size()) != batch * heads * qBlocks * kvBlocks)
    throw SpecError("layout: dense block matrix has the wrong size");
  BlockSparseLayout l = emptyLayout(batch, heads, qBlocks, kvBlocks);
  for (int64_t row = 0; row < batch * heads * qBlocks; ++row) {
    int32_t n = 0;
    for (int64_t kb = 0; kb < kvBlocks; ++kb)
      if (uint8_t d = dense[row * kvBlocks + kb])
        l.indices[row * kvBlocks + n++] =
            d == 2 ? abi::fullBlockEntry(int32_t(kb)) : int32_t(kb);
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
      if (tok != "0" && tok != "1" && tok != "2")
        throw SpecError(fmt::format(
            "layout: '{}' line {}: expected 0, 1 or 2 (full), got '{}'", path,
            rows + 1, shownToken(tok)));
      dense.push_back(uint8_t(tok[0] - '0'));
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
  return std::find_if(idx, idx + n, [&](int32_t e) {
           return abi::blockOfEntry(e) == kb;
         }) != idx + n;
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
  // The entries a row lists (the kernels read no others): in range, and
  // none twice, since a KV block listed twice would count twice in the
  // forward's softmax (lse high by ln 2), as transposed() refuses it for the
  // backward.
  std::vector<int64_t> lastRow(size_t(kvBlocks), -1);
  for (size_t row = 0; row < counts.size(); ++row) {
    const int32_t *idx = &indices[row * size_t(kvBlocks)];
    for (int32_t j = 0; j < counts[row]; ++j) {
      int32_t kb = abi::blockOfEntry(idx[j]);
      if (kb >= kvBlocks)
        throw SpecError("layout: a KV block index is out of range");
      if (lastRow[size_t(kb)] == int64_t(row)) {
        int64_t qb = int64_t(row) % qBlocks, bh = int64_t(row) / qBlocks;
        throw SpecError(fmt::format(
            "layout: KV block {} is listed twice for batch {}, head {}, Q "
            "block {}",
            kb, bh / heads, bh % heads, qb));
      }
      lastRow[size_t(kb)] = int64_t(row);
    }
  }
}

void checkMaskBlocksArgs(const AttentionSpec &spec, const Problem &p,
                         int64_t batch, int64_t heads) {
  if (!spec.blockSparse || spec.maskModRegion.empty())
    throw SpecError("mask blocks: only a block-sparse kernel with a mask_mod "
                    "region classifies its blocks (--mask-mod with "
                    "--block-sparse / --mask-blocks)");
  if (spec.varlen && batch != p.batch)
    throw SpecError(fmt::format("mask blocks: a variable-length batch's "
                                "layout has a row per sequence: batch {}, "
                                "not {}",
                                p.batch, batch));
  if ((batch != 1 && batch != p.batch) || (heads != 1 && heads != p.heads))
    throw SpecError(fmt::format("mask blocks: a layout of batch {} and heads "
                                "{} does not broadcast to {} x {}",
                                batch, heads, p.batch, p.heads));
}

MaskBlocksLaunch maskBlocksLaunch(const AttentionSpec &spec, const Problem &p,
                                  int64_t batch, int64_t heads) {
  checkMaskBlocksArgs(spec, p, batch, heads);
  MaskBlocksLaunch l;
  l.shape.batch = batch;
  l.shape.heads = heads;
  l.shape.qBlocks = (p.seqLenQ + spec.sparseBlock - 1) / spec.sparseBlock;
  l.shape.kvBlocks = (p.seqLenKV + spec.sparseBlock - 1) / spec.sparseBlock;
  // The classification addresses the indices in i32.
  const double entries = double(batch * heads) * double(l.shape.qBlocks) *
                         double(l.shape.kvBlocks);
  if (entries >= double(int64_t(1) << 31))
    throw SpecError(fmt::format(
        "mask blocks: a layout of {:.0f} entries (batch * heads * q_blocks * "
        "kv_blocks) is past the classification's 2^31; use a larger "
        "sparse_block or a broadcast layout",
        entries));
  Problem lp = p;
  lp.batch = batch;
  lp.heads = heads;
  abi::TensorStrides strides;
  strides.counts = l.shape.countStrides();
  strides.indices = l.shape.indexStrides();
  l.index = abi::indexArgs(spec, lp, strides);
  const int64_t rows = abi::blocks::kRows;
  l.classPrograms = l.shape.qBlocks * ((l.shape.kvBlocks + rows - 1) / rows);
  l.listPrograms = (l.shape.qBlocks + rows - 1) / rows;
  return l;
}

BlockSparseLayout MaskBlocksLaunch::layout() const {
  return emptyLayout(shape.batch, shape.heads, shape.qBlocks, shape.kvBlocks);
}

BlockSparseLayout referenceMaskBlocks(const AttentionSpec &spec,
                                      const Problem &p,
                                      const Captures &captures, int64_t batch,
                                      int64_t heads,
                                      const std::vector<int32_t> &cuSeqQ,
                                      const std::vector<int32_t> &cuSeqKV) {
  const int64_t s = spec.sparseBlock;
  BlockSparseLayout shape = maskBlocksLaunch(spec, p, batch, heads).shape;
  const int64_t qb = shape.qBlocks, kb = shape.kvBlocks;
  if (spec.varlen && (int64_t(cuSeqQ.size()) != batch + 1 ||
                      int64_t(cuSeqKV.size()) != batch + 1))
    throw SpecError("mask blocks: a variable-length batch's reference "
                    "takes the sequences' offsets");
  // Sequence b's lengths (varlen), else the problem's.
  auto lengths = [&](int64_t b) -> std::pair<int64_t, int64_t> {
    if (!spec.varlen)
      return {p.seqLenQ, p.seqLenKV};
    return {cuSeqQ[size_t(b + 1)] - cuSeqQ[size_t(b)],
            cuSeqKV[size_t(b + 1)] - cuSeqKV[size_t(b)]};
  };
  std::vector<uint8_t> dense(size_t(batch * heads * qb * kb), 0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < qb; ++r)
        for (int64_t c = 0; c < kb; ++c) {
          auto [nq, nkv] = lengths(b);
          bool any = false, all = true;
          for (int64_t i = r * s; i < std::min(nq, (r + 1) * s); ++i)
            for (int64_t j = c * s; j < std::min(nkv, (c + 1) * s); ++j) {
              double unused = 0;
              bool keep = spec.maskFunction->apply(0.0, b, h, i, j, &captures,
                                                   &unused) != 0.0;
              any |= keep;
              all &= keep;
            }
          dense[size_t(((b * heads + h) * qb + r) * kb + c)] =
              any ? (all ? 2 : 1) : 0;
        }
  return BlockSparseLayout::fromDense(batch, heads, qb, kb, dense);
}

bool sameListedBlocks(const BlockSparseLayout &a, const BlockSparseLayout &b) {
  if (a.batch != b.batch || a.heads != b.heads || a.qBlocks != b.qBlocks ||
      a.kvBlocks != b.kvBlocks || a.counts != b.counts)
    return false;
  for (size_t row = 0; row < a.counts.size(); ++row)
    if (!std::equal(a.indices.begin() + std::ptrdiff_t(row * a.kvBlocks),
                    a.indices.begin() +
                        std::ptrdiff_t(row * a.kvBlocks + a.counts[row]),
                    b.indices.begin() + std::ptrdiff_t(row * b.kvBlocks)))
      return false;
  return true;
}

double BlockSparseLayout::density() const {
  double listed = 0;
  for (int32_t c : counts)
    listed += c;
  return counts.empty() ? 0.0 : listed / double(counts.size() * kvBlocks);
}

BlockSparseLayout BlockSparseLayout::transposed() const {
  BlockSparseLayout t = emptyLayout(batch, heads, kvBlocks, qBlocks);
  auto cs = countStrides();
  auto is = indexStrides();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t qb = 0; qb < qBlocks; ++qb) {
        int64_t n = counts[b * cs[0] + h * cs[1] + qb * cs[2]];
        const int32_t *idx = &indices[b * is[0] + h * is[1] + qb * is[2]];
        for (int64_t t2 = 0; t2 < n; ++t2) {
          int32_t kb = abi::blockOfEntry(idx[t2]);
          int64_t row = (b * heads + h) * kvBlocks + kb;
          // Q blocks are visited in increasing order: lists stay sorted, and
          // a KV block listed twice by one Q block shows as qb already last
          // (it would overflow the row of qBlocks entries).
          // A full block pair is full in both orientations.
          int32_t &count = t.counts[row];
          if (count > 0 &&
              abi::blockOfEntry(t.indices[row * qBlocks + count - 1]) == qb)
            throw SpecError(fmt::format(
                "layout: KV block {} is listed twice for batch {}, head {}, Q "
                "block {}",
                kb, b, h, qb));
          t.indices[row * qBlocks + count++] =
              abi::isFullEntry(idx[t2]) ? abi::fullBlockEntry(int32_t(qb))
                                        : int32_t(qb);
        }
      }
  return t;
}

} // namespace flashjit
