//===- TileJit.h - JIT-run tile IR for the unit tests -----------*- C++ -*-===//
//
/// \file
/// Shared by the tile-IR unit tests: parses a tile-IR module, lowers it with
/// buildCpuLoweringPipeline, JIT-compiles it with MLIR's ExecutionEngine
/// (through the CPU mode's own jitLoweredModule, half-float builtins and
/// all) and calls its packed entry points;
/// random inputs, NaN poison and the exact / relative comparisons.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TESTS_UNIT_TILEJIT_H
#define FLASHJIT_TESTS_UNIT_TILEJIT_H

#include "compiler/CompilerInternal.h"
#include "compiler/Pipelines/Pipelines.h"
#include "kernels/HalfFloat.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace flashjit::test {

using namespace mlir;

//===----------------------------------------------------------------------===//
// JIT plumbing (as compiler/Target/CpuEngine.cpp does it)
//===----------------------------------------------------------------------===//

/// A (allocated, aligned, offset, size, stride) memref<?xT> descriptor.
struct MemRef1D {
  void *allocated;
  void *aligned;
  int64_t offset, size, stride;
};

/// The packed arguments of one call: a pointer per expanded argument.
class Args {
public:
  template <typename T> Args &buf(std::vector<T> &v) {
    mems.push_back({v.data(), v.data(), 0, int64_t(v.size()), 1});
    MemRef1D &m = mems.back();
    ptrs.insert(ptrs.end(),
                {&m.allocated, &m.aligned, &m.offset, &m.size, &m.stride});
    return *this;
  }
  Args &index(int64_t v) {
    ptrs.push_back(&indices.emplace_back(v));
    return *this;
  }
  Args &i32(int32_t v) {
    ptrs.push_back(&ints.emplace_back(v));
    return *this;
  }
  Args &f32(float v) {
    ptrs.push_back(&floats.emplace_back(v));
    return *this;
  }
  void **data() { return ptrs.data(); }

private:
  std::deque<MemRef1D> mems;
  std::deque<int64_t> indices;
  std::deque<int32_t> ints;
  std::deque<float> floats;
  std::vector<void *> ptrs;
};

/// Parses \p source, lowers it with buildCpuLoweringPipeline and JITs it.
class TileJit {
public:
  explicit TileJit(const std::string &source) {
    DialectRegistry registry;
    flashjit::registerFlashjitDialects(registry);
    ctx.appendDialectRegistry(registry);
    ctx.loadAllAvailableDialects();
    llvm::raw_string_ostream os(errors);
    ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
      os << d << "\n";
      return success();
    });
    module = parseSourceString<ModuleOp>(source, &ctx);
    if (!module)
      return;
    PassManager pm(&ctx);
    flashjit::buildCpuLoweringPipeline(pm);
    if (failed(pm.run(*module))) {
      os << "the lowering failed\n";
      return;
    }
    try {
      engine = flashjit::jitLoweredModule(*module);
    } catch (const flashjit::CompileError &e) {
      os << e.what();
    }
  }

  bool ok() const { return engine != nullptr; }
  const std::string &diagnostics() const { return errors; }

  /// The packed entry point of @\p name (null with a diagnostic if absent).
  void (*entry(const std::string &name))(void **) {
    auto fn = engine->lookupPacked(name);
    if (!fn) {
      errors += llvm::toString(fn.takeError());
      return nullptr;
    }
    return *fn;
  }

  void call(const std::string &name, Args &args) {
    auto fn = entry(name);
    ASSERT_NE(fn, nullptr) << errors;
    fn(args.data());
  }

private:
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module;
  std::unique_ptr<ExecutionEngine> engine;
  std::string errors;
};

#define JIT_OR_FAIL(jit, source)                                               \
  TileJit jit(source);                                                         \
  ASSERT_TRUE(jit.ok()) << jit.diagnostics()

//===----------------------------------------------------------------------===//
// Inputs and comparisons
//===----------------------------------------------------------------------===//

inline std::mt19937 &rng() {
  static std::mt19937 gen{std::random_device{}()};
  return gen;
}
inline int randInt(int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}
inline std::vector<float> randFloats(size_t n, float lo = -2, float hi = 2) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng());
  return v;
}
/// Small integers: sums and products of them are exact in f32.
inline std::vector<float> randInts(size_t n, int lo = -8, int hi = 8) {
  std::vector<float> v(n);
  for (float &x : v)
    x = float(randInt(lo, hi));
  return v;
}
inline std::vector<uint16_t> randBf16(size_t n) {
  std::vector<uint16_t> v(n);
  for (uint16_t &x : v)
    x = flashjit::floatToBf16(randFloats(1)[0]);
  return v;
}
inline const float kNaN = std::numeric_limits<float>::quiet_NaN();
inline const float kInf = std::numeric_limits<float>::infinity();
inline std::vector<float> poisoned(size_t n) {
  return std::vector<float>(n, kNaN);
}

inline bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::memcmp(&a, &b, sizeof(float)) == 0;
}

inline void expectExact(const std::vector<float> &got,
                        const std::vector<float> &want, const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(same(got[i], want[i]))
        << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
}

/// |got - want| <= 1e-5 * scale (scale: the sum of the magnitudes that went
/// into want, or |want|).
inline void expectNear(const std::vector<float> &got,
                       const std::vector<float> &want,
                       const std::vector<float> &scale, const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]) || std::isinf(want[i])) {
      ASSERT_TRUE(same(got[i], want[i]))
          << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      continue;
    }
    float tol = 1e-5f * std::max(scale[i], std::fabs(want[i]));
    ASSERT_LE(std::fabs(got[i] - want[i]), tol)
        << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
}

/// Replaces every "{KEY}" of \p text.
inline std::string
fill(std::string text,
     const std::vector<std::pair<std::string, std::string>> &kv) {
  for (auto &[key, value] : kv)
    for (size_t at; (at = text.find("{" + key + "}")) != std::string::npos;)
      text.replace(at, key.size() + 2, value);
  return text;
}

} // namespace flashjit::test

#endif // FLASHJIT_TESTS_UNIT_TILEJIT_H
