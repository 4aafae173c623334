//===- BuildId.cpp - The identity of this build of the compiler -----------===//

#include "tools/engine/BuildId.h"
#include "runtime/DiskCache.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

#if defined(__ELF__) && __has_include(<link.h>)
#include <elf.h>
#include <link.h>
#define FLASHJIT_HAVE_DL_ITERATE_PHDR 1
#else
#define FLASHJIT_HAVE_DL_ITERATE_PHDR 0
#endif

namespace flashjit::engine {

namespace {

std::string toHex(const unsigned char *bytes, size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    hex += digits[bytes[i] >> 4];
    hex += digits[bytes[i] & 15];
  }
  return hex;
}

std::string toHex(uint64_t value) { return fmt::format("{:016x}", value); }

#if FLASHJIT_HAVE_DL_ITERATE_PHDR

/// Whether one of \p info's PT_LOAD segments contains \p address.
bool contains(const dl_phdr_info &info, uintptr_t address) {
  for (int i = 0; i < info.dlpi_phnum; ++i) {
    const ElfW(Phdr) &ph = info.dlpi_phdr[i];
    uintptr_t start = info.dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && address >= start &&
        address - start < ph.p_memsz)
      return true;
  }
  return false;
}

/// The NT_GNU_BUILD_ID note of a loaded image, from its PT_NOTE segments
/// (mapped with the image: .note.gnu.build-id is an allocated section, kept
/// by strip); empty if it has none.
std::string buildIdNote(const dl_phdr_info &info) {
  for (int i = 0; i < info.dlpi_phnum; ++i) {
    const ElfW(Phdr) &ph = info.dlpi_phdr[i];
    if (ph.p_type != PT_NOTE)
      continue;
    const auto *notes =
        reinterpret_cast<const unsigned char *>(info.dlpi_addr + ph.p_vaddr);
    size_t size = ph.p_memsz;
    // Notes are padded to 4 bytes, or to 8 in a segment aligned so.
    size_t align = ph.p_align == 8 ? 8 : 4;
    auto padded = [align](size_t n) { return (n + align - 1) & ~(align - 1); };
    size_t offset = 0;
    while (offset + sizeof(ElfW(Nhdr)) <= size) {
      ElfW(Nhdr) note;
      std::memcpy(&note, notes + offset, sizeof(note));
      if (note.n_namesz > size || note.n_descsz > size)
        break; // malformed: stop rather than read past the segment
      size_t name = offset + sizeof(note);
      size_t desc = name + padded(note.n_namesz);
      size_t next = desc + padded(note.n_descsz);
      if (desc + note.n_descsz > size)
        break;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 &&
          std::memcmp(notes + name, "GNU", 4) == 0 && note.n_descsz > 0)
        return toHex(notes + desc, note.n_descsz);
      offset = next;
    }
  }
  return {};
}

/// FNV-1a over the read-only PT_LOAD segments of a loaded image, as mapped
/// from the file (p_filesz; position-independent code has no relocations
/// there, so the bytes do not depend on the load address).
std::string readOnlyDigest(const dl_phdr_info &info) {
  uint64_t hash = rt::kFnv1aOffset;
  for (int i = 0; i < info.dlpi_phnum; ++i) {
    const ElfW(Phdr) &ph = info.dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_W) || !(ph.p_flags & PF_R))
      continue;
    hash = rt::fnv1a(
        hash, reinterpret_cast<const void *>(info.dlpi_addr + ph.p_vaddr),
        ph.p_filesz);
  }
  return toHex(hash);
}

/// \p read of the loaded image that contains \p address (run while the
/// loader holds its list, so the image cannot go away meanwhile); empty
/// when none does.
std::string ofImageContaining(const void *address,
                              std::string (*read)(const dl_phdr_info &)) {
  struct Search {
    uintptr_t address;
    std::string (*read)(const dl_phdr_info &);
    std::string result;
  } search{reinterpret_cast<uintptr_t>(address), read, {}};
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *data) {
        auto &s = *static_cast<Search *>(data);
        if (!contains(*info, s.address))
          return 0;
        s.result = s.read(*info);
        return 1;
      },
      &search);
  return search.result;
}

#endif // FLASHJIT_HAVE_DL_ITERATE_PHDR

} // namespace

std::string gnuBuildIdOf(const void *address) {
#if FLASHJIT_HAVE_DL_ITERATE_PHDR
  return ofImageContaining(address, buildIdNote);
#else
  (void)address;
  return {};
#endif
}

std::string loadedImageDigest(const void *address) {
#if FLASHJIT_HAVE_DL_ITERATE_PHDR
  return ofImageContaining(address, readOnlyDigest);
#else
  (void)address;
  return {};
#endif
}

const std::string &compilerBuildId() {
  static const std::string id = [] {
    const void *self = reinterpret_cast<const void *>(&compilerBuildId);
    // 1. The linker's build id (tools/CMakeLists.txt links with
    //    -Wl,--build-id=sha1): a hash of the whole image, so it changes
    //    with any change to the code, and costs a walk over a few notes.
    std::string id = gnuBuildIdOf(self);
    // 2. An image linked without one: a digest of its code and constants
    //    in memory (tens of MB once per process, still no file I/O).
    if (id.empty())
      id = loadedImageDigest(self);
#if FLASHJIT_HAVE_DL_ITERATE_PHDR
    // 3. Cannot happen (this code is in a loaded image): a random id, so
    //    that nothing cached is ever trusted (the cache then only costs).
    if (id.empty()) {
      std::random_device random;
      id = toHex(uint64_t(random()) << 32 | random());
    }
#else
    // 3. No dl_iterate_phdr (not an ELF platform): the time this file was
    //    compiled. Weak: it changes only when BuildId.cpp is compiled again,
    //    not with the rest of the code; a port should read its platform's
    //    image identity (e.g. LC_UUID on Mach-O) instead. (Not on ELF:
    //    __DATE__ and __TIME__ would make every compile of this file, and so
    //    the build id, differ, and an unchanged rebuild miss the cache.)
    if (id.empty()) {
      const char stamp[] = __DATE__ " " __TIME__;
      id = toHex(rt::fnv1a(rt::kFnv1aOffset, stamp, sizeof(stamp) - 1));
    }
#endif
    return id;
  }();
  return id;
}

} // namespace flashjit::engine
