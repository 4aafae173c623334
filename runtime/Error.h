//===- Error.h - flashjit runtime errors ------------------------*- C++ -*-===//
//
// Part of flashjit, a JIT compiler for FlashAttention-style kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The one error type of the runtime layer. Every failure of the CUDA driver,
/// of nvJitLink or of an argument check throws a RuntimeError whose message
/// names the failing call, e.g.
///
///   cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (device kernel image is
///   invalid)
///
/// and whose code() tells the caller what kind of failure it was: the CLI maps
/// ErrorCode::NoDriver to exit code 3 ("this machine has no GPU"), everything
/// else to a generic failure.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHJIT_RUNTIME_ERROR_H
#define FLASHJIT_RUNTIME_ERROR_H

#include <stdexcept>
#include <string>

namespace flashjit::rt {

/// What kind of failure a RuntimeError reports.
enum class ErrorCode {
  /// libcuda.so.1 could not be loaded or initialised (no GPU / no driver).
  NoDriver,
  /// A CUDA driver call returned an error.
  DriverError,
  /// libnvJitLink could not be loaded, or PTX -> cubin failed.
  NvJitLinkError,
  /// The caller passed something the runtime rejects before calling CUDA.
  InvalidArgument,
};

/// Returns "NoDriver", "DriverError", ... for \p code.
const char *errorCodeName(ErrorCode code);

/// The exception thrown by every function of the runtime layer.
class RuntimeError : public std::runtime_error {
public:
  RuntimeError(ErrorCode code, const std::string &message)
      : std::runtime_error(message), code_(code) {}
  /// \p driverResult is the raw CUresult (or nvJitLinkResult) of the failing
  /// call, kept as an int so that this header needs no CUDA header.
  RuntimeError(ErrorCode code, const std::string &message, int driverResult)
      : std::runtime_error(message), code_(code), driverResult_(driverResult) {}

  ErrorCode code() const { return code_; }
  /// The CUresult / nvJitLinkResult of the failing call, 0 if there was none.
  int driverResult() const { return driverResult_; }

private:
  ErrorCode code_;
  int driverResult_ = 0;
};

inline const char *errorCodeName(ErrorCode code) {
  switch (code) {
  case ErrorCode::NoDriver:
    return "NoDriver";
  case ErrorCode::DriverError:
    return "DriverError";
  case ErrorCode::NvJitLinkError:
    return "NvJitLinkError";
  case ErrorCode::InvalidArgument:
    return "InvalidArgument";
  }
  return "Unknown";
}

} // namespace flashjit::rt

#endif // FLASHJIT_RUNTIME_ERROR_H
