//===- CudaDriver.cpp - The CUDA driver, loaded with dlopen ---------------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "runtime/CudaApi.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <mutex>
#include <utility>

using namespace flashjit::rt;

#define FLASHJIT_STRINGIFY_IMPL(x) #x
/// Stringifies \p x after macro expansion: FLASHJIT_STRINGIFY(cuMemAlloc) is
/// "cuMemAlloc_v2" because <cuda.h> #defines cuMemAlloc to cuMemAlloc_v2.
#define FLASHJIT_STRINGIFY(x) FLASHJIT_STRINGIFY_IMPL(x)

namespace {

/// The name of \p result without asking the driver: cuGetErrorName itself
/// fails in the toolkit's stub library and in drivers that do not know a code.
const char *fallbackErrorName(int result) {
  switch (result) {
#define FLASHJIT_CASE(code)                                                    \
  case code:                                                                   \
    return #code;
    FLASHJIT_CASE(CUDA_SUCCESS)
    FLASHJIT_CASE(CUDA_ERROR_INVALID_VALUE)
    FLASHJIT_CASE(CUDA_ERROR_OUT_OF_MEMORY)
    FLASHJIT_CASE(CUDA_ERROR_NOT_INITIALIZED)
    FLASHJIT_CASE(CUDA_ERROR_DEINITIALIZED)
    FLASHJIT_CASE(CUDA_ERROR_STUB_LIBRARY)
    FLASHJIT_CASE(CUDA_ERROR_NO_DEVICE)
    FLASHJIT_CASE(CUDA_ERROR_INVALID_DEVICE)
    FLASHJIT_CASE(CUDA_ERROR_INVALID_IMAGE)
    FLASHJIT_CASE(CUDA_ERROR_INVALID_CONTEXT)
    FLASHJIT_CASE(CUDA_ERROR_NO_BINARY_FOR_GPU)
    FLASHJIT_CASE(CUDA_ERROR_INVALID_PTX)
    FLASHJIT_CASE(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    FLASHJIT_CASE(CUDA_ERROR_INVALID_HANDLE)
    FLASHJIT_CASE(CUDA_ERROR_NOT_FOUND)
    FLASHJIT_CASE(CUDA_ERROR_ILLEGAL_ADDRESS)
    FLASHJIT_CASE(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
    FLASHJIT_CASE(CUDA_ERROR_LAUNCH_TIMEOUT)
    FLASHJIT_CASE(CUDA_ERROR_LAUNCH_FAILED)
    FLASHJIT_CASE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    FLASHJIT_CASE(CUDA_ERROR_UNKNOWN)
#undef FLASHJIT_CASE
  default:
    return nullptr;
  }
}

/// Looks \p symbol up in \p handle and stores it, typed, into \p slot.
template <typename Fn>
bool resolveSymbol(void *handle, const char *symbol, Fn &slot) {
  slot = reinterpret_cast<Fn>(dlsym(handle, symbol));
  return slot != nullptr;
}

} // namespace

//===----------------------------------------------------------------------===//
// CudaDriver
//===----------------------------------------------------------------------===//

struct CudaDriver::Impl {
  std::string path;
  void *handle = nullptr;
  DriverApi api;
  bool available = false;
  std::string reason;
  int driverVersion = 0;

  /// Primary contexts retained by this object, per device ordinal.
  struct Retained {
    int ordinal;
    CUdevice device;
    CUcontext context;
  };
  std::mutex mutex;
  std::vector<Retained> retained;

  void load();
};

void CudaDriver::Impl::load() {
  // RTLD_LOCAL: the driver's symbols must not satisfy anything else.
  handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *err = dlerror();
    reason = fmt::format("no CUDA driver found: dlopen({}) failed: {}", path,
                         err ? err : "unknown error");
    return;
  }

  std::vector<std::string> missing;
#define FLASHJIT_RESOLVE(name)                                                 \
  if (!resolveSymbol(handle, FLASHJIT_STRINGIFY(name), api.name))              \
    missing.push_back(FLASHJIT_STRINGIFY(name));
  FLASHJIT_CUDA_DRIVER_FUNCTIONS(FLASHJIT_RESOLVE)
#undef FLASHJIT_RESOLVE
  // cuEventElapsedTime_v2 (CUDA 12.8+) has the signature of the original.
  if (!api.cuEventElapsedTime &&
      resolveSymbol(handle, "cuEventElapsedTime", api.cuEventElapsedTime))
    missing.erase(std::remove(missing.begin(), missing.end(),
                              FLASHJIT_STRINGIFY(cuEventElapsedTime)),
                  missing.end());
  if (!missing.empty()) {
    reason = fmt::format("no usable CUDA driver: {} lacks the entry points {} "
                         "(driver too old?)",
                         path, fmt::join(missing, ", "));
    return;
  }

  CUresult result = api.cuInit(0);
  if (result != CUDA_SUCCESS) {
    const char *name = nullptr;
    const char *text = nullptr;
    if (api.cuGetErrorName(result, &name) != CUDA_SUCCESS || !name)
      name = fallbackErrorName(result);
    if (api.cuGetErrorString(result, &text) != CUDA_SUCCESS || !text)
      text = "no description";
    reason =
        fmt::format("no usable CUDA device: cuInit failed: {} ({})",
                    name ? name : fmt::format("CUresult {}", result), text);
    return;
  }
  if (api.cuDriverGetVersion(&driverVersion) != CUDA_SUCCESS)
    driverVersion = 0;
  available = true;
}

CudaDriver &CudaDriver::get() {
  // Intentionally leaked: DeviceBuffers and Modules in static storage may
  // still need the driver while the process exits.
  static CudaDriver *instance = new CudaDriver(defaultLibraryPath());
  return *instance;
}

std::string CudaDriver::defaultLibraryPath() {
  const char *env = std::getenv("FLASHJIT_LIBCUDA");
  if (env && *env)
    return env;
  return "libcuda.so.1";
}

CudaDriver::CudaDriver(const std::string &libraryPath)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = libraryPath;
  impl_->load();
}

