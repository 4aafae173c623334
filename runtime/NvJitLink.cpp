//===- NvJitLink.cpp - PTX -> cubin with nvJitLink, loaded with dlopen ----===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// nvJitLink.h turns the API names into inline wrappers over versioned
/// symbols: nvJitLinkCreate(...) calls __nvJitLinkCreate_13_0(...). The
/// library exports both spellings; we dlsym the versioned one that the header
/// was written against and fall back to the plain name (same signature) for
/// libraries of another version. nvJitLinkVersion is not versioned.
///
//===----------------------------------------------------------------------===//

#include "runtime/NvJitLink.h"

#include <nvJitLink.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <regex>
#include <sstream>

#ifndef FLASHJIT_NVJITLINK_FALLBACK_PATH
#define FLASHJIT_NVJITLINK_FALLBACK_PATH                                       \
  "/usr/local/cuda/lib64/libnvJitLink.so.13"
#endif

using namespace flashjit::rt;

/// The entry points, typed by the header's declarations of the versioned
/// symbols.
struct NvJitLink::Api {
  decltype(&::__nvJitLinkCreate_13_0) create = nullptr;
  decltype(&::__nvJitLinkDestroy_13_0) destroy = nullptr;
  decltype(&::__nvJitLinkAddData_13_0) addData = nullptr;
  decltype(&::__nvJitLinkComplete_13_0) complete = nullptr;
  decltype(&::__nvJitLinkGetLinkedCubinSize_13_0) getLinkedCubinSize = nullptr;
  decltype(&::__nvJitLinkGetLinkedCubin_13_0) getLinkedCubin = nullptr;
  decltype(&::__nvJitLinkGetErrorLogSize_13_0) getErrorLogSize = nullptr;
  decltype(&::__nvJitLinkGetErrorLog_13_0) getErrorLog = nullptr;
  decltype(&::__nvJitLinkGetInfoLogSize_13_0) getInfoLogSize = nullptr;
  decltype(&::__nvJitLinkGetInfoLog_13_0) getInfoLog = nullptr;
  decltype(&::nvJitLinkVersion) version = nullptr;
};

struct NvJitLink::Impl {
  void *handle = nullptr;
  std::string path;
  std::string reason;
  Api api;
};

namespace {

/// Resolves "__<name>_13_0", else "<name>", into \p slot.
template <typename Fn>
bool resolve(void *handle, const char *name, Fn &slot, bool versioned = true) {
  void *symbol = nullptr;
  if (versioned)
    symbol = dlsym(handle, fmt::format("__{}_13_0", name).c_str());
  if (!symbol)
    symbol = dlsym(handle, name);
  slot = reinterpret_cast<Fn>(symbol);
  return symbol != nullptr;
}

const char *resultName(nvJitLinkResult result) {
  switch (result) {
#define FLASHJIT_CASE(code)                                                    \
  case code:                                                                   \
    return #code;
    FLASHJIT_CASE(NVJITLINK_SUCCESS)
    FLASHJIT_CASE(NVJITLINK_ERROR_UNRECOGNIZED_OPTION)
    FLASHJIT_CASE(NVJITLINK_ERROR_MISSING_ARCH)
    FLASHJIT_CASE(NVJITLINK_ERROR_INVALID_INPUT)
    FLASHJIT_CASE(NVJITLINK_ERROR_PTX_COMPILE)
    FLASHJIT_CASE(NVJITLINK_ERROR_NVVM_COMPILE)
    FLASHJIT_CASE(NVJITLINK_ERROR_INTERNAL)
    FLASHJIT_CASE(NVJITLINK_ERROR_THREADPOOL)
    FLASHJIT_CASE(NVJITLINK_ERROR_UNRECOGNIZED_INPUT)
    FLASHJIT_CASE(NVJITLINK_ERROR_FINALIZE)
    FLASHJIT_CASE(NVJITLINK_ERROR_NULL_INPUT)
    FLASHJIT_CASE(NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS)
    FLASHJIT_CASE(NVJITLINK_ERROR_INCORRECT_INPUT_TYPE)
    FLASHJIT_CASE(NVJITLINK_ERROR_ARCH_MISMATCH)
    FLASHJIT_CASE(NVJITLINK_ERROR_OUTDATED_LIBRARY)
    FLASHJIT_CASE(NVJITLINK_ERROR_MISSING_FATBIN)
    FLASHJIT_CASE(NVJITLINK_ERROR_UNRECOGNIZED_ARCH)
    FLASHJIT_CASE(NVJITLINK_ERROR_UNSUPPORTED_ARCH)
    FLASHJIT_CASE(NVJITLINK_ERROR_LTO_NOT_ENABLED)
#undef FLASHJIT_CASE
  }
  return "NVJITLINK_ERROR_UNKNOWN";
}

/// Destroys the link handle when the compile is over, however it ends.
class LinkHandle {
public:
  LinkHandle(const NvJitLink::Api &api) : api_(api) {}
  ~LinkHandle() {
    if (handle_)
      api_.destroy(&handle_);
  }
  LinkHandle(const LinkHandle &) = delete;
  LinkHandle &operator=(const LinkHandle &) = delete;
  nvJitLinkHandle *address() { return &handle_; }
  nvJitLinkHandle get() const { return handle_; }

