//===- KernelLaunch.h - The launch resources a kernel was compiled for -*- C++
//-*-===//
//
/// \file
/// What the GPU lowering records on every kernel it creates, and the
/// launcher reads back instead of deriving it again:
///
///   gpu.func @attention(...) kernel attributes {
///       attn.shared_bytes = 49152 : i64,
///       attn.grid = {heads = "heads", rows = 128 : i64,
///                    sequence = "seq_q", z = 1 : i64},
///       known_block_size = array<i32: 128, 1, 1>}
///
/// The grid of a problem follows from it: x = ceil(sequence / rows) (the
/// queries or the keys; the queries times gqa for a GQA-packed split-KV
/// partial, over the KV heads), y = batch * heads (all query heads, or the
/// KV heads: heads / gqa), z as recorded (column splits), or the launch's
/// split count where the record says `split` (abi::split). A `persistent`
/// kernel (the K/V ring's forward with the `persistent` option) loops over
/// those x * y tiles itself: its grid is (min(tiles, the launch's
/// programs), 1, z). A `scheduled` persistent kernel (causal: its tiles
/// are uneven) takes one more pointer after the ABI's arguments and its
/// captured tensors, before its tensor maps: the tile schedule
/// (kernels/TileSchedule.h) made for that grid, or null for the fixed
/// stride over the heaviest Q blocks first.
///
/// A kernel whose K/V ring copies by the tensor memory accelerator also
/// records the tensor maps it takes after the ABI's arguments, in order
/// (TensorMapRecord below):
///
///   attn.tensor_maps = [{tensor = "k", rows = "seq_kv", row_stride = "k_sn",
///                        outer = ["k_sb", "k_sh"], cols = 128,
///                        box = [64, 64]}, ...]
///
/// The compiler reads these into KernelLaunch values (compileForGpu), the
/// cubin cache stores them beside the cubin (formatKernelLaunches), and the
/// launchers take them with the cubin. Plain C++, shared by compiler and
/// runtime.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_KERNELLAUNCH_H
#define FLASHJIT_KERNELS_KERNELLAUNCH_H

#include "kernels/AttentionSpec.h"
#include "kernels/GpuGeometry.h"
#include "kernels/KernelABI.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace flashjit {

/// The names `attn.grid` gives its sequences and heads (and `compile
/// --emit cubin` prints).
inline constexpr const char *kGridQueries = "seq_q", *kGridKeys = "seq_kv",
                            *kGridAllHeads = "heads",
                            *kGridKvHeads = "kv_heads";

/// A tensor map a kernel takes as a `__grid_constant__` parameter after the
/// ABI's arguments: the launcher encodes it (cuTensorMapEncodeTiled) over
/// buffer `buffer` (abi::Buffer, or abi::bwd::Buffer where `backward`).
/// Its dimensions, innermost first: `cols` elements, then the index
/// argument `rows` (abi::IndexArg, abi::bwd::IndexArg) of rows `rowStride`
/// (an index argument: a stride in elements) apart, then one per `outer`
/// stride argument, of extent batch * heads (a bound of any index a kernel
/// computes from the program ids); a box of boxCols x boxRows elements,
/// 128-byte swizzle, zeros past the bounds.
struct TensorMapRecord {
  int buffer = 0, rows = 0, rowStride = 0;
  std::vector<int> outer;
  int64_t cols = 0, boxRows = 0, boxCols = 0;
  /// The indices are the backward's ABI's (the dK/dV kernel's Q/dO ring).
  bool backward = false;

  bool operator==(const TensorMapRecord &o) const {
    return buffer == o.buffer && rows == o.rows && rowStride == o.rowStride &&
           outer == o.outer && cols == o.cols && boxRows == o.boxRows &&
           boxCols == o.boxCols && backward == o.backward;
  }
  /// The name of buffer \p i and of index argument \p i in its ABI.
  const char *bufferName(int i) const {
    return backward ? abi::bwd::bufferName(i) : abi::bufferName(i);
  }
  const char *indexName(int i) const {
    return backward ? abi::bwd::indexArgName(i) : abi::indexArgName(i);
  }
  /// How many buffers and index arguments its ABI has.
  int numBuffers() const {
    return backward ? int(abi::bwd::NumBuffers) : int(abi::NumBuffers);
  }
  int numIndexArgs() const {
    return backward ? int(abi::bwd::NumIndexArgs) : int(abi::NumIndexArgs);
  }
  /// Whether its fields name its ABI's arguments and a box that a tensor
  /// map can have (at most 256 per dimension, 5 dimensions).
  bool valid() const {
    auto index = [&](int i) { return i >= 0 && i < numIndexArgs(); };
    bool ok = buffer >= 0 && buffer < numBuffers() && index(rows) &&
              index(rowStride) && outer.size() <= 3 && cols > 0 &&
              boxRows > 0 && boxRows <= 256 && boxCols > 0 && boxCols <= 256;
    for (int o : outer)
      ok &= index(o);
    return ok;
  }
};

