//===- BuildId.h - The identity of this build of the compiler ---*- C++ -*-===//
//
/// \file
/// Which build of flashjit is running, for the on-disk cache's keys: the
/// project version (0.1.0) stays the same across source builds, `git pull`
/// and `pip install .`, while the code generator changes, so a key that
/// named only the version would hand a rebuilt flashjit the cubins of the
/// old one. The build id names the binary itself.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TOOLS_ENGINE_BUILDID_H
#define FLASHJIT_TOOLS_ENGINE_BUILDID_H

#include <string>

namespace flashjit::engine {

/// The identity of the compiler's build: lower-case hex, never empty,
/// computed once per process (later calls return the same string).
///
/// It is the GNU build id (NT_GNU_BUILD_ID, `-Wl,--build-id=sha1`: 40 hex
/// digits) of the loaded ELF image that holds this code (libflashjit.so,
/// or the test executable that links the engine statically), read from the
/// image's PT_NOTE segments in memory: no file is read. An image linked
/// without a build id gets loadedImageDigest() of itself instead (16 hex
/// digits); where neither can be had (no dl_iterate_phdr) see BuildId.cpp.
const std::string &compilerBuildId();

/// The GNU build id of the loaded ELF image whose segments contain
/// \p address, as lower-case hex; empty when no loaded image contains it or
/// the image has no NT_GNU_BUILD_ID note.
std::string gnuBuildIdOf(const void *address);

/// A digest (64-bit FNV-1a, 16 lower-case hex digits) of the read-only
/// loaded segments (code and constants, as mapped from the file, so the
/// same at every load address) of the loaded ELF image that contains
/// \p address; empty when no loaded image contains it. Reads memory only,
/// so it names the code that runs even when the file on disk was replaced
/// since it was loaded.
std::string loadedImageDigest(const void *address);

} // namespace flashjit::engine

#endif // FLASHJIT_TOOLS_ENGINE_BUILDID_H
