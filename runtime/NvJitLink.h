//===- NvJitLink.h - PTX -> cubin with nvJitLink (dlopen) -------*- C++ -*-===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Turns PTX into a cubin in-process with NVIDIA's nvJitLink library, which
/// needs no GPU. Like the driver, the library is dlopen'ed, never linked; it is
/// searched for as
///
///   $FLASHJIT_NVJITLINK (if set, the only candidate), else
///   "libnvJitLink.so.13", "libnvJitLink.so", and the toolkit's
///   <CUDA_ROOT>/lib64/libnvJitLink.so.13 baked in at build time.
///
/// ptxToCubin() always asks for "-verbose", so the info log carries ptxas's
/// resource report and then the linker's, which parseResourceUsage() reads:
///
///   ptxas info    : Compiling entry function 'vector_add' for 'sm_90a'
///   ptxas info    : Function properties for vector_add
///   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes
///   spill loads
///   ptxas info    : Used 12 registers, used 0 barriers
///   ptxas info    : Compile time = 1.340 ms
///   info    : 0 bytes gmem
///   info    : Function properties for 'vector_add':
///   info    : used 12 registers, used 0 barriers, 0 stack, 0 bytes smem,
///   556 bytes cmem[0], 0 bytes lmem
///
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_RUNTIME_NVJITLINK_H
#define FLASHJIT_RUNTIME_NVJITLINK_H

#include "runtime/Error.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace flashjit::rt {

/// The nvJitLink library, loaded with dlopen. Use NvJitLink::get(); tests may
/// construct their own from chosen candidate paths.
class NvJitLink {
public:
  /// The process-wide instance, loaded on first use from defaultCandidates().
  static NvJitLink &get();

  /// The paths tried, in order (see the file comment).
  static std::vector<std::string> defaultCandidates();

  /// dlopens the first candidate that loads and resolves the entry points.
  /// Failure is recorded (available() == false), not thrown.
  explicit NvJitLink(const std::vector<std::string> &candidates);
  ~NvJitLink();
  NvJitLink(const NvJitLink &) = delete;
  NvJitLink &operator=(const NvJitLink &) = delete;

  bool available() const;
  /// "nvJitLink not found: dlopen(libnvJitLink.so.13) failed: ...; ...".
  const std::string &unavailableReason() const;
  /// The path that loaded (empty if none did).
  const std::string &libraryPath() const;

  /// Major and minor version, e.g. {13, 0}; throws NvJitLinkError if the
  /// library is unavailable.
  std::pair<unsigned, unsigned> version() const;

  struct Api; // defined in NvJitLink.cpp
  /// Throws NvJitLinkError with unavailableReason() unless available().
  const Api &api() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A linked cubin and the linker's info log.
struct CubinResult {
  /// The cubin (an ELF image).
  std::vector<char> cubin;
  /// nvJitLink's info log: ptxas's verbose resource report.
  std::string infoLog;
};

/// Compiles \p ptx for \p arch (e.g. "sm_90a", "sm_80") with
/// "-arch=<arch> -O3 -verbose -no-cache" plus \p extraOptions (e.g.
/// "-lineinfo", "-maxrregcount=128"). -no-cache keeps nvJitLink from serving
/// the cubin from the driver's compute cache, which would drop ptxas's report
/// (and its spill counts) from the info log. Throws RuntimeError
/// (NvJitLinkError) whose message holds nvJitLink's error log on failure
/// (for PTX inputs nvJitLinkAddData is the call that fails: nvJitLink
/// compiles PTX as soon as it is added).
CubinResult ptxToCubin(const std::string &ptx, const std::string &arch,
                       const std::vector<std::string> &extraOptions = {},
                       NvJitLink &nvJitLink = NvJitLink::get());

/// "13.0" for nvJitLink 13.0; throws if the library is unavailable.
std::string nvJitLinkVersionString(NvJitLink &nvJitLink = NvJitLink::get());

/// What ptxas and the linker reported for one kernel. -1 registers means
/// "not reported". Spill counts come from ptxas's report only; a log without
/// it (a cubin served from a cache) leaves them 0, though stackBytes still
/// comes from the linker's report.
struct ResourceUsage {
  int registers = -1;
  int spillStoresBytes = 0;
  int spillLoadsBytes = 0;
  /// Static shared memory of the linked cubin ("smem"), which can exceed
  /// what ptxas reported (sm_90a kernels that use shared memory get 1 KiB
  /// more); dynamic shared memory is not included.
  int sharedBytes = 0;
  /// Stack frame.
  int stackBytes = 0;
  int barriers = 0;

  bool spills() const { return spillStoresBytes > 0 || spillLoadsBytes > 0; }
};

/// Resource usage per function name, from an nvJitLink/ptxas verbose log.
std::map<std::string, ResourceUsage>
parseResourceUsagePerFunction(const std::string &infoLog);

/// The usage of the kernel \p function in \p infoLog (default-constructed if
/// the log does not mention it).
ResourceUsage parseResourceUsage(const std::string &infoLog,
                                 const std::string &function);

/// For a log of one kernel, its usage; for several, the field-wise maximum
/// over all functions (so spills() tells whether anything spilled).
ResourceUsage parseResourceUsage(const std::string &infoLog);

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_NVJITLINK_H
