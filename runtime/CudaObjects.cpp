//===- CudaObjects.cpp - RAII wrappers over CUDA driver objects -----------===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// DeviceBuffer, Module, launch(), the stream-ordered copies, Event and
/// EventTimer: the small RAII layer over the driver calls that CudaDriver
/// resolves. Destructors never throw: errors while freeing are ignored (the
/// context may already be gone at exit).
///
//===----------------------------------------------------------------------===//

#include "runtime/CudaApi.h"
#include "runtime/CudaDriver.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

using namespace flashjit::rt;

//===----------------------------------------------------------------------===//
// DeviceBuffer
//===----------------------------------------------------------------------===//

DeviceBuffer::DeviceBuffer(std::size_t bytes, CudaDriver &driver)
    : driver_(&driver), bytes_(bytes) {
  driver.ensureContext();
  if (bytes == 0)
    return;
  driver.check(driver.api().cuMemAlloc(&ptr_, bytes),
               fmt::format("cuMemAlloc({} bytes)", bytes).c_str());
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer &&other) noexcept
    : driver_(other.driver_), ptr_(std::exchange(other.ptr_, 0)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  if (this != &other) {
    reset();
    driver_ = other.driver_;
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_ && driver_ && driver_->available())
    driver_->api().cuMemFree(ptr_);
  ptr_ = 0;
  bytes_ = 0;
}

/// Throws InvalidArgument unless [offset, offset + bytes) lies in the buffer.
static void checkRange(const char *what, std::size_t offset, std::size_t bytes,
                       std::size_t size) {
  if (offset > size || bytes > size - offset)
    throw RuntimeError(
        ErrorCode::InvalidArgument,
        fmt::format("DeviceBuffer::{}: range [{}, {}) exceeds the {}-byte "
                    "buffer",
                    what, offset, offset + bytes, size));
}

void DeviceBuffer::upload(const void *host, std::size_t bytes,
                          std::size_t offset) {
  checkRange("upload", offset, bytes, bytes_);
  if (bytes == 0)
    return;
  driver_->ensureContext();
  driver_->check(driver_->api().cuMemcpyHtoD(ptr_ + offset, host, bytes),
                 "cuMemcpyHtoD");
}

void DeviceBuffer::download(void *host, std::size_t bytes,
                            std::size_t offset) const {
  checkRange("download", offset, bytes, bytes_);
  if (bytes == 0)
    return;
  driver_->ensureContext();
  driver_->check(driver_->api().cuMemcpyDtoH(host, ptr_ + offset, bytes),
                 "cuMemcpyDtoH");
}

std::vector<std::uint8_t> DeviceBuffer::download() const {
  std::vector<std::uint8_t> host(bytes_);
  download(host.data(), host.size());
  return host;
}

void DeviceBuffer::memset8(std::uint8_t value) {
  if (bytes_ == 0)
    return;
  driver_->ensureContext();
  driver_->check(driver_->api().cuMemsetD8(ptr_, value, bytes_), "cuMemsetD8");
}

void DeviceBuffer::memset32(std::uint32_t value) {
  if (bytes_ % 4 != 0)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       fmt::format("DeviceBuffer::memset32: size {} is not a "
                                   "multiple of 4",
                                   bytes_));
  if (bytes_ == 0)
    return;
  driver_->ensureContext();
  driver_->check(driver_->api().cuMemsetD32(ptr_, value, bytes_ / 4),
                 "cuMemsetD32");
}

//===----------------------------------------------------------------------===//
// Module
//===----------------------------------------------------------------------===//

/// True for an ELF (cubin) or fatbin image; anything else is taken as PTX.
static bool isBinaryImage(const void *image, std::size_t bytes) {
  static const unsigned char elfMagic[4] = {0x7f, 'E', 'L', 'F'};
  static const unsigned char fatbinMagic[4] = {0x50, 0xed, 0x55, 0xba};
  return bytes >= 4 && (std::memcmp(image, elfMagic, 4) == 0 ||
                        std::memcmp(image, fatbinMagic, 4) == 0);
}