/// One kernel's launch resources, as its gpu.func records them.
struct KernelLaunch {
  std::string name;        ///< the kernel function's symbol
  int64_t threads = 0;     ///< threads per block (known_block_size x)
  int64_t sharedBytes = 0; ///< dynamic shared memory per block
  int64_t rows = 0;        ///< sequence rows per program along grid.x
  bool overKeys = false;   ///< grid.x over the keys (else the queries)
  bool kvHeads = false;    ///< grid.y over the KV heads (else all heads)
  int64_t programsZ = 1;   ///< programs along grid.z
  /// Split-KV (kernels/KernelABI.h abi::split): grid.z is the launch's
  /// split count, not programsZ (`split` in attn.grid).
  bool kvSplit = false;
  /// A persistent kernel: grid.x is the launch's program count (the
  /// device's SMs), grid.y 1; each program loops over the tiles.
  bool persistent = false;
  /// A persistent kernel that takes a tile schedule (a pointer, possibly
  /// null) before its tensor maps.
  bool scheduled = false;
  /// The tensor maps it takes after the ABI's arguments, in order.
  std::vector<TensorMapRecord> tensorMaps;

  /// The grid for \p p (with \p gqa query heads per KV head; a grid over
  /// the queries and the KV heads is GQA-packed: its rows are the Nq * gqa
  /// queries of the group's heads), \p splits along z for a split kernel;
  /// a persistent kernel's x is at most \p programs (its tiles, x * y,
  /// when 0).
  std::array<int64_t, 3> grid(const Problem &p, int64_t gqa, int64_t splits = 1,
                              int64_t programs = 0) const {
    int64_t seq = overKeys ? p.seqLenKV : p.seqLenQ;
    if (!overKeys && kvHeads)
      seq *= gqa;
    int64_t heads = kvHeads ? p.heads / gqa : p.heads;
    std::array<int64_t, 3> g = {ceilDiv(seq, rows), p.batch * heads,
                                kvSplit ? splits : programsZ};
    if (persistent) {
      const int64_t tiles = g[0] * g[1];
      g = {programs > 0 ? std::min(tiles, programs) : tiles, 1, g[2]};
    }
    return g;
  }

  /// The grid as a formula: "ceil(seq_q / 128) x batch * heads x 1".
  std::string describeGrid() const {
    return "ceil(" + std::string(overKeys ? kGridKeys : kGridQueries) +
           (!overKeys && kvHeads ? " * gqa" : "") + " / " +
           std::to_string(rows) + ") x batch * " +
           (kvHeads ? kGridKvHeads : kGridAllHeads) + " x " +
           (kvSplit ? std::string("splits") : std::to_string(programsZ)) +
           (persistent ? " tiles, looped over by min(tiles, SMs) programs"
                       : "") +
           (scheduled ? " in the order of a tile schedule" : "");
  }

  /// The tensor maps it takes after the ABI's arguments, in words: "k
  /// [128 x seq_kv (k_sn) x k_sb x k_sh, box 64 x 128], v [...]" (empty
  /// when none).
  std::string describeTensorMaps() const {
    std::string out;
    for (const TensorMapRecord &m : tensorMaps) {
      out += std::string(out.empty() ? "" : ", ") + m.bufferName(m.buffer) +
             " [" + std::to_string(m.cols) + " x " + m.indexName(m.rows) +
             " (" + m.indexName(m.rowStride) + ")";
      for (int o : m.outer)
        out += std::string(" x ") + m.indexName(o);
      out += ", box " + std::to_string(m.boxCols) + " x " +
             std::to_string(m.boxRows) + "]";
    }
    return out;
  }

  /// Whether the values could have come from a lowering (positive sizes).
  bool valid() const {
    for (const TensorMapRecord &m : tensorMaps)
      if (!m.valid())
        return false;
    return !name.empty() && threads > 0 && threads <= 1024 &&
           sharedBytes >= 0 && rows > 0 && programsZ > 0 &&
           (!scheduled || persistent);
  }

  bool operator==(const KernelLaunch &o) const {
    return name == o.name && threads == o.threads &&
           sharedBytes == o.sharedBytes && rows == o.rows &&
           overKeys == o.overKeys && kvHeads == o.kvHeads &&
           programsZ == o.programsZ && kvSplit == o.kvSplit &&
           persistent == o.persistent && scheduled == o.scheduled &&
           tensorMaps == o.tensorMaps;
  }
};