  std::string errorLog() const {
    size_t size = 0;
    if (api_.getErrorLogSize(handle_, &size) != NVJITLINK_SUCCESS || size == 0)
      return {};
    std::string log(size, '\0');
    if (api_.getErrorLog(handle_, log.data()) != NVJITLINK_SUCCESS)
      return {};
    log.resize(std::strlen(log.c_str()));
    return log;
  }

  std::string infoLog() const {
    size_t size = 0;
    if (api_.getInfoLogSize(handle_, &size) != NVJITLINK_SUCCESS || size == 0)
      return {};
    std::string log(size, '\0');
    if (api_.getInfoLog(handle_, log.data()) != NVJITLINK_SUCCESS)
      return {};
    log.resize(std::strlen(log.c_str()));
    return log;
  }

private:
  const NvJitLink::Api &api_;
  nvJitLinkHandle handle_ = nullptr;
};

} // namespace

//===----------------------------------------------------------------------===//
// NvJitLink
//===----------------------------------------------------------------------===//

NvJitLink &NvJitLink::get() {
  // Leaked on purpose, like CudaDriver::get().
  static NvJitLink *instance = new NvJitLink(defaultCandidates());
  return *instance;
}

std::vector<std::string> NvJitLink::defaultCandidates() {
  const char *env = std::getenv("FLASHJIT_NVJITLINK");
  if (env && *env)
    return {env};
  return {"libnvJitLink.so.13", "libnvJitLink.so",
          FLASHJIT_NVJITLINK_FALLBACK_PATH};
}

NvJitLink::NvJitLink(const std::vector<std::string> &candidates)
    : impl_(std::make_unique<Impl>()) {
  std::vector<std::string> failures;
  for (const std::string &candidate : candidates) {
    void *handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char *err = dlerror();
      failures.push_back(fmt::format("dlopen({}) failed: {}", candidate,
                                     err ? err : "unknown error"));
      continue;
    }
    Api api;
    std::vector<std::string> missing;
    auto need = [&](const char *name, auto &slot, bool versioned = true) {
      if (!resolve(handle, name, slot, versioned))
        missing.push_back(name);
    };
    need("nvJitLinkCreate", api.create);
    need("nvJitLinkDestroy", api.destroy);
    need("nvJitLinkAddData", api.addData);
    need("nvJitLinkComplete", api.complete);
    need("nvJitLinkGetLinkedCubinSize", api.getLinkedCubinSize);
    need("nvJitLinkGetLinkedCubin", api.getLinkedCubin);
    need("nvJitLinkGetErrorLogSize", api.getErrorLogSize);
    need("nvJitLinkGetErrorLog", api.getErrorLog);
    need("nvJitLinkGetInfoLogSize", api.getInfoLogSize);
    need("nvJitLinkGetInfoLog", api.getInfoLog);
    need("nvJitLinkVersion", api.version, /*versioned=*/false);
    if (!missing.empty()) {
      failures.push_back(
          fmt::format("{} lacks {}", candidate, fmt::join(missing, ", ")));
      dlclose(handle);
      continue;
    }
    impl_->handle = handle;
    impl_->path = candidate;
    impl_->api = api;
    return;
  }
  impl_->reason =
      fmt::format("nvJitLink not found: {}", fmt::join(failures, "; "));
}