Module::Module(const void *image, std::size_t bytes, CudaDriver &driver)
    : driver_(&driver) {
  if (!image || bytes == 0)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       "Module: empty module image");
  const DriverApi &cu = driver.api();
  driver.ensureContext();

  // PTX must be NUL-terminated for the driver; copy it so that it is.
  std::string ptx;
  const void *data = image;
  if (!isBinaryImage(image, bytes)) {
    ptx.assign(static_cast<const char *>(image), bytes);
    data = ptx.c_str();
  }

  // Ask for the JIT error log (for PTX it says which line is wrong) and
  // the verbose info log (ptxas's resource report).
  char errorLog[8192] = {};
  std::vector<char> infoLog(16384, '\0');
  CUjit_option options[] = {
      CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
      CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
      CU_JIT_LOG_VERBOSE};
  void *values[] = {errorLog, reinterpret_cast<void *>(sizeof(errorLog) - 1),
                    infoLog.data(),
                    reinterpret_cast<void *>(infoLog.size() - 1),
                    reinterpret_cast<void *>(std::size_t(1))};
  CUresult result = cu.cuModuleLoadDataEx(&module_, data, ptx.empty() ? 2 : 5,
                                          options, values);
  if (!ptx.empty())
    jitInfoLog_ = infoLog.data();
  if (result != CUDA_SUCCESS) {
    module_ = nullptr;
    std::string message =
        fmt::format("cuModuleLoadDataEx failed: {} ({})",
                    driver.errorName(result), driver.errorString(result));
    if (errorLog[0])
      message += fmt::format("\nJIT error log:\n{}", errorLog);
    throw RuntimeError(ErrorCode::DriverError, message, result);
  }
}

Module::~Module() { unload(); }

Module::Module(Module &&other) noexcept
    : driver_(other.driver_), module_(std::exchange(other.module_, nullptr)),
      jitInfoLog_(std::move(other.jitInfoLog_)) {}

Module &Module::operator=(Module &&other) noexcept {
  if (this != &other) {
    unload();
    driver_ = other.driver_;
    module_ = std::exchange(other.module_, nullptr);
    jitInfoLog_ = std::move(other.jitInfoLog_);
  }
  return *this;
}

void Module::unload() {
  if (module_ && driver_ && driver_->available())
    driver_->api().cuModuleUnload(module_);
  module_ = nullptr;
}

CUfunction Module::function(const std::string &name) const {
  if (!module_)
    throw RuntimeError(
        ErrorCode::InvalidArgument,
        fmt::format("Module::function({}): no module loaded", name));
  CUfunction function = nullptr;
  driver_->check(
      driver_->api().cuModuleGetFunction(&function, module_, name.c_str()),
      fmt::format("cuModuleGetFunction({})", name).c_str());
  return function;
}

std::pair<int, int> Module::resources(const std::string &name) const {
  CUfunction f = function(name);
  int regs = 0, local = 0;
  driver_->api().cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f);
  driver_->api().cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                    f);
  return {regs, local};
}

//===----------------------------------------------------------------------===//
// launch
//===----------------------------------------------------------------------===//

/// The shared memory every kernel may use without opting in.
static constexpr unsigned kDefaultSharedLimit = 48 * 1024;

