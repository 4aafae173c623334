//===- CudaDriver.h - The CUDA driver, loaded with dlopen -------*- C++ -*-===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashjit never links libcuda: CudaDriver dlopens "libcuda.so.1" at run
/// time, so one binary runs on a machine without a GPU (where it reports
/// "no CUDA driver found") and on a GPU machine.
///
/// Every driver call goes through CudaDriver::check(), which throws a
/// RuntimeError naming the call, the error name and the error string:
///
///   cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (device kernel image is
///   invalid)
///
/// Context policy: if the calling thread has a current context (e.g. one that
/// torch made current), it is used; otherwise the device's primary context is
/// retained and made current. flashjit never creates a context of its own.
///
/// Small RAII helpers sit on top: DeviceBuffer, Module, Event, EventTimer,
/// launch(), stream-ordered copies.
/// This header needs no CUDA header: the handle types are declared below
/// exactly as <cuda.h> declares them.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_RUNTIME_CUDADRIVER_H
#define FLASHJIT_RUNTIME_CUDADRIVER_H

#include "runtime/Error.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

// The opaque CUDA handle types, spelled as in <cuda.h> (repeating an
// identical typedef is legal C++, so this header and <cuda.h> can meet in one
// translation unit).
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
static_assert(sizeof(void *) == 8, "flashjit's runtime supports 64-bit only");
typedef unsigned long long CUdeviceptr_v2;
typedef CUdeviceptr_v2 CUdeviceptr;

namespace flashjit::rt {

struct DriverApi; // runtime/CudaApi.h

/// The CUDA driver library, loaded with dlopen. Use the process-wide
/// CudaDriver::get(); tests may construct their own from a chosen path.
class CudaDriver {
public:
  /// The process-wide driver, loaded on first use from defaultLibraryPath().
  /// Never fails: check available() (or let the first call throw NoDriver).
  static CudaDriver &get();

  /// $FLASHJIT_LIBCUDA if set and non-empty, else "libcuda.so.1".
  static std::string defaultLibraryPath();

  /// Loads the driver from \p libraryPath and calls cuInit(0). Failures are
  /// recorded (available() == false), not thrown.
  explicit CudaDriver(const std::string &libraryPath);
  /// Releases the primary contexts this object retained and dlcloses.
  ~CudaDriver();
  CudaDriver(const CudaDriver &) = delete;
  CudaDriver &operator=(const CudaDriver &) = delete;

  /// True if the library loaded, every entry point resolved and cuInit
  /// succeeded.
  bool available() const;
  /// Why available() is false, e.g. "no CUDA driver found:
  /// dlopen(libcuda.so.1) failed: libcuda.so.1: cannot open shared object
  /// file: No such file or directory". Empty when available.
  const std::string &unavailableReason() const;
  /// The path given to dlopen.
  const std::string &libraryPath() const;
  /// Throws RuntimeError(NoDriver, unavailableReason()) unless available().
  void requireAvailable() const;

  /// The raw entry points (runtime/CudaApi.h); throws NoDriver if the driver
  /// is unavailable.
  const DriverApi &api() const;

  /// Throws RuntimeError(DriverError) if \p result (a CUresult) is not
  /// CUDA_SUCCESS: "<call> failed: <error name> (<error string>)".
  void check(int result, const char *call) const;
  /// CUDA_ERROR_... for \p result; works even if cuGetErrorName is missing.
  std::string errorName(int result) const;
  /// The driver's description of \p result.
  std::string errorString(int result) const;

  /// The driver's CUDA version, e.g. 13000 for 13.0.
  int driverVersion() const;
  /// Number of CUDA devices.
  int deviceCount() const;

  /// Returns the calling thread's current context; if there is none, retains
  /// the primary context of device \p ordinal and makes it current. The
  /// primary context is retained once per device and per CudaDriver.
  CUcontext ensureContext(int ordinal = 0);
  /// The device of the current context (after ensureContext()).
  int currentDevice();
  /// cuCtxSynchronize on the current context.
  void synchronize();
  /// cuStreamSynchronize.
  void synchronize(CUstream stream);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What the runtime needs to know about a GPU.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int ccMajor = 0;
  int ccMinor = 0;
  int smCount = 0;
  /// Default limit of shared memory per block (48 KiB).
  int maxSharedPerBlock = 0;
  /// Opt-in limit (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES), e.g.
  /// 232448 on H100/H200.
  int maxSharedPerBlockOptin = 0;
  int maxSharedPerSm = 0;
  int regsPerBlock = 0;
  int maxThreadsPerBlock = 0;
  int warpSize = 0;
  int l2CacheBytes = 0;
  std::size_t totalMemBytes = 0;
  /// cuDriverGetVersion, e.g. 13000.
  int driverVersion = 0;

