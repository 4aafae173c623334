//===- CudaApi.h - CUDA driver entry points, loaded at run time -*- C++ -*-===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The table of CUDA driver functions that CudaDriver resolves with dlsym.
/// This header includes <cuda.h> and is meant for the runtime's own .cpp files
/// only (the CUDA include directory is private to flashjit_runtime); code
/// outside the runtime uses the wrappers declared in CudaDriver.h.
///
/// Each member is declared with the name and type that <cuda.h> gives the
/// function, *after* cuda.h's versioning macros: `cuMemAlloc` is
/// `#define`d to `cuMemAlloc_v2`, so the member `api.cuMemAlloc` really is
/// `api.cuMemAlloc_v2`, its type is that of `::cuMemAlloc_v2`, and the symbol
/// looked up is the string "cuMemAlloc_v2". The header and the symbol can
/// therefore never disagree on the ABI of a call.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_RUNTIME_CUDAAPI_H
#define FLASHJIT_RUNTIME_CUDAAPI_H

#include <cuda.h>

/// X-macro over every driver function the runtime uses.
#define FLASHJIT_CUDA_DRIVER_FUNCTIONS(X)                                      \
  X(cuInit)                                                                    \
  X(cuDriverGetVersion)                                                        \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)                                                          \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGetName)                                                           \
  X(cuDeviceGetAttribute)                                                      \
  X(cuDeviceTotalMem)                                                          \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuDevicePrimaryCtxRelease)                                                 \
  X(cuCtxGetCurrent)                                                           \
  X(cuCtxSetCurrent)                                                           \
  X(cuCtxPushCurrent)                                                          \
  X(cuCtxPopCurrent)                                                           \
  X(cuCtxGetDevice)                                                            \
  X(cuCtxSynchronize)                                                          \
  X(cuModuleLoadData)                                                          \
  X(cuModuleLoadDataEx)                                                        \
  X(cuModuleUnload)                                                            \
  X(cuModuleGetFunction)                                                       \
  X(cuFuncGetAttribute)                                                        \
  X(cuFuncSetAttribute)                                                        \
  X(cuLaunchKernel)                                                            \
  X(cuMemAlloc)                                                                \
  X(cuMemFree)                                                                 \
  X(cuMemcpyHtoD)                                                              \
  X(cuMemcpyDtoH)                                                              \
  X(cuMemcpyHtoDAsync)                                                         \
  X(cuMemcpyDtoHAsync)                                                         \
  X(cuMemsetD8)                                                                \
  X(cuMemsetD32)                                                               \
  X(cuMemsetD32Async)                                                          \
  X(cuEventCreate)                                                             \
  X(cuEventRecord)                                                             \
  X(cuEventSynchronize)                                                        \
  X(cuEventElapsedTime)                                                        \
  X(cuEventDestroy)                                                            \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamWaitEvent)                                                         \
  X(cuStreamIsCapturing)                                                       \
  X(cuTensorMapEncodeTiled)

namespace flashjit::rt {

/// Pointers to the driver's functions; all non-null once CudaDriver reports
/// available().
struct DriverApi {
#define FLASHJIT_CUDA_DECLARE_MEMBER(name) decltype(&::name) name = nullptr;
  FLASHJIT_CUDA_DRIVER_FUNCTIONS(FLASHJIT_CUDA_DECLARE_MEMBER)
#undef FLASHJIT_CUDA_DECLARE_MEMBER
};

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_CUDAAPI_H