void flashjit::rt::allowSharedBytes(CUfunction function, unsigned sharedBytes,
                                    CudaDriver &driver) {
  if (sharedBytes <= kDefaultSharedLimit)
    return;
  const DriverApi &cu = driver.api();
  CUresult result = cu.cuFuncSetAttribute(
      function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
      static_cast<int>(sharedBytes));
  if (result == CUDA_SUCCESS)
    return;
  // Say what the limits are: the usual cause is a tile config too big.
  int staticShared = 0, optin = 0;
  CUdevice device = 0;
  cu.cuFuncGetAttribute(&staticShared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                        function);
  if (cu.cuCtxGetDevice(&device) == CUDA_SUCCESS)
    cu.cuDeviceGetAttribute(
        &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
  throw RuntimeError(
      ErrorCode::DriverError,
      fmt::format("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={}) "
                  "failed: {} ({}); the kernel has {} bytes of static "
                  "shared memory and the device allows {} per block",
                  sharedBytes, driver.errorName(result),
                  driver.errorString(result), staticShared, optin),
      result);
}

void flashjit::rt::zeroAsync(CUdeviceptr ptr, std::size_t bytes,
                             CUstream stream, CudaDriver &driver) {
  if (bytes == 0)
    return;
  driver.check(driver.api().cuMemsetD32Async(ptr, 0, bytes / 4, stream),
               "cuMemsetD32Async");
}

void flashjit::rt::launchKernel(CUfunction function, Dim3 grid, Dim3 block,
                                unsigned sharedBytes, CUstream stream,
                                void **params, CudaDriver &driver,
                                void **extra) {
  CUresult result = driver.api().cuLaunchKernel(
      function, grid.x, grid.y, grid.z, block.x, block.y, block.z, sharedBytes,
      stream, params, extra);
  if (result != CUDA_SUCCESS)
    throw RuntimeError(
        ErrorCode::DriverError,
        fmt::format("cuLaunchKernel(grid=({},{},{}) block=({},{},{}) "
                    "sharedBytes={}) failed: {} ({})",
                    grid.x, grid.y, grid.z, block.x, block.y, block.z,
                    sharedBytes, driver.errorName(result),
                    driver.errorString(result)),
        result);
}

void flashjit::rt::launch(CUfunction function, Dim3 grid, Dim3 block,
                          unsigned sharedBytes, CUstream stream, void **params,
                          CudaDriver &driver) {
  if (!function)
    throw RuntimeError(ErrorCode::InvalidArgument, "launch: null CUfunction");
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
    throw RuntimeError(
        ErrorCode::InvalidArgument,
        fmt::format("launch: empty grid=({},{},{}) block=({},{},{}) "
                    "sharedBytes={}",
                    grid.x, grid.y, grid.z, block.x, block.y, block.z,
                    sharedBytes));
  driver.api(); // NoDriver before anything else
  driver.ensureContext();
  allowSharedBytes(function, sharedBytes, driver);
  launchKernel(function, grid, block, sharedBytes, stream, params, driver);
}

void flashjit::rt::encodeTensorMap(TensorMap &out, CUdeviceptr base, int rank,
                                   const uint64_t *dims,
                                   const uint64_t *strideBytes,
                                   const uint32_t *box, bool bf16,
                                   CudaDriver &driver) {
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) &&
                alignof(TensorMap) >= alignof(CUtensorMap));
  const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
  CUresult result = driver.api().cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap *>(&out),
      bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      cuuint32_t(rank), reinterpret_cast<void *>(base), dims, strideBytes, box,
      ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result == CUDA_SUCCESS)
    return;
  std::string shape, strides, boxes;
  for (int i = 0; i < rank; ++i) {
    shape += (i ? "," : "") + std::to_string(dims[i]);
    boxes += (i ? "," : "") + std::to_string(box[i]);
    if (i + 1 < rank)
      strides += (i ? "," : "") + std::to_string(strideBytes[i]);
  }
  throw RuntimeError(
      ErrorCode::DriverError,
      fmt::format("cuTensorMapEncodeTiled(dims=({}) strides=({}) bytes "
                  "box=({}) base={:#x}) failed: {} ({}); the kernel copies K "
                  "and V by tensor maps: set FLASHJIT_TMA=0 for cp.async",
                  shape, strides, boxes, base, driver.errorName(result),
                  driver.errorString(result)),
      result);
}

//===----------------------------------------------------------------------===//
// ScopedContext
//===----------------------------------------------------------------------===//

flashjit::rt::ScopedContext::ScopedContext(CUcontext context,
                                           CudaDriver &driver) {
  const DriverApi &cu = driver.api();
  CUcontext current = nullptr;
  driver.check(cu.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current == context)
    return;
  driver.check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent");
  driver_ = &driver;
}