  /// 90 for compute capability 9.0.
  int computeCapability() const { return ccMajor * 10 + ccMinor; }
  /// The -arch to compile for: "sm_80", "sm_86", "sm_90a", ...
  std::string targetArch() const;
};

/// The -arch for compute capability \p major.\p minor. Architectures with
/// arch-specific features (wgmma/setmaxnreg on 9.0, tcgen05 on 10.x, ...) get
/// the "a" suffix: 9.0 -> "sm_90a", 10.0 -> "sm_100a", 8.0 -> "sm_80",
/// 8.6 -> "sm_86", 8.9 -> "sm_89".
std::string targetArchFor(int ccMajor, int ccMinor);

/// Queries device \p ordinal (no context needed).
DeviceInfo queryDevice(int ordinal = 0, CudaDriver &driver = CudaDriver::get());

/// True if \p stream is being captured into a CUDA graph (then the runtime
/// must not synchronize it or time it with events).
bool isStreamCapturing(CUstream stream, CudaDriver &driver = CudaDriver::get());

/// Device memory owned by this object (cuMemAlloc / cuMemFree). Move-only.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  /// Allocates \p bytes on the current (or primary) context. 0 bytes gives an
  /// empty buffer with ptr() == 0.
  explicit DeviceBuffer(std::size_t bytes,
                        CudaDriver &driver = CudaDriver::get());
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer &&other) noexcept;
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  /// Address of the device pointer, for a kernel's parameter array.
  CUdeviceptr *ptrAddress() { return &ptr_; }

  /// Copies \p bytes from \p host to offset \p offset (synchronous).
  void upload(const void *host, std::size_t bytes, std::size_t offset = 0);
  void upload(const std::vector<std::uint8_t> &host) {
    upload(host.data(), host.size());
  }
  /// Uploads a vector of any trivially copyable element type.
  template <typename T> void uploadVector(const std::vector<T> &host) {
    static_assert(std::is_trivially_copyable_v<T>);
    upload(host.data(), host.size() * sizeof(T));
  }

  /// Copies \p bytes from offset \p offset to \p host (synchronous).
  void download(void *host, std::size_t bytes, std::size_t offset = 0) const;
  /// The whole buffer.
  std::vector<std::uint8_t> download() const;
  /// Downloads size() / sizeof(T) elements.
  template <typename T> std::vector<T> downloadVector() const {
    static_assert(std::is_trivially_copyable_v<T>);
    std::vector<T> out(bytes_ / sizeof(T));
    download(out.data(), out.size() * sizeof(T));
    return out;
  }

  /// Sets every byte to \p value.
  void memset8(std::uint8_t value);
  /// Sets every 32-bit word to \p value (size() must be a multiple of 4).
  void memset32(std::uint32_t value);

  /// Frees the memory now.
  void reset();

private:
  CudaDriver *driver_ = nullptr;
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

/// A loaded CUDA module (cubin, fatbin or PTX). Move-only.
class Module {
public:
  Module() = default;
  /// Loads \p image: a cubin (ELF), a fatbin or PTX text (which need not be
  /// NUL-terminated: \p bytes bounds it). A PTX image is JIT-compiled by the
  /// driver; its JIT error log is part of the exception message.
  Module(const void *image, std::size_t bytes,
         CudaDriver &driver = CudaDriver::get());
  explicit Module(const std::vector<char> &image,
                  CudaDriver &driver = CudaDriver::get())
      : Module(image.data(), image.size(), driver) {}
  explicit Module(const std::string &image,
                  CudaDriver &driver = CudaDriver::get())
      : Module(image.data(), image.size(), driver) {}
  ~Module();
  Module(Module &&other) noexcept;
  Module &operator=(Module &&other) noexcept;
  Module(const Module &) = delete;
  Module &operator=(const Module &) = delete;

  /// The kernel \p name; throws "cuModuleGetFunction(<name>) failed: ...".
  CUfunction function(const std::string &name) const;
  CUmodule handle() const { return module_; }
  bool loaded() const { return module_ != nullptr; }
  /// Unloads now (errors during unload are ignored).
  void unload();
  /// Kernel \p name's registers per thread and local memory per thread
  /// (spills and stack), as the loaded function reports them.
  std::pair<int, int> resources(const std::string &name) const;
  /// A PTX image's JIT info log (verbose: ptxas's resource report); empty
  /// for a binary image.
  const std::string &jitInfoLog() const { return jitInfoLog_; }

private:
  CudaDriver *driver_ = nullptr;
  CUmodule module_ = nullptr;
  std::string jitInfoLog_;
};

/// Grid or block dimensions.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

/// Launches \p function with cuLaunchKernel and checks the result. When
/// \p sharedBytes exceeds the 48 KiB default it first raises the function's
/// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES. \p params is the usual
/// array of pointers to each argument. Errors name the launch configuration.
void launch(CUfunction function, Dim3 grid, Dim3 block, unsigned sharedBytes,
            CUstream stream, void **params,
            CudaDriver &driver = CudaDriver::get());

/// Raises \p function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to
/// \p sharedBytes when that exceeds the 48 KiB default (nothing otherwise);
/// errors name the limits. The attribute stays set on the function, so a
/// launch prepared once may then use launchKernel() alone.
void allowSharedBytes(CUfunction function, unsigned sharedBytes,
                      CudaDriver &driver = CudaDriver::get());

