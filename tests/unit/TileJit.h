//===- TileJit.h - JIT-run tile IR for the unit tests -----------*- C++ -*-===//
//
/// \file
/// Shared by the tile-IR unit tests: parses a tile-IR module, lowers it with
/// buildCpuLoweringPipeline, JIT-compiles it with MLIR's ExecutionEngine
/// (flashjit's bf16/fp16 conversion builtins registered, as
/// compiler/Target/CpuEngine.cpp does) and calls its packed entry points;
/// random inputs, NaN poison and the exact / relative comparisons.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_TESTS_UNIT_TILEJIT_H
#define FLASHJIT_TESTS_UNIT_TILEJIT_H

#include "compiler/Pipelines/Pipelines.h"
#include "kernels/HalfFloat.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include "llvm/ExecutionEngine/Orc/Mangling.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/TargetSelect.h"
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

// x86 lowers bf16/f16 conversions to compiler-rt builtins that take and
// return 16-bit floats in XMM registers; _Float16 only carries the bits.
inline _Float16 toContainer(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return h;
}
inline uint16_t fromContainer(_Float16 h) {
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
inline _Float16 truncsfbf2(float f) {
  return toContainer(flashjit::floatToBf16(f));
}
inline _Float16 truncsfhf2(float f) {
  return toContainer(flashjit::floatToFp16(f));
}
inline float extendhfsf2(_Float16 h) {
  return flashjit::fp16ToFloat(fromContainer(h));
}
inline float extendbfsf2(_Float16 h) {
  return flashjit::bf16ToFloat(fromContainer(h));
}
inline uint16_t gnuF2h(float f) { return flashjit::floatToFp16(f); }
inline float gnuH2f(uint16_t h) { return flashjit::fp16ToFloat(h); }

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
    static bool init = [] {
      llvm::InitializeNativeTarget();
      llvm::InitializeNativeTargetAsmPrinter();
      return true;
    }();
    (void)init;
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
    ExecutionEngineOptions options;
    auto transformer = makeOptimizingTransformer(2, 0, nullptr);
    options.transformer = transformer;
    auto created = ExecutionEngine::create(*module, options);
    if (!created) {
      os << llvm::toString(created.takeError());
      return;
    }
    engine = std::move(*created);
    engine->registerSymbols([](llvm::orc::MangleAndInterner interner) {
      llvm::orc::SymbolMap map;
      auto add = [&](const char *name, auto *fn) {
        map[interner(name)] = {llvm::orc::ExecutorAddr::fromPtr(fn),
                               llvm::JITSymbolFlags::Exported};
      };
      add("__truncsfbf2", &truncsfbf2);
      add("__truncsfhf2", &truncsfhf2);
      add("__extendhfsf2", &extendhfsf2);
      add("__extendbfsf2", &extendbfsf2);
      add("__gnu_f2h_ieee", &gnuF2h);
      add("__gnu_h2f_ieee", &gnuH2f);
      return map;
    });
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