/// A cubin and the launch resources of its kernels, as compiled.
struct KernelImage {
  std::vector<char> cubin;
  std::vector<KernelLaunch> kernels;
};

/// One line per kernel: "NAME threads shared rows keys|queries kv|all z",
/// then " split" for a split-KV kernel, " persistent" for a persistent
/// one (" persistent scheduled" for one that takes a tile schedule), and
/// per tensor map " tma=BUFFER/ROWS/ROW_STRIDE/COLS/BOX_ROWS/
/// BOX_COLS[/OUTER...]" (TensorMapRecord's fields; " bwd-tma=..." where its
/// indices are the backward's ABI's).
inline std::string formatKernelLaunches(const std::vector<KernelLaunch> &ks) {
  std::string out;
  for (const KernelLaunch &k : ks) {
    char line[320];
    std::snprintf(line, sizeof line, "%s %lld %lld %lld %s %s %lld%s%s%s\n",
                  k.name.c_str(), (long long)k.threads,
                  (long long)k.sharedBytes, (long long)k.rows,
                  k.overKeys ? "keys" : "queries", k.kvHeads ? "kv" : "all",
                  (long long)k.programsZ, k.kvSplit ? " split" : "",
                  k.persistent ? " persistent" : "",
                  k.scheduled ? " scheduled" : "");
    out += line;
    out.pop_back(); // the tensor maps go on the line
    for (const TensorMapRecord &m : k.tensorMaps) {
      out += std::string(m.backward ? " bwd-tma=" : " tma=") +
             std::to_string(m.buffer) + "/" + std::to_string(m.rows) + "/" +
             std::to_string(m.rowStride) + "/" + std::to_string(m.cols) + "/" +
             std::to_string(m.boxRows) + "/" + std::to_string(m.boxCols);
      for (int o : m.outer)
        out += "/" + std::to_string(o);
    }
    out += "\n";
  }
  return out;
}

/// The fields of a " tma=..." token (after "tma="); nullopt when malformed.
inline std::optional<TensorMapRecord> parseTensorMap(const std::string &text) {
  std::vector<int64_t> f;
  std::istringstream in(text);
  std::string part;
  while (std::getline(in, part, '/')) {
    if (part.empty() || part.size() > 9 ||
        part.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    f.push_back(std::stoll(part));
  }
  if (f.size() < 6 || f.size() > 9)
    return std::nullopt;
  TensorMapRecord m;
  m.buffer = int(f[0]);
  m.rows = int(f[1]);
  m.rowStride = int(f[2]);
  m.cols = f[3];
  m.boxRows = f[4];
  m.boxCols = f[5];
  m.outer.assign(f.begin() + 6, f.end());
  return m;
}

/// The inverse of formatKernelLaunches; nullopt for any malformed line.
inline std::optional<std::vector<KernelLaunch>>
parseKernelLaunches(const std::string &text) {
  std::vector<KernelLaunch> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    KernelLaunch k;
    std::string over, heads, rest;
    if (!(fields >> k.name >> k.threads >> k.sharedBytes >> k.rows >> over >>
          heads >> k.programsZ) ||
        (over != "keys" && over != "queries") ||
        (heads != "kv" && heads != "all"))
      return std::nullopt;
    // Then " split", " persistent" and " scheduled", each at most once, in
    // that order, then the tensor maps.
    while (fields >> rest) {
      const bool backward = rest.rfind("bwd-tma=", 0) == 0;
      if (backward || rest.rfind("tma=", 0) == 0) {
        std::optional<TensorMapRecord> m =
            parseTensorMap(rest.substr(backward ? 8 : 4));
        if (!m)
          return std::nullopt;
        m->backward = backward;
        k.tensorMaps.push_back(*m);
      } else if (!k.tensorMaps.empty()) {
        return std::nullopt;
      } else if (rest == "split" && !k.kvSplit && !k.persistent) {
        k.kvSplit = true;
      } else if (rest == "persistent" && !k.persistent) {
        k.persistent = true;
      } else if (rest == "scheduled" && k.persistent && !k.scheduled) {
        k.scheduled = true;
      } else {
        return std::nullopt;
      }
    }
    k.overKeys = over == "keys";
    k.kvHeads = heads == "kv";
    if (!k.valid())
      return std::nullopt;
    out.push_back(k);
  }
  return out;
}

/// The kernel named \p name in \p ks, or null.
inline const KernelLaunch *findKernelLaunch(const std::vector<KernelLaunch> &ks,
                                            const std::string &name) {
  for (const KernelLaunch &k : ks)
    if (k.name == name)
      return &k;
  return nullptr;
}

} // namespace flashjit

#endif // FLASHJIT_KERNELS_KERNELLAUNCH_H