/// cuLaunchKernel and nothing else (the per-call path of a prepared
/// launch): no argument checks, no context, no attribute. The caller has
/// checked the dimensions, made the function's context current and called
/// allowSharedBytes(). Errors name the launch configuration.
/// \p extra (with null \p params): the arguments packed in one buffer
/// (CU_LAUNCH_PARAM_BUFFER_POINTER, PackedParams).
void launchKernel(CUfunction function, Dim3 grid, Dim3 block,
                  unsigned sharedBytes, CUstream stream, void **params,
                  CudaDriver &driver = CudaDriver::get(),
                  void **extra = nullptr);

/// Zeroes \p bytes (a multiple of 4) at \p ptr in stream order on
/// \p stream (cuMemsetD32Async: capturable into a CUDA graph).
void zeroAsync(CUdeviceptr ptr, std::size_t bytes, CUstream stream,
               CudaDriver &driver = CudaDriver::get());

/// A tensor map (the driver's CUtensorMap: 128 opaque bytes, 128-byte
/// aligned), passed to a kernel by value.
struct alignas(128) TensorMap {
  unsigned char bytes[128] = {};
};

/// Encodes a tiled tensor map of 16-bit elements (bf16 where \p bf16, else
/// f16) over \p base (cuTensorMapEncodeTiled): \p rank dimensions of
/// \p dims elements, innermost first, \p strideBytes between the elements
/// of each outer one (rank - 1 of them), boxes of \p box elements, the
/// 128-byte swizzle, zeros past the bounds. Throws RuntimeError naming the
/// map when the driver refuses it.
void encodeTensorMap(TensorMap &out, CUdeviceptr base, int rank,
                     const uint64_t *dims, const uint64_t *strideBytes,
                     const uint32_t *box, bool bf16,
                     CudaDriver &driver = CudaDriver::get());

/// Makes \p context the calling thread's current context for the object's
/// lifetime: nothing if it already is (one cuCtxGetCurrent), else
/// cuCtxPushCurrent now and cuCtxPopCurrent in the destructor, so the
/// caller's current context is left as it was.
class ScopedContext {
public:
  explicit ScopedContext(CUcontext context,
                         CudaDriver &driver = CudaDriver::get());
  ~ScopedContext();
  ScopedContext(const ScopedContext &) = delete;
  ScopedContext &operator=(const ScopedContext &) = delete;

private:
  CudaDriver *driver_ = nullptr; ///< set when the constructor pushed
};

/// Copies \p bytes from device memory \p src to \p host in stream order
/// (cuMemcpyDtoHAsync on \p stream): the copy starts after the work queued
/// on \p stream before it. To pageable host memory it returns when the copy
/// is done; synchronize \p stream before reading pinned memory.
void copyToHostAsync(void *host, CUdeviceptr src, std::size_t bytes,
                     CUstream stream, CudaDriver &driver = CudaDriver::get());

/// Copies \p bytes from \p host to device memory \p dst in stream order
/// (cuMemcpyHtoDAsync on \p stream). \p host must stay valid until the copy
/// has run (synchronize \p stream before freeing it).
void copyToDeviceAsync(CUdeviceptr dst, const void *host, std::size_t bytes,
                       CUstream stream, CudaDriver &driver = CudaDriver::get());

/// A CUDA event without timing (CU_EVENT_DISABLE_TIMING) that orders work
/// across streams: record() after some work on one stream, waitOn() to make
/// another stream wait for it on the device. Move-only.
class Event {
public:
  /// Creates the event in the current (or primary) context.
  explicit Event(CudaDriver &driver = CudaDriver::get());
  ~Event();
  Event(Event &&other) noexcept;
  Event &operator=(Event &&other) noexcept;
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;

  /// Captures the work queued on \p stream so far (cuEventRecord).
  void record(CUstream stream);
  /// Makes \p stream's later work wait, on the device, for the work the last
  /// record() captured (cuStreamWaitEvent); nothing if never recorded.
  void waitOn(CUstream stream) const;
  /// Waits on the host for that work (cuEventSynchronize).
  void synchronize() const;

  CUevent handle() const { return event_; }

private:
  CudaDriver *driver_ = nullptr;
  CUevent event_ = nullptr;
};

/// Two CUDA events timing work on a stream. Move-only.
class EventTimer {
public:
  explicit EventTimer(CudaDriver &driver = CudaDriver::get());
  ~EventTimer();
  EventTimer(const EventTimer &) = delete;
  EventTimer &operator=(const EventTimer &) = delete;

  /// Records the start event on \p stream.
  void start(CUstream stream = nullptr);
  /// Records the stop event on \p stream.
  void stop(CUstream stream = nullptr);
  /// Waits for the stop event; milliseconds between start and stop.
  float elapsedMs() const;

private:
  CudaDriver *driver_;
  CUevent start_ = nullptr;
  CUevent stop_ = nullptr;
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_CUDADRIVER_H
