//===- DiskCache.h - flashjit's on-disk cache -------------------*- C++ -*-===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The on-disk cache of compiled cubins and tuning results.
///
/// Layout: <directory>/<kind>/<hash>.entry, where kind is "cubin" or "tuning"
/// and hash is CacheKey::hash(), 16 lower-case hex digits. The directory is
/// cacheDirectory(): FLASHJIT_CACHE_DIR, else $XDG_CACHE_HOME/flashjit, else
/// $HOME/.cache/flashjit.
///
/// What goes into a key is the caller's choice; the contract is
///   cubin:  version, build_id, pipeline, spec, config, copy_bytes, arch,
///           ptx_isa, nvjitlink
///   tuning: version, build_id, spec, problem_class, gpu_name, gpu_cc,
///           gpu_sms, driver
/// so that a cubin is rebuilt whenever anything that shaped it changes, and a
/// different GPU (or driver) tunes again while the same GPU reuses results.
/// build_id names the build of the compiler (tools/engine/BuildId.h: the
/// GNU build id of libflashjit.so), which the version does not: every source
/// build of one version has the same version. Entries of other builds are
/// never read again; `flashjit cache clear` removes them.
///
/// Entry file format (all integers little-endian), 40-byte header then data:
///
///   offset  size  field
///        0     8  magic "FJCACHE1"
///        8     4  format version (1)
///       12     4  reserved (0)
///       16     8  key text length K
///       24     8  payload length P
///       32     8  checksum: 64-bit FNV-1a over the key text then the payload
///       40     K  key text (CacheKey::text())
///     40+K     P  payload
///
/// A file whose size is not exactly 40 + K + P, whose magic, version or
/// checksum is wrong, or whose key text differs from the key asked for (a
/// hash collision, or an entry written for another arch and put there by
/// hand) is reported once on stderr and removed; load() says Rebuilt and the
/// caller rebuilds and stores it again.
///
/// Concurrency: store() writes <hash>.tmp.<pid>.<random> (O_EXCL), fsyncs it
/// and renames it over <hash>.entry, so a reader opens either the old or the
/// new complete file and never a half-written one, and two processes that
/// compile or tune the same key at once both succeed (the last rename wins;
/// both payloads are valid). Stray temp files of crashed writers are never
/// read; clear() removes them.
///
/// I/O failures never throw: a read-only or unreachable cache just does not
/// cache (store() returns false and warns once per directory). Only a
/// malformed kind or key part name throws RuntimeError(InvalidArgument).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_RUNTIME_DISKCACHE_H
#define FLASHJIT_RUNTIME_DISKCACHE_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flashjit::rt {

/// Where the cache lives: FLASHJIT_CACHE_DIR, else $XDG_CACHE_HOME/flashjit,
/// else $HOME/.cache/flashjit (empty or, for XDG_CACHE_HOME, relative values
/// are ignored; without HOME the password database's home directory is used).
std::string cacheDirectory();

/// The 64-bit FNV-1a hash's initial state.
inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;
/// 64-bit FNV-1a of \p size bytes at \p data, continuing from \p state
/// (kFnv1aOffset for a fresh hash): the cache's key hashes and checksums,
/// and engine::loadedImageDigest.
uint64_t fnv1a(uint64_t state, const void *data, size_t size);

/// A cache key: an ordered list of named parts.
///
/// Its text is canonical: one "name=value\n" line per part, in the order the
/// parts were added; a backslash in a value is written "\\" and a newline
/// "\n", so that different part lists never share a text. Its hash is the
/// 64-bit FNV-1a of the text as 16 lower-case hex digits.
class CacheKey {
public:
  /// Appends a part. \p name must be non-empty, made of [A-Za-z0-9_.-] and
  /// not already in the key; otherwise throws RuntimeError(InvalidArgument).
  /// \p value may be any bytes.
  CacheKey &add(const std::string &name, const std::string &value);

  /// The canonical text, "name=value\n" per part.
  std::string text() const;
  /// FNV-1a 64 of text(), 16 lower-case hex digits.
  std::string hash() const;

  /// The parts, in order.
  const std::vector<std::pair<std::string, std::string>> &parts() const {
    return parts_;
  }

private:
  std::vector<std::pair<std::string, std::string>> parts_;
};

/// What load() found.
enum class CacheStatus {
  /// A valid entry for the key: its payload is returned.
  Hit,
  /// No entry for the key.
  Miss,
  /// An entry existed but was truncated, corrupt or foreign; it was reported
  /// and removed, and the caller should rebuild and store it.
  Rebuilt,
};

/// Returns "hit", "miss" or "rebuilt".
const char *toString(CacheStatus status);

/// An on-disk cache directory. Cheap to construct (nothing is touched until
/// the first load/store); safe to use from several threads and processes.
class DiskCache {
public:
  explicit DiskCache(std::string directory = cacheDirectory());

  /// Reads the entry of \p key in \p kind ("cubin" or "tuning"; any
  /// [A-Za-z0-9_-] name is accepted): returns the payload on a hit. A missing
  /// entry -> Miss. A truncated, corrupted (checksum) or foreign (stored key
  /// text != key.text(), e.g. a hash collision or an entry for another arch)
  /// entry -> Rebuilt with nullopt, reported once on stderr
  /// ("flashjit: cache entry <path> is corrupt (<why>); rebuilding") and
  /// removed. An entry that cannot be read at all (permissions) is a Miss.
  std::optional<std::vector<char>>
  load(const std::string &kind, const CacheKey &key, CacheStatus &status);

  /// Atomically stores \p payload: writes <dir>/<kind>/<hash>.tmp.<pid>.<rnd>,
  /// fsyncs it, renames it over <dir>/<kind>/<hash>.entry. Creates
  /// directories as needed. Never throws for I/O failures (a read-only cache
  /// just doesn't cache): returns false and warns once per directory.
  bool store(const std::string &kind, const CacheKey &key,
             const std::vector<char> &payload);

  /// One file of the cache, as list() sees it.
  struct Entry {
    /// The subdirectory: "cubin", "tuning", ...
    std::string kind;
    /// The entry file.
    std::string path;
    /// The file's size on disk (header + key text + payload).
    uint64_t bytes;
    /// The stored key text (empty if the header is unreadable).
    std::string keyText;
    /// Header, size and checksum are right and the file name is the hash of
    /// the key text.
    bool valid;
  };

  /// Every *.entry file of every kind, validated, sorted by kind then path.
  /// Temp files are not listed.
  std::vector<Entry> list() const;

  /// Removes every entry and every stray temp file (including those of a
  /// writer still running, whose store() then returns false), and any
  /// directory named as one (which would block its key); returns how many
  /// were removed. What could not be removed is appended to \p failures
  /// ("cannot remove 'PATH': reason"), if given.
  size_t clear(std::vector<std::string> *failures = nullptr);

  /// The cache directory.
  const std::string &directory() const { return directory_; }

private:
  std::string directory_;
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_DISKCACHE_H
