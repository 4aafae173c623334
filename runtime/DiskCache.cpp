//===- DiskCache.cpp - flashjit's on-disk cache ---------------------------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// See DiskCache.h for the layout, the entry format and the concurrency
/// argument. Plain POSIX I/O: open/read/write/fsync/rename, so that the
/// atomicity of rename() and O_EXCL are what the code relies on, visibly.
///
//===----------------------------------------------------------------------===//

#include "runtime/DiskCache.h"
#include "runtime/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <tuple>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace flashjit::rt {

namespace {

constexpr char kMagic[8] = {'F', 'J', 'C', 'A', 'C', 'H', 'E', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 40;

std::string hex16(uint64_t value) { return fmt::format("{:016x}", value); }

std::string hashOfText(const std::string &text) {
  return hex16(fnv1a(kFnv1aOffset, text.data(), text.size()));
}

uint64_t checksumOf(const char *keyText, size_t keySize, const char *payload,
                    size_t payloadSize) {
  return fnv1a(fnv1a(kFnv1aOffset, keyText, keySize), payload, payloadSize);
}

void putLE(unsigned char *out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out[i] = static_cast<unsigned char>(value >> (8 * i));
}

uint64_t getLE(const unsigned char *in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

bool isHexHash(const std::string &s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

/// Kinds become directory names: keep them to a safe alphabet.
void checkKind(const std::string &kind) {
  bool ok = !kind.empty() && std::all_of(kind.begin(), kind.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
  if (!ok)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("invalid cache kind '{}': expected a "
                                   "non-empty [A-Za-z0-9_-] name",
                                   kind));
}

/// The ways a cache file can be named: <hash>.entry, <hash>.tmp.<...>.
enum class FileRole { Entry, Temp, Other };

FileRole roleOf(const std::string &name) {
  if (name.size() < 17 || name[16] != '.' || !isHexHash(name.substr(0, 16)))
    return FileRole::Other;
  std::string rest = name.substr(16);
  if (rest == ".entry")
    return FileRole::Entry;
  if (rest.compare(0, 5, ".tmp.") == 0)
    return FileRole::Temp;
  return FileRole::Other;
}

bool readAll(int fd, char *out, size_t size) {
  while (size > 0) {
    ssize_t n = ::read(fd, out, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    out += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool writeAll(int fd, const char *data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

/// The contents of an entry file that passed every structural check.
struct ParsedEntry {
  std::string keyText;
  std::vector<char> payload;
};

/// Reads and checks the entry open on \p fd (of \p fileSize bytes). Returns
/// an empty string if it is well-formed, else why not. \p out.keyText is
/// filled whenever the header was readable.
std::string readEntry(int fd, uint64_t fileSize, ParsedEntry &out) {
  unsigned char header[kHeaderSize];
  if (fileSize < kHeaderSize)
    return fmt::format("truncated: {} bytes, shorter than the {}-byte header",
                       fileSize, kHeaderSize);
  if (!readAll(fd, reinterpret_cast<char *>(header), kHeaderSize))
    return fmt::format("unreadable header: {}", std::strerror(errno));
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0)
    return "not a flashjit cache entry: bad magic";
  uint64_t version = getLE(header + 8, 4);
  if (version != kFormatVersion)
    return fmt::format("format version {}, expected {}", version,
                       kFormatVersion);
  uint64_t keySize = getLE(header + 16, 8);
  uint64_t payloadSize = getLE(header + 24, 8);
  uint64_t checksum = getLE(header + 32, 8);
  uint64_t dataSize = fileSize - kHeaderSize;
  // Compare without overflow: sizes come from an untrusted file.
  if (keySize > dataSize || payloadSize > dataSize - keySize)
    return fmt::format("truncated: {} bytes, the header promises {} + {} + {}",
                       fileSize, kHeaderSize, keySize, payloadSize);
  if (keySize + payloadSize != dataSize)
    return fmt::format("{} trailing bytes after the payload",
                       dataSize - keySize - payloadSize);
  out.keyText.assign(static_cast<size_t>(keySize), '\0');
  out.payload.resize(static_cast<size_t>(payloadSize));
  if (!readAll(fd, out.keyText.data(), out.keyText.size()) ||
      !readAll(fd, out.payload.data(), out.payload.size()))
    return "truncated while reading";
  if (checksumOf(out.keyText.data(), out.keyText.size(), out.payload.data(),
                 out.payload.size()) != checksum)
    return "checksum mismatch";
  return "";
}

/// Names the first line where a stored key text differs from the wanted one,
/// e.g. "its key has arch=sm_80 where arch=sm_90 was asked for".
std::string describeKeyDifference(const std::string &stored,
                                  const std::string &wanted) {
  auto lineAt = [](const std::string &text, size_t pos) {
    size_t end = text.find('\n', pos);
    return text.substr(pos, end == std::string::npos ? std::string::npos
                                                     : end - pos);
  };
  size_t a = 0, b = 0;
  while (a < stored.size() || b < wanted.size()) {
    std::string sa = lineAt(stored, a), sb = lineAt(wanted, b);
    if (a >= stored.size())
      return fmt::format("foreign entry: its key lacks '{}'", sb);
    if (b >= wanted.size())
      return fmt::format("foreign entry: its key has an extra '{}'", sa);
    if (sa != sb)
      return fmt::format("foreign entry: its key has '{}' where '{}' was "
                         "asked for",
                         sa, sb);
    a += sa.size() + 1;
    b += sb.size() + 1;
  }
  return "foreign entry: its key differs";
}

std::mutex &reportMutex() {
  static std::mutex mutex;
  return mutex;
}

/// Prints \p message once per process for each distinct \p what.
void reportOnce(const std::string &what, const std::string &message) {
  static std::set<std::string> reported;
  {
    std::lock_guard<std::mutex> lock(reportMutex());
    if (!reported.insert(what).second)
      return;
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
}

/// A name no other writer (thread, process, or host sharing the directory)
/// picks: pid, a process-wide counter and 64 random bits.
std::string uniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  uint64_t random = 0;
  try {
    std::random_device device;
    random = (static_cast<uint64_t>(device()) << 32) ^ device();
  } catch (...) {
  }
  random ^= static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  random ^= counter.fetch_add(1) * 0x9e3779b97f4a7c15ULL;
  return fmt::format("{}.{}", static_cast<long>(::getpid()), hex16(random));
}

std::string stripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  return path;
}

std::string nonEmptyEnv(const char *name) {
  const char *value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

} // namespace

//===----------------------------------------------------------------------===//
// cacheDirectory, CacheKey, CacheStatus
//===----------------------------------------------------------------------===//

uint64_t fnv1a(uint64_t state, const void *data, size_t size) {
  const auto *bytes = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i) {
    state ^= bytes[i];
    state *= 0x100000001b3ULL; // the FNV prime
  }
  return state;
}

std::string cacheDirectory() {
  std::string dir = nonEmptyEnv("FLASHJIT_CACHE_DIR");
  if (!dir.empty())
    return stripTrailingSlashes(dir);
  // The XDG base directory spec: a relative XDG_CACHE_HOME is invalid.
  std::string xdg = nonEmptyEnv("XDG_CACHE_HOME");
  if (!xdg.empty() && xdg[0] == '/')
    return stripTrailingSlashes(xdg) + "/flashjit";
  std::string home = nonEmptyEnv("HOME");
  if (home.empty()) {
    struct passwd pw, *result = nullptr;
    char buffer[4096];
    if (::getpwuid_r(::getuid(), &pw, buffer, sizeof(buffer), &result) == 0 &&
        result && result->pw_dir && result->pw_dir[0])
      home = result->pw_dir;
  }
  if (!home.empty())
    return stripTrailingSlashes(home) + "/.cache/flashjit";
  return fmt::format("/tmp/flashjit-cache-{}", static_cast<long>(::getuid()));
}

CacheKey &CacheKey::add(const std::string &name, const std::string &value) {
  bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
  if (!ok)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("invalid cache key part name '{}': "
                                   "expected a non-empty [A-Za-z0-9_.-] name",
                                   name));
  for (const auto &part : parts_)
    if (part.first == name)
      throw RuntimeError(
          ErrorCode::InvalidArgument,
          fmt::format("cache key part '{}' is given twice", name));
  parts_.emplace_back(name, value);
  return *this;
}

std::string CacheKey::text() const {
  std::string text;
  for (const auto &[name, value] : parts_) {
    text += name;
    text += '=';
    for (char c : value) {
      if (c == '\\')
        text += "\\\\";
      else if (c == '\n')
        text += "\\n";
      else
        text += c;
    }
    text += '\n';
  }
  return text;
}

std::string CacheKey::hash() const { return hashOfText(text()); }

const char *toString(CacheStatus status) {
  switch (status) {
  case CacheStatus::Hit:
    return "hit";
  case CacheStatus::Miss:
    return "miss";
  case CacheStatus::Rebuilt:
    return "rebuilt";
  }
  return "unknown";
}

//===----------------------------------------------------------------------===//
// DiskCache
//===----------------------------------------------------------------------===//

DiskCache::DiskCache(std::string directory)
    : directory_(stripTrailingSlashes(std::move(directory))) {}

std::optional<std::vector<char>> DiskCache::load(const std::string &kind,
                                                 const CacheKey &key,
                                                 CacheStatus &status) {
  checkKind(kind);
  status = CacheStatus::Miss;
  std::string path = directory_ + "/" + kind + "/" + key.hash() + ".entry";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT && errno != ENOTDIR)
      reportOnce("read:" + directory_,
                 fmt::format("flashjit: cannot read the cache entry {} ({}); "
                             "not using the cache there",
                             path, std::strerror(errno)));
    return std::nullopt;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return std::nullopt;
  }

  ParsedEntry entry;
  std::string why = readEntry(fd, static_cast<uint64_t>(st.st_size), entry);
  if (why.empty()) {
    std::string wanted = key.text();
    if (entry.keyText == wanted) {
      ::close(fd);
      status = CacheStatus::Hit;
      return std::move(entry.payload);
    }
    why = describeKeyDifference(entry.keyText, wanted);
  }

  // A bad entry: report it (once per file version), and remove it unless a
  // writer has meanwhile renamed a fresh entry over the path.
  status = CacheStatus::Rebuilt;
  reportOnce(fmt::format("corrupt:{}:{}:{}:{}:{}", path,
                         static_cast<unsigned long long>(st.st_dev),
                         static_cast<unsigned long long>(st.st_ino),
                         static_cast<long long>(st.st_size),
                         static_cast<long long>(st.st_mtime)),
             fmt::format("flashjit: cache entry {} is corrupt ({}); rebuilding",
                         path, why));
  struct stat now;
  if (::stat(path.c_str(), &now) == 0 && now.st_dev == st.st_dev &&
      now.st_ino == st.st_ino)
    ::unlink(path.c_str());
  ::close(fd);
  return std::nullopt;
}

bool DiskCache::store(const std::string &kind, const CacheKey &key,
                      const std::vector<char> &payload) {
  checkKind(kind);
  std::string dir = directory_ + "/" + kind;
  std::string hash = key.hash();
  std::string text = key.text();
  std::string finalPath = dir + "/" + hash + ".entry";
  std::string tempPath = dir + "/" + hash + ".tmp." + uniqueSuffix();

  auto fail = [&](const std::string &what) {
    reportOnce("write:" + directory_,
               fmt::format("flashjit: cannot write the cache in {} ({}: {}); "
                           "continuing without caching",
                           directory_, what, std::strerror(errno)));
    return false;
  };

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    errno = ec.value();
    return fail("creating " + dir);
  }

  int fd =
      ::open(tempPath.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0)
    return fail("creating " + tempPath);

  unsigned char header[kHeaderSize] = {};
  std::memcpy(header, kMagic, sizeof(kMagic));
  putLE(header + 8, kFormatVersion, 4);
  putLE(header + 12, 0, 4);
  putLE(header + 16, text.size(), 8);
  putLE(header + 24, payload.size(), 8);
  putLE(header + 32,
        checksumOf(text.data(), text.size(), payload.data(), payload.size()),
        8);

  bool ok = writeAll(fd, reinterpret_cast<const char *>(header), kHeaderSize) &&
            writeAll(fd, text.data(), text.size()) &&
            writeAll(fd, payload.data(), payload.size()) && ::fsync(fd) == 0;
  int savedErrno = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    savedErrno = errno;
  }
  if (!ok) {
    ::unlink(tempPath.c_str());
    errno = savedErrno;
    return fail("writing " + tempPath);
  }
  if (::rename(tempPath.c_str(), finalPath.c_str()) != 0) {
    savedErrno = errno;
    ::unlink(tempPath.c_str());
    errno = savedErrno;
    return fail("renaming to " + finalPath);
  }
  // Make the rename itself durable; a failure here loses nothing but
  // durability, so it is not reported.
  int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
  return true;
}