flashjit::rt::ScopedContext::~ScopedContext() {
  if (!driver_)
    return;
  CUcontext popped = nullptr;
  driver_->api().cuCtxPopCurrent(&popped); // nothing to do if it fails
}

//===----------------------------------------------------------------------===//
// Stream-ordered copies
//===----------------------------------------------------------------------===//

void flashjit::rt::copyToHostAsync(void *host, CUdeviceptr src,
                                   std::size_t bytes, CUstream stream,
                                   CudaDriver &driver) {
  if (bytes == 0)
    return;
  if (!host || !src)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       "copyToHostAsync: null pointer");
  driver.ensureContext();
  driver.check(driver.api().cuMemcpyDtoHAsync(host, src, bytes, stream),
               fmt::format("cuMemcpyDtoHAsync({} bytes)", bytes).c_str());
}

void flashjit::rt::copyToDeviceAsync(CUdeviceptr dst, const void *host,
                                     std::size_t bytes, CUstream stream,
                                     CudaDriver &driver) {
  if (bytes == 0)
    return;
  if (!host || !dst)
    throw RuntimeError(ErrorCode::InvalidArgument,
                       "copyToDeviceAsync: null pointer");
  driver.ensureContext();
  driver.check(driver.api().cuMemcpyHtoDAsync(dst, host, bytes, stream),
               fmt::format("cuMemcpyHtoDAsync({} bytes)", bytes).c_str());
}

//===----------------------------------------------------------------------===//
// Event
//===----------------------------------------------------------------------===//

Event::Event(CudaDriver &driver) : driver_(&driver) {
  const DriverApi &cu = driver.api();
  driver.ensureContext();
  driver.check(cu.cuEventCreate(&event_, CU_EVENT_DISABLE_TIMING),
               "cuEventCreate");
}

Event::~Event() {
  if (event_ && driver_ && driver_->available())
    driver_->api().cuEventDestroy(event_);
}

Event::Event(Event &&other) noexcept
    : driver_(other.driver_), event_(std::exchange(other.event_, nullptr)) {}

Event &Event::operator=(Event &&other) noexcept {
  if (this != &other) {
    if (event_ && driver_ && driver_->available())
      driver_->api().cuEventDestroy(event_);
    driver_ = other.driver_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(CUstream stream) {
  driver_->check(driver_->api().cuEventRecord(event_, stream), "cuEventRecord");
}

void Event::waitOn(CUstream stream) const {
  driver_->check(driver_->api().cuStreamWaitEvent(stream, event_, 0),
                 "cuStreamWaitEvent");
}

void Event::synchronize() const {
  driver_->check(driver_->api().cuEventSynchronize(event_),
                 "cuEventSynchronize");
}

//===----------------------------------------------------------------------===//
// EventTimer
//===----------------------------------------------------------------------===//

EventTimer::EventTimer(CudaDriver &driver) : driver_(&driver) {
  const DriverApi &cu = driver.api();
  driver.ensureContext();
  driver.check(cu.cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
  CUresult result = cu.cuEventCreate(&stop_, CU_EVENT_DEFAULT);
  if (result != CUDA_SUCCESS) {
    cu.cuEventDestroy(start_);
    driver.check(result, "cuEventCreate");
  }
}

EventTimer::~EventTimer() {
  if (!driver_->available())
    return;
  if (start_)
    driver_->api().cuEventDestroy(start_);
  if (stop_)
    driver_->api().cuEventDestroy(stop_);
}

void EventTimer::start(CUstream stream) {
  driver_->check(driver_->api().cuEventRecord(start_, stream),
                 "cuEventRecord(start)");
}

void EventTimer::stop(CUstream stream) {
  driver_->check(driver_->api().cuEventRecord(stop_, stream),
                 "cuEventRecord(stop)");
}

float EventTimer::elapsedMs() const {
  const DriverApi &cu = driver_->api();
  driver_->check(cu.cuEventSynchronize(stop_), "cuEventSynchronize");
  float ms = 0.0f;
  driver_->check(cu.cuEventElapsedTime(&ms, start_, stop_),
                 "cuEventElapsedTime");
  return ms;
}