CudaDriver::~CudaDriver() {
  if (impl_->available) {
    CUcontext current = nullptr;
    impl_->api.cuCtxGetCurrent(&current);
    for (const Impl::Retained &r : impl_->retained) {
      if (current == r.context)
        impl_->api.cuCtxSetCurrent(nullptr);
      impl_->api.cuDevicePrimaryCtxRelease(r.device);
    }
  }
  if (impl_->handle)
    dlclose(impl_->handle);
}

bool CudaDriver::available() const { return impl_->available; }

const std::string &CudaDriver::unavailableReason() const {
  return impl_->reason;
}

const std::string &CudaDriver::libraryPath() const { return impl_->path; }

void CudaDriver::requireAvailable() const {
  if (!impl_->available)
    throw RuntimeError(ErrorCode::NoDriver, impl_->reason);
}

const DriverApi &CudaDriver::api() const {
  requireAvailable();
  return impl_->api;
}

std::string CudaDriver::errorName(int result) const {
  const char *name = nullptr;
  if (impl_->api.cuGetErrorName &&
      impl_->api.cuGetErrorName(static_cast<CUresult>(result), &name) ==
          CUDA_SUCCESS &&
      name)
    return name;
  if (const char *fallback = fallbackErrorName(result))
    return fallback;
  return fmt::format("CUresult {}", result);
}

std::string CudaDriver::errorString(int result) const {
  const char *text = nullptr;
  if (impl_->api.cuGetErrorString &&
      impl_->api.cuGetErrorString(static_cast<CUresult>(result), &text) ==
          CUDA_SUCCESS &&
      text)
    return text;
  return "no description";
}

void CudaDriver::check(int result, const char *call) const {
  if (result == CUDA_SUCCESS)
    return;
  throw RuntimeError(ErrorCode::DriverError,
                     fmt::format("{} failed: {} ({})", call, errorName(result),
                                 errorString(result)),
                     result);
}

int CudaDriver::driverVersion() const {
  requireAvailable();
  return impl_->driverVersion;
}

