//===- HostTensor.cpp - Host tensors, random inputs, .npy output ----------===//
//
/// \file
/// The host side of HostTensor.h that is neither the block-sparse layout
/// (BlockSparseLayout.cpp) nor the float64 reference (ReferenceForward.cpp,
/// ReferenceBackward.cpp): the 16-bit element conversions, strided
/// (B, H, N, d) views, random inputs and gradients, NaN counts and widening,
/// the error bound, and the .npy output of --dump-io.
//
//===----------------------------------------------------------------------===//

#include "kernels/HostTensor.h"
#include "kernels/HalfFloat.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>

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

void checkSeqOffsets(const char *what, const std::vector<int32_t> &cu,
                     int64_t batch, int64_t longest, int64_t rows) {
  if (int64_t(cu.size()) != batch + 1)
    throw SpecError(fmt::format("{}: expected batch + 1 = {} offsets, got {}",
                                what, batch + 1, cu.size()));
  if (cu[0] != 0)
    throw SpecError(fmt::format("{}: the first offset must be 0, got {}", what,
                                cu[0]));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t(cu[size_t(b + 1)]) - cu[size_t(b)];
    if (len < 0 || len > longest)
      throw SpecError(fmt::format("{}: sequence {} has length {} ({} to {}); "
                                  "lengths must be in [0, {}] (the longest "
                                  "the problem gives)",
                                  what, b, len, cu[size_t(b)],
                                  cu[size_t(b + 1)], longest));
  }
  if (cu.back() > rows)
    throw SpecError(fmt::format("{}: the sequences end at row {}, past the "
                                "packed tensor's {} rows",
                                what, cu.back(), rows));
}

void checkVarlenData(const AttentionSpec &spec, const Problem &p,
                     const AttentionData &d) {
  if (!spec.varlen) {
    if (!d.cuSeqQ.empty() || !d.cuSeqKV.empty())
      throw SpecError("cu_seqlens given to a kernel compiled without varlen");
    return;
  }
  for (auto [what, t] : {std::pair{"q", &d.q}, {"k", &d.k}, {"v", &d.v},
                         {"o", &d.o}})
    if (t->shape[0] != 1)
      throw SpecError(fmt::format("varlen: {} must hold the sequences packed "
                                  "(one batch of total_tokens rows), got a "
                                  "batch of {}",
                                  what, t->shape[0]));
  checkSeqOffsets("cu_seqlens_q", d.cuSeqQ, p.batch, p.seqLenQ, d.q.shape[2]);
  checkSeqOffsets("cu_seqlens_kv", d.cuSeqKV, p.batch, p.seqLenKV,
                  d.k.shape[2]);
  if (d.o.shape[2] < d.q.shape[2] || d.v.shape[2] < d.k.shape[2])
    throw SpecError("varlen: o must have q's rows and v k's rows");
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
// Random inputs and element helpers
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
  // The captured tensors' gradients that spec.captureGrads names: zeros
  // (the backward adds into them).
  if (spec.captureGrads)
    for (size_t c = 0; c < d.captures.size(); ++c)
      g.captureGrads.push_back(std::vector<float>(
          (spec.captureGrads >> c) & 1 ? d.captures[c].size() : 0));
  return g;
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

//===----------------------------------------------------------------------===//
// .npy input
//===----------------------------------------------------------------------===//

/// The value of \p key in an .npy header's Python dict literal (its text up
/// to the next ',' or '}' outside brackets), or "" if absent.
static std::string npyHeaderField(const std::string &header,
                                  const std::string &key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos)
    return "";
  at = header.find(':', at);
  if (at == std::string::npos)
    return "";
  size_t end = ++at;
  int depth = 0;
  for (; end < header.size(); ++end) {
    char c = header[end];
    depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    if (depth == 0 && (c == ',' || c == '}'))
      break;
  }
  std::string v = header.substr(at, end - at);
  v.erase(0, v.find_first_not_of(" \t"));
  v.erase(v.find_last_not_of(" \t") + 1);
  return v;
}

std::vector<float> readNpyAsF32(const std::string &path) {
  auto bad = [&](const std::string &what) {
    return SpecError(fmt::format("'{}': {}", path, what));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw bad(fmt::format("cannot read it: {}", std::strerror(errno)));
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw bad("not an .npy file (no \\x93NUMPY magic)");
  uint32_t headerLen = 0;
  unsigned char len[4] = {};
  const int lenBytes = magic[6] == 1 ? 2 : 4;
  if (magic[6] < 1 || magic[6] > 3 || !in.read((char *)len, lenBytes))
    throw bad("an .npy version this reader does not know");
  for (int i = lenBytes - 1; i >= 0; --i)
    headerLen = headerLen << 8 | len[i];
  if (headerLen > (1u << 20))
    throw bad("an .npy header over 1 MiB");
  std::string header(headerLen, '\0');
  if (!in.read(header.data(), headerLen))
    throw bad("truncated .npy header");
  const std::string descr = npyHeaderField(header, "descr");
  if (npyHeaderField(header, "fortran_order") != "False")
    throw bad("only C-order arrays are read (fortran_order is not False)");
  int64_t count = 1;
  const std::string shape = npyHeaderField(header, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    throw bad(fmt::format("bad shape '{}'", shape));
  for (size_t at = 1; at + 1 < shape.size();) {
    size_t end = shape.find(',', at);
    std::string dim = shape.substr(at, (end == std::string::npos
                                            ? shape.size() - 1
                                            : end) - at);
    dim.erase(0, dim.find_first_not_of(' '));
    if (!dim.empty()) {
      char *stop = nullptr;
      long long d = std::strtoll(dim.c_str(), &stop, 10);
      if (*stop != '\0' || d < 0 || (d > 0 && count > kMaxTensorElements / d))
        throw bad(fmt::format("bad or too large shape '{}'", shape));
      count *= d;
    }
    if (end == std::string::npos)
      break;
    at = end + 1;
  }
  int width = 0;
  bool isFloat = false;
  if (descr == "'<f4'" || descr == "'<f8'")
    isFloat = true, width = descr[3] - '0';
  else if (descr == "'<i4'" || descr == "'<i8'")
    width = descr[3] - '0';
  else
    throw bad(fmt::format("element type {} is not float32, float64, int32 "
                          "or int64 (little-endian)",
                          descr));
  std::vector<char> raw(size_t(count) * size_t(width));
  if (!in.read(raw.data(), std::streamsize(raw.size())))
    throw bad(fmt::format("truncated: {} elements expected", count));
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const char *at = raw.data() + i * width;
    double v;
    if (isFloat && width == 4) {
      float f;
      std::memcpy(&f, at, 4);
      v = f;
    } else if (isFloat) {
      std::memcpy(&v, at, 8);
    } else {
      int64_t x = 0;
      if (width == 4) {
        int32_t y;
        std::memcpy(&y, at, 4);
        x = y;
      } else {
        std::memcpy(&x, at, 8);
      }
      if (x > (1 << 24) || x < -(1 << 24))
        throw bad(fmt::format("element {} = {} is not exact in float32", i, x));
      v = double(x);
    }
    out[size_t(i)] = float(v);
  }
  return out;
}

} // namespace flashjit