std::vector<DiskCache::Entry> DiskCache::list() const {
  std::vector<Entry> entries;
  std::error_code ec;
  for (fs::directory_iterator kinds(directory_, ec), end; !ec && kinds != end;
       kinds.increment(ec)) {
    std::error_code typeEc;
    if (!kinds->is_directory(typeEc))
      continue;
    std::string kind = kinds->path().filename().string();
    std::error_code fileEc;
    for (fs::directory_iterator files(kinds->path(), fileEc);
         !fileEc && files != end; files.increment(fileEc)) {
      std::string name = files->path().filename().string();
      if (roleOf(name) != FileRole::Entry)
        continue;
      Entry entry{kind, files->path().string(), 0, "", false};
      int fd = ::open(entry.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        continue; // Removed meanwhile (or unreadable).
      struct stat st;
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        entry.bytes = static_cast<uint64_t>(st.st_size);
        ParsedEntry parsed;
        std::string why = readEntry(fd, entry.bytes, parsed);
        entry.keyText = parsed.keyText;
        entry.valid =
            why.empty() && hashOfText(parsed.keyText) == name.substr(0, 16);
      }
      ::close(fd);
      entries.push_back(std::move(entry));
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry &a, const Entry &b) {
    return std::tie(a.kind, a.path) < std::tie(b.kind, b.path);
  });
  return entries;
}