int CudaDriver::deviceCount() const {
  int count = 0;
  check(api().cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

CUcontext CudaDriver::ensureContext(int ordinal) {
  const DriverApi &cu = api();
  CUcontext context = nullptr;
  check(cu.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  if (context)
    return context;

  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const Impl::Retained &r : impl_->retained) {
    if (r.ordinal == ordinal) {
      check(cu.cuCtxSetCurrent(r.context), "cuCtxSetCurrent");
      return r.context;
    }
  }
  int count = deviceCount();
  if (ordinal < 0 || ordinal >= count)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("CUDA device ordinal {} out of range: "
                                   "this machine has {} device(s)",
                                   ordinal, count));
  CUdevice device = 0;
  check(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet");
  check(cu.cuDevicePrimaryCtxRetain(&context, device),
        "cuDevicePrimaryCtxRetain");
  impl_->retained.push_back({ordinal, device, context});
  check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent");
  return context;
}

int CudaDriver::currentDevice() {
  ensureContext();
  CUdevice device = 0;
  check(api().cuCtxGetDevice(&device), "cuCtxGetDevice");
  return device;
}

void CudaDriver::synchronize() {
  ensureContext();
  check(api().cuCtxSynchronize(), "cuCtxSynchronize");
}

void CudaDriver::synchronize(CUstream stream) {
  ensureContext();
  check(api().cuStreamSynchronize(stream), "cuStreamSynchronize");
}

//===----------------------------------------------------------------------===//
// Devices and streams
//===----------------------------------------------------------------------===//

std::string flashjit::rt::targetArchFor(int ccMajor, int ccMinor) {
  // Hopper and later have arch-specific ("a") feature sets that kernels use
  // (wgmma, setmaxnreg, tcgen05); a cubin for sm_90a runs on 9.0 only, which
  // is what a JIT compiling for the GPU it runs on wants.
  bool archSpecific = ccMajor >= 9;
  return fmt::format("sm_{}{}{}", ccMajor, ccMinor, archSpecific ? "a" : "");
}

std::string DeviceInfo::targetArch() const {
  return targetArchFor(ccMajor, ccMinor);
}

DeviceInfo flashjit::rt::queryDevice(int ordinal, CudaDriver &driver) {
  const DriverApi &cu = driver.api();
  int count = driver.deviceCount();
  if (ordinal < 0 || ordinal >= count)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("CUDA device ordinal {} out of range: "
                                   "this machine has {} device(s)",
                                   ordinal, count));
  CUdevice device = 0;
  driver.check(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet");

  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  driver.check(cu.cuDeviceGetName(name, sizeof(name) - 1, device),
               "cuDeviceGetName");
  info.name = name;
  auto attribute = [&](CUdevice_attribute attr, const char *what) {
    int value = 0;
    driver.check(cu.cuDeviceGetAttribute(&value, attr, device),
                 fmt::format("cuDeviceGetAttribute({})", what).c_str());
    return value;
  };
  info.ccMajor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                           "COMPUTE_CAPABILITY_MAJOR");
  info.ccMinor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                           "COMPUTE_CAPABILITY_MINOR");
  info.smCount = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                           "MULTIPROCESSOR_COUNT");
  info.maxSharedPerBlock =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
                "MAX_SHARED_MEMORY_PER_BLOCK");
  info.maxSharedPerBlockOptin =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN");
  info.maxSharedPerSm =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR");
  info.regsPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
                                "MAX_REGISTERS_PER_BLOCK");
  info.maxThreadsPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                      "MAX_THREADS_PER_BLOCK");
  info.warpSize = attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE, "WARP_SIZE");
  info.l2CacheBytes =
      attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2_CACHE_SIZE");
  size_t totalMem = 0;
  driver.check(cu.cuDeviceTotalMem(&totalMem, device), "cuDeviceTotalMem");
  info.totalMemBytes = totalMem;
  info.driverVersion = driver.driverVersion();
  return info;
}

bool flashjit::rt::isStreamCapturing(CUstream stream, CudaDriver &driver) {
  driver.ensureContext();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  driver.check(driver.api().cuStreamIsCapturing(stream, &status),
               "cuStreamIsCapturing");
  // An invalidated capture is still a capture: syncing would break it too.
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}