NvJitLink::~NvJitLink() {
  if (impl_->handle)
    dlclose(impl_->handle);
}

bool NvJitLink::available() const { return impl_->handle != nullptr; }

const std::string &NvJitLink::unavailableReason() const {
  return impl_->reason;
}

const std::string &NvJitLink::libraryPath() const { return impl_->path; }

const NvJitLink::Api &NvJitLink::api() const {
  if (!available())
    throw RuntimeError(ErrorCode::NvJitLinkError, impl_->reason);
  return impl_->api;
}

std::pair<unsigned, unsigned> NvJitLink::version() const {
  unsigned major = 0, minor = 0;
  nvJitLinkResult result = api().version(&major, &minor);
  if (result != NVJITLINK_SUCCESS)
    throw RuntimeError(
        ErrorCode::NvJitLinkError,
        fmt::format("nvJitLinkVersion failed: {}", resultName(result)), result);
  return {major, minor};
}

//===----------------------------------------------------------------------===//
// PTX -> cubin
//===----------------------------------------------------------------------===//

CubinResult
flashjit::rt::ptxToCubin(const std::string &ptx, const std::string &arch,
                         const std::vector<std::string> &extraOptions,
                         NvJitLink &nvJitLink) {
  if (ptx.empty())
    throw RuntimeError(ErrorCode::InvalidArgument, "ptxToCubin: empty PTX");
  if (arch.rfind("sm_", 0) != 0)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("ptxToCubin: arch must look like sm_90a, "
                                   "got '{}'",
                                   arch));
  const NvJitLink::Api &api = nvJitLink.api();

  // -no-cache: with a CUDA driver present, nvJitLink serves repeated
  // compiles from the driver's compute cache (~/.nv/ComputeCache) and then
  // skips ptxas, whose report (the only one with spill counts) goes missing
  // from the info log. flashjit caches cubins itself, keyed by config.
  std::vector<std::string> options = {"-arch=" + arch, "-O3", "-verbose",
                                      "-no-cache"};
  options.insert(options.end(), extraOptions.begin(), extraOptions.end());
  std::vector<const char *> optionPtrs;
  for (const std::string &option : options)
    optionPtrs.push_back(option.c_str());

  auto fail = [&](const char *call, nvJitLinkResult result,
                  const std::string &log) {
    std::string message =
        fmt::format("{} failed: {} (options: {})", call, resultName(result),
                    fmt::join(options, " "));
    if (!log.empty())
      message += "\n" + log;
    throw RuntimeError(ErrorCode::NvJitLinkError, message, result);
  };

  LinkHandle link(api);
  nvJitLinkResult result =
      api.create(link.address(), static_cast<uint32_t>(optionPtrs.size()),
                 optionPtrs.data());
  if (result != NVJITLINK_SUCCESS)
    fail("nvJitLinkCreate", result, link.get() ? link.errorLog() : "");

  // The size includes the terminating NUL, as nvrtcGetPTXSize's does.
  result = api.addData(link.get(), NVJITLINK_INPUT_PTX, ptx.c_str(),
                       ptx.size() + 1, "flashjit.ptx");
  if (result != NVJITLINK_SUCCESS)
    fail("nvJitLinkAddData", result, link.errorLog());

  result = api.complete(link.get());
  if (result != NVJITLINK_SUCCESS)
    fail("nvJitLinkComplete", result, link.errorLog());

  size_t size = 0;
  result = api.getLinkedCubinSize(link.get(), &size);
  if (result != NVJITLINK_SUCCESS)
    fail("nvJitLinkGetLinkedCubinSize", result, link.errorLog());
  CubinResult out;
  out.cubin.resize(size);
  result = api.getLinkedCubin(link.get(), out.cubin.data());
  if (result != NVJITLINK_SUCCESS)
    fail("nvJitLinkGetLinkedCubin", result, link.errorLog());
  out.infoLog = link.infoLog();
  return out;
}