size_t DiskCache::clear(std::vector<std::string> *failures) {
  size_t removed = 0;
  std::error_code ec;
  for (fs::directory_iterator kinds(directory_, ec), end; !ec && kinds != end;
       kinds.increment(ec)) {
    std::error_code typeEc;
    if (!kinds->is_directory(typeEc))
      continue;
    std::error_code fileEc;
    for (fs::directory_iterator files(kinds->path(), fileEc);
         !fileEc && files != end; files.increment(fileEc)) {
      // Only files named like ours: a mistaken FLASHJIT_CACHE_DIR=$HOME
      // must not delete anything else.
      if (roleOf(files->path().filename().string()) == FileRole::Other)
        continue;
      const std::string path = files->path().string();
      if (::unlink(path.c_str()) == 0) {
        ++removed;
        continue;
      }
      int err = errno;
      if (err == ENOENT)
        continue; // removed meanwhile (another clear, a reader's repair)
      // A directory named as an entry (made by hand, or by a tool that
      // mistook the cache): store() could never rename a new entry onto
      // it, so it is removed too, whatever it holds.
      std::error_code dirEc;
      if (err == EISDIR || err == EPERM) {
        if (fs::is_directory(fs::symlink_status(path, dirEc)) &&
            fs::remove_all(path, dirEc) != static_cast<std::uintmax_t>(-1) &&
            !dirEc) {
          ++removed;
          continue;
        }
        if (dirEc)
          err = dirEc.value();
      }
      if (failures)
        failures->push_back(
            fmt::format("cannot remove '{}': {}", path, std::strerror(err)));
    }
  }
  return removed;
}

} // namespace flashjit::rt
