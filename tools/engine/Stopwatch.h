//===- Stopwatch.h - Milliseconds since a point in time ---------*- C++ -*-===//
#ifndef FLASHJIT_TOOLS_ENGINE_STOPWATCH_H
#define FLASHJIT_TOOLS_ENGINE_STOPWATCH_H

#include <chrono>

namespace flashjit::engine {

/// Wall-clock milliseconds since \p start (host-side timings: compiles,
/// cache lookups, CPU runs; GPU kernels are timed with CUDA events).
inline double msSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
}

} // namespace flashjit::engine

#endif // FLASHJIT_TOOLS_ENGINE_STOPWATCH_H