std::string flashjit::rt::nvJitLinkVersionString(NvJitLink &nvJitLink) {
  auto [major, minor] = nvJitLink.version();
  return fmt::format("{}.{}", major, minor);
}

//===----------------------------------------------------------------------===//
// Resource usage
//===----------------------------------------------------------------------===//

std::map<std::string, ResourceUsage>
flashjit::rt::parseResourceUsagePerFunction(const std::string &infoLog) {
  // nvJitLink 13.0 with -verbose prints two reports. First ptxas's, per
  // kernel compiled from PTX:
  //   ptxas info    : Compiling entry function 'NAME' for 'sm_90a'
  //   ptxas info    : Function properties for NAME
  //   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes
  //                       spill loads
  //   ptxas info    : Used 168 registers, used 1 barriers, 16384 bytes smem,
  //                   372 bytes cmem[0]
  // then the linker's, per function of the final cubin:
  //   info    : Function properties for 'NAME':
  //   info    : used 168 registers, used 1 barriers, 8 stack, 16384 bytes
  //             smem, 556 bytes cmem[0], 0 bytes lmem
  // Spills are only in the first; the second describes the linked cubin (on
  // sm_90a it can add shared memory ptxas did not report), so its values
  // override the first's.
  static const std::regex compiling(R"(Compiling entry function '([^']+)')");
  static const std::regex properties(R"(Function properties for '?([^':\s]+))");
  static const std::regex frame(
      R"((\d+) bytes stack frame, (\d+) bytes spill stores, )"
      R"((\d+) bytes spill loads)");
  static const std::regex used(R"([Uu]sed (\d+) registers)");
  static const std::regex barriers(R"(used (\d+) barriers)");
  static const std::regex linkedStack(R"(barriers, (\d+) stack)");
  static const std::regex smem(R"((\d+) bytes smem)");

  std::map<std::string, ResourceUsage> usage;
  std::string current;
  std::istringstream lines(infoLog);
  std::string line;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (std::regex_search(line, m, compiling) ||
        std::regex_search(line, m, properties)) {
      current = m[1];
      usage[current];
      continue;
    }
    if (current.empty())
      continue;
    ResourceUsage &u = usage[current];
    if (std::regex_search(line, m, frame)) {
      u.stackBytes = std::stoi(m[1]);
      u.spillStoresBytes = std::stoi(m[2]);
      u.spillLoadsBytes = std::stoi(m[3]);
    }
    if (std::regex_search(line, m, used))
      u.registers = std::stoi(m[1]);
    if (std::regex_search(line, m, barriers))
      u.barriers = std::stoi(m[1]);
    if (std::regex_search(line, m, linkedStack))
      u.stackBytes = std::stoi(m[1]);
    if (std::regex_search(line, m, smem))
      u.sharedBytes = std::stoi(m[1]);
  }
  return usage;
}

ResourceUsage flashjit::rt::parseResourceUsage(const std::string &infoLog,
                                               const std::string &function) {
  std::map<std::string, ResourceUsage> usage =
      parseResourceUsagePerFunction(infoLog);
  auto it = usage.find(function);
  return it == usage.end() ? ResourceUsage() : it->second;
}

ResourceUsage flashjit::rt::parseResourceUsage(const std::string &infoLog) {
  ResourceUsage total;
  for (const auto &[name, u] : parseResourceUsagePerFunction(infoLog)) {
    total.registers = std::max(total.registers, u.registers);
    total.spillStoresBytes =
        std::max(total.spillStoresBytes, u.spillStoresBytes);
    total.spillLoadsBytes = std::max(total.spillLoadsBytes, u.spillLoadsBytes);
    total.sharedBytes = std::max(total.sharedBytes, u.sharedBytes);
    total.stackBytes = std::max(total.stackBytes, u.stackBytes);
    total.barriers = std::max(total.barriers, u.barriers);
  }
  return total;
}
