//===- TileToLoopsTests.cpp - The tile IR on the CPU vs plain C++ ---------===//
//
/// \file
/// Parses small tile-IR functions, lowers them with buildCpuLoweringPipeline
/// (flashjit-lower-tile-to-loops, then the host tail), JIT-compiles them with
/// MLIR's ExecutionEngine and compares what they write with a plain C++
/// reference of the semantics TileOps.td gives. Fresh random inputs every
/// run; outputs are poisoned with NaN first, so a row that must not be
/// written keeps its NaN. Exact comparisons where the arithmetic is exact,
/// else 1e-5 relative.
//
//===----------------------------------------------------------------------===//

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
#include <thread>
#include <vector>

using namespace mlir;

namespace {

//===----------------------------------------------------------------------===//
// JIT plumbing (as compiler/Target/CpuEngine.cpp does it)
//===----------------------------------------------------------------------===//

// x86 lowers bf16/f16 conversions to compiler-rt builtins that take and
// return 16-bit floats in XMM registers; _Float16 only carries the bits.
_Float16 toContainer(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return h;
}
uint16_t fromContainer(_Float16 h) {
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
_Float16 truncsfbf2(float f) { return toContainer(flashjit::floatToBf16(f)); }
_Float16 truncsfhf2(float f) { return toContainer(flashjit::floatToFp16(f)); }
float extendhfsf2(_Float16 h) {
  return flashjit::fp16ToFloat(fromContainer(h));
}
float extendbfsf2(_Float16 h) {
  return flashjit::bf16ToFloat(fromContainer(h));
}
uint16_t gnuF2h(float f) { return flashjit::floatToFp16(f); }
float gnuH2f(uint16_t h) { return flashjit::fp16ToFloat(h); }

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

std::mt19937 &rng() {
  static std::mt19937 gen{std::random_device{}()};
  return gen;
}
int randInt(int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}
std::vector<float> randFloats(size_t n, float lo = -2, float hi = 2) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng());
  return v;
}
/// Small integers: sums and products of them are exact in f32.
std::vector<float> randInts(size_t n, int lo = -8, int hi = 8) {
  std::vector<float> v(n);
  for (float &x : v)
    x = float(randInt(lo, hi));
  return v;
}
std::vector<uint16_t> randBf16(size_t n) {
  std::vector<uint16_t> v(n);
  for (uint16_t &x : v)
    x = flashjit::floatToBf16(randFloats(1)[0]);
  return v;
}
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
std::vector<float> poisoned(size_t n) { return std::vector<float>(n, kNaN); }

bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::memcmp(&a, &b, sizeof(float)) == 0;
}

void expectExact(const std::vector<float> &got, const std::vector<float> &want,
                 const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(same(got[i], want[i]))
        << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
}

/// |got - want| <= 1e-5 * scale (scale: the sum of the magnitudes that went
/// into want, or |want|).
void expectNear(const std::vector<float> &got, const std::vector<float> &want,
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
std::string fill(std::string text,
                 const std::vector<std::pair<std::string, std::string>> &kv) {
  for (auto &[key, value] : kv)
    for (size_t at; (at = text.find("{" + key + "}")) != std::string::npos;)
      text.replace(at, key.size() + 2, value);
  return text;
}

//===----------------------------------------------------------------------===//
// tile.load / tile.store
//===----------------------------------------------------------------------===//

const char *kLoadStore = R"mlir(
func.func @load_store(%A: memref<?xf32>, %O: memref<?xf32>, %Z: memref<?xf32>,
                      %O1: memref<?xf32>, %Z1: memref<?xf32>, %off: index,
                      %r0: index, %n: index, %s: index, %q0: index,
                      %m: index) {
  %c0 = arith.constant 0 : index
  %c5 = arith.constant 5 : index
  %c8 = arith.constant 8 : index
  %t = tile.load %A[%off] rows %r0 of %n stride %s
      : memref<?xf32> -> tensor<8x5xf32>
  tile.store %t, %O[%off] rows %q0 of %m stride %s
      : tensor<8x5xf32>, memref<?xf32>
  tile.store %t, %Z[%c0] rows %c0 of %c8 stride %c5
      : tensor<8x5xf32>, memref<?xf32>
  %v = tile.load %A[%off] rows %r0 of %n : memref<?xf32> -> tensor<8xf32>
  tile.store %v, %O1[%off] rows %q0 of %m : tensor<8xf32>, memref<?xf32>
  tile.store %v, %Z1[%c0] rows %c0 of %c8 : tensor<8xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, LoadZeroFillsAndStoreSkipsRowsPastTheEnd) {
  JIT_OR_FAIL(jit, kLoadStore);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t s = 5 + randInt(0, 3), off = randInt(0, 4);
    const int64_t r0 = randInt(0, 3), n = r0 + randInt(1, 7);
    const int64_t q0 = randInt(0, 3), m = q0 + randInt(1, 7);
    // A holds exactly the rows a load may read.
    std::vector<float> a = randFloats(size_t(off + (n - 1) * s + 5));
    std::vector<float> o = poisoned(size_t(off + (q0 + 8) * s + 5));
    std::vector<float> o1 = poisoned(size_t(off + q0 + 8));
    std::vector<float> z = poisoned(40), z1 = poisoned(8);
    std::vector<float> wantO = o, wantO1 = o1, wantZ(40), wantZ1(8);
    for (int64_t r = 0; r < 8; ++r) {
      const bool present = r0 + r < n;
      for (int64_t c = 0; c < 5; ++c) {
        float t = present ? a[size_t(off + (r0 + r) * s + c)] : 0.0f;
        wantZ[size_t(r * 5 + c)] = t;
        if (q0 + r < m)
          wantO[size_t(off + (q0 + r) * s + c)] = t;
      }
      float v = present ? a[size_t(off + r0 + r)] : 0.0f;
      wantZ1[size_t(r)] = v;
      if (q0 + r < m)
        wantO1[size_t(off + q0 + r)] = v;
    }
    Args args;
    args.buf(a)
        .buf(o)
        .buf(z)
        .buf(o1)
        .buf(z1)
        .index(off)
        .index(r0)
        .index(n)
        .index(s)
        .index(q0)
        .index(m);
    jit.call("load_store", args);
    expectExact(z, wantZ, "2-D load (all rows stored)");
    expectExact(o, wantO, "2-D predicated store");
    expectExact(z1, wantZ1, "1-D load (all rows stored)");
    expectExact(o1, wantO1, "1-D predicated store");
  }
}

//===----------------------------------------------------------------------===//
// tile.dot
//===----------------------------------------------------------------------===//

const char *kDot = R"mlir(
func.func @dot(%A: memref<?xbf16>, %B: memref<?xbf16>, %C: memref<?xf32>,
               %O: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %big = arith.constant 1000 : index
  %sa = arith.constant {LHS_COLS} : index
  %sb = arith.constant {RHS_COLS} : index
  %sc = arith.constant 10 : index
  %a = tile.load %A[%c0] rows %c0 of %big stride %sa
      : memref<?xbf16> -> tensor<{LHS}xbf16>
  %b = tile.load %B[%c0] rows %c0 of %big stride %sb
      : memref<?xbf16> -> tensor<{RHS}xbf16>
  %acc = tile.load %C[%c0] rows %c0 of %big stride %sc
      : memref<?xf32> -> tensor<6x10xf32>
  %d = tile.dot %a, %b {ACC} {ATTRS}
      : tensor<{LHS}xbf16>, tensor<{RHS}xbf16> -> tensor<6x10xf32>
  tile.store %d, %O[%c0] rows %c0 of %big stride %sc
      : tensor<6x10xf32>, memref<?xf32>
  return
}
)mlir";

/// (transpose_lhs, transpose_rhs, acc)
class TileDot : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {
};

TEST_P(TileDot, AccumulatesInF32InKOrder) {
  auto [tl, tr, withAcc] = GetParam();
  const int64_t m = 6, n = 10, k = 12;
  std::vector<std::string> attrs;
  if (tl)
    attrs.push_back("transpose_lhs");
  if (tr)
    attrs.push_back("transpose_rhs");
  std::string attrDict;
  for (const std::string &a : attrs)
    attrDict += (attrDict.empty() ? "{" : ", ") + a;
  if (!attrDict.empty())
    attrDict += "}";
  auto shape = [](int64_t r, int64_t c) {
    return std::to_string(r) + "x" + std::to_string(c);
  };
  std::string source =
      fill(kDot, {{"LHS", tl ? shape(k, m) : shape(m, k)},
                  {"RHS", tr ? shape(n, k) : shape(k, n)},
                  {"LHS_COLS", std::to_string(tl ? m : k)},
                  {"RHS_COLS", std::to_string(tr ? k : n)},
                  {"ACC", withAcc ? "acc %acc : tensor<6x10xf32>" : ""},
                  {"ATTRS", attrDict}});
  JIT_OR_FAIL(jit, source);

  std::vector<uint16_t> a = randBf16(size_t(m * k)),
                        b = randBf16(size_t(k * n));
  std::vector<float> c = randFloats(size_t(m * n)), o = poisoned(size_t(m * n));
  auto lhs = [&](int64_t i, int64_t kk) {
    return flashjit::bf16ToFloat(a[size_t(tl ? kk * m + i : i * k + kk)]);
  };
  auto rhs = [&](int64_t kk, int64_t j) {
    return flashjit::bf16ToFloat(b[size_t(tr ? j * k + kk : kk * n + j)]);
  };
  std::vector<float> want(size_t(m * n)), scale(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = withAcc ? c[size_t(i * n + j)] : 0.0f;
      float mag = std::fabs(acc);
      for (int64_t kk = 0; kk < k; ++kk) {
        float p = lhs(i, kk) * rhs(kk, j); // exact: bf16 x bf16 fits f32
        acc = acc + p;
        mag += std::fabs(p);
      }
      want[size_t(i * n + j)] = acc;
      scale[size_t(i * n + j)] = mag;
    }
  Args args;
  args.buf(a).buf(b).buf(c).buf(o);
  jit.call("dot", args);
  expectNear(o, want, scale, "dot");
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, TileDot,
    ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()),
    [](const auto &info) {
      return std::string(std::get<0>(info.param) ? "Tl" : "L") +
             (std::get<1>(info.param) ? "Tr" : "R") +
             (std::get<2>(info.param) ? "Acc" : "NoAcc");
    });

//===----------------------------------------------------------------------===//
// tile.reduce, tile.broadcast
//===----------------------------------------------------------------------===//

const char *kReduce = R"mlir(
func.func @reduce(%X: memref<?xf32>, %Y: memref<?xf32>, %M1: memref<?xf32>,
                  %M0: memref<?xf32>, %S1: memref<?xf32>, %S0: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c7 = arith.constant 7 : index
  %big = arith.constant 1000 : index
  %x = tile.load %X[%c0] rows %c0 of %big stride %c7
      : memref<?xf32> -> tensor<5x7xf32>
  %y = tile.load %Y[%c0] rows %c0 of %big stride %c7
      : memref<?xf32> -> tensor<5x7xf32>
  %m1 = tile.reduce "max" %x dim 1 : tensor<5x7xf32> -> tensor<5xf32>
  %m0 = tile.reduce "max" %x dim 0 : tensor<5x7xf32> -> tensor<7xf32>
  %s1 = tile.reduce "sum" %y dim 1 : tensor<5x7xf32> -> tensor<5xf32>
  %s0 = tile.reduce "sum" %y dim 0 : tensor<5x7xf32> -> tensor<7xf32>
  tile.store %m1, %M1[%c0] rows %c0 of %big : tensor<5xf32>, memref<?xf32>
  tile.store %m0, %M0[%c0] rows %c0 of %big : tensor<7xf32>, memref<?xf32>
  tile.store %s1, %S1[%c0] rows %c0 of %big : tensor<5xf32>, memref<?xf32>
  tile.store %s0, %S0[%c0] rows %c0 of %big : tensor<7xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, ReduceMaxAndSumOnBothDims) {
  JIT_OR_FAIL(jit, kReduce);
  const int rows = 5, cols = 7;
  std::vector<float> x = randFloats(rows * cols, -50, 50);
  std::vector<float> y = randFloats(rows * cols);
  for (int c = 0; c < cols; ++c)
    x[size_t(2 * cols + c)] = -kInf; // an all -inf row
  x[size_t(3 * cols)] = kNaN;        // maxNum ignores a NaN operand
  x[size_t(4 * cols + 3)] = kNaN;
  std::vector<float> m1 = poisoned(rows), m0 = poisoned(cols);
  std::vector<float> s1 = poisoned(rows), s0 = poisoned(cols);
  std::vector<float> wantM1(rows, -kInf), wantM0(cols, -kInf);
  std::vector<float> wantS1(rows, 0), wantS0(cols, 0);
  std::vector<float> scaleS1(rows, 0), scaleS0(cols, 0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float xv = x[size_t(r * cols + c)], yv = y[size_t(r * cols + c)];
      wantM1[size_t(r)] = std::fmax(wantM1[size_t(r)], xv);
      wantS1[size_t(r)] += yv;
      scaleS1[size_t(r)] += std::fabs(yv);
    }
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) {
      float xv = x[size_t(r * cols + c)], yv = y[size_t(r * cols + c)];
      wantM0[size_t(c)] = std::fmax(wantM0[size_t(c)], xv);
      wantS0[size_t(c)] += yv;
      scaleS0[size_t(c)] += std::fabs(yv);
    }
  ASSERT_TRUE(std::isinf(wantM1[2]) && wantM1[2] < 0);
  Args args;
  args.buf(x).buf(y).buf(m1).buf(m0).buf(s1).buf(s0);
  jit.call("reduce", args);
  expectExact(m1, wantM1, "max dim 1");
  expectExact(m0, wantM0, "max dim 0");
  expectNear(s1, wantS1, scaleS1, "sum dim 1");
  expectNear(s0, wantS0, scaleS0, "sum dim 0");
}

const char *kBroadcast = R"mlir(
func.func @broadcast(%R: memref<?xf32>, %C: memref<?xf32>, %BR: memref<?xf32>,
                     %BC: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c6 = arith.constant 6 : index
  %big = arith.constant 1000 : index
  %r = tile.load %R[%c0] rows %c0 of %big : memref<?xf32> -> tensor<4xf32>
  %c = tile.load %C[%c0] rows %c0 of %big : memref<?xf32> -> tensor<6xf32>
  %br = tile.broadcast %r dim 1 : tensor<4xf32> -> tensor<4x6xf32>
  %bc = tile.broadcast %c dim 0 : tensor<6xf32> -> tensor<4x6xf32>
  tile.store %br, %BR[%c0] rows %c0 of %big stride %c6
      : tensor<4x6xf32>, memref<?xf32>
  tile.store %bc, %BC[%c0] rows %c0 of %big stride %c6
      : tensor<4x6xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, BroadcastBothDims) {
  JIT_OR_FAIL(jit, kBroadcast);
  std::vector<float> r = randFloats(4), c = randFloats(6);
  std::vector<float> br = poisoned(24), bc = poisoned(24);
  std::vector<float> wantR(24), wantC(24);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) {
      wantR[size_t(i * 6 + j)] = r[size_t(i)];
      wantC[size_t(i * 6 + j)] = c[size_t(j)];
    }
  Args args;
  args.buf(r).buf(c).buf(br).buf(bc);
  jit.call("broadcast", args);
  expectExact(br, wantR, "broadcast dim 1");
  expectExact(bc, wantC, "broadcast dim 0");
}

//===----------------------------------------------------------------------===//
// iota, compare, select: a causal mask
//===----------------------------------------------------------------------===//

const char *kMask = R"mlir(
func.func @mask(%S: memref<?xf32>, %O: memref<?xf32>, %I: memref<?xf32>,
                %q0: i32, %k0: i32) {
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %big = arith.constant 1000 : index
  %rows = tile.iota dim 0 : tensor<8x8xi32>
  %cols = tile.iota dim 1 : tensor<8x8xi32>
  %q = tile.splat %q0 : i32 -> tensor<8x8xi32>
  %k = tile.splat %k0 : i32 -> tensor<8x8xi32>
  %qi = arith.addi %rows, %q : tensor<8x8xi32>
  %kj = arith.addi %cols, %k : tensor<8x8xi32>
  %keep = arith.cmpi sle, %kj, %qi : tensor<8x8xi32>
  %s = tile.load %S[%c0] rows %c0 of %big stride %c8
      : memref<?xf32> -> tensor<8x8xf32>
  %ninf = arith.constant dense<0xFF800000> : tensor<8x8xf32>
  %m = arith.select %keep, %s, %ninf : tensor<8x8xi1>, tensor<8x8xf32>
  tile.store %m, %O[%c0] rows %c0 of %big stride %c8
      : tensor<8x8xf32>, memref<?xf32>
  %i = tile.iota dim 0 : tensor<8xi32>
  %f = arith.sitofp %i : tensor<8xi32> to tensor<8xf32>
  tile.store %f, %I[%c0] rows %c0 of %big : tensor<8xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, IotaCompareSelectCausalMask) {
  JIT_OR_FAIL(jit, kMask);
  for (int trial = 0; trial < 4; ++trial) {
    const int32_t q0 = randInt(0, 16), k0 = randInt(0, 16);
    std::vector<float> s = randFloats(64), o = poisoned(64), iota = poisoned(8);
    std::vector<float> want(64), wantIota(8);
    for (int r = 0; r < 8; ++r) {
      wantIota[size_t(r)] = float(r);
      for (int c = 0; c < 8; ++c)
        want[size_t(r * 8 + c)] =
            k0 + c <= q0 + r ? s[size_t(r * 8 + c)] : -kInf;
    }
    Args args;
    args.buf(s).buf(o).buf(iota).i32(q0).i32(k0);
    jit.call("mask", args);
    expectExact(o, want, "masked scores");
    expectExact(iota, wantIota, "1-D iota");
  }
}

//===----------------------------------------------------------------------===//
// scf.for carrying tiles, scf.if yielding one
//===----------------------------------------------------------------------===//

const char *kSoftmax = R"mlir(
func.func @softmax(%S: memref<?xf32>, %O: memref<?xf32>, %M: memref<?xf32>,
                   %L: memref<?xf32>, %T: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %big = arith.constant 1000 : index
  %o0 = arith.constant dense<0.0> : tensor<4x8xf32>
  %m0 = arith.constant dense<0xFF800000> : tensor<4xf32>
  %l0 = arith.constant dense<0.0> : tensor<4xf32>
  %r:3 = scf.for %t = %c0 to %T step %c1
      iter_args(%o = %o0, %m = %m0, %l = %l0)
      -> (tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>) {
    %row0 = arith.muli %t, %c4 : index
    %s = tile.load %S[%c0] rows %row0 of %big stride %c8
        : memref<?xf32> -> tensor<4x8xf32>
    %mx = tile.reduce "max" %s dim 1 : tensor<4x8xf32> -> tensor<4xf32>
    %mn = arith.maxnumf %m, %mx : tensor<4xf32>
    %d = arith.subf %m, %mn : tensor<4xf32>
    %alpha = math.exp2 %d : tensor<4xf32>
    %mnb = tile.broadcast %mn dim 1 : tensor<4xf32> -> tensor<4x8xf32>
    %sd = arith.subf %s, %mnb : tensor<4x8xf32>
    %p = math.exp2 %sd : tensor<4x8xf32>
    %ps = tile.reduce "sum" %p dim 1 : tensor<4x8xf32> -> tensor<4xf32>
    %la = arith.mulf %l, %alpha : tensor<4xf32>
    %ln = arith.addf %la, %ps : tensor<4xf32>
    %ab = tile.broadcast %alpha dim 1 : tensor<4xf32> -> tensor<4x8xf32>
    %oa = arith.mulf %o, %ab : tensor<4x8xf32>
    %on = arith.addf %oa, %p : tensor<4x8xf32>
    scf.yield %on, %mn, %ln : tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  }
  tile.store %r#0, %O[%c0] rows %c0 of %big stride %c8
      : tensor<4x8xf32>, memref<?xf32>
  tile.store %r#1, %M[%c0] rows %c0 of %big : tensor<4xf32>, memref<?xf32>
  tile.store %r#2, %L[%c0] rows %c0 of %big : tensor<4xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, ForCarryingThreeTilesOnlineSoftmax) {
  JIT_OR_FAIL(jit, kSoftmax);
  const int64_t blocks = randInt(1, 6);
  std::vector<float> s = randFloats(size_t(blocks * 32), -8, 8);
  std::vector<float> o = poisoned(32), m = poisoned(4), l = poisoned(4);
  std::vector<float> wantO(32, 0), wantM(4, -kInf), wantL(4, 0);
  for (int64_t t = 0; t < blocks; ++t)
    for (int r = 0; r < 4; ++r) {
      const float *row = &s[size_t((t * 4 + r) * 8)];
      float mx = -kInf;
      for (int c = 0; c < 8; ++c)
        mx = std::fmax(mx, row[c]);
      float mn = std::fmax(wantM[size_t(r)], mx);
      float alpha = std::exp2(wantM[size_t(r)] - mn);
      float ps = 0;
      for (int c = 0; c < 8; ++c) {
        float p = std::exp2(row[c] - mn);
        ps += p;
        float &oe = wantO[size_t(r * 8 + c)];
        oe = oe * alpha + p;
      }
      wantL[size_t(r)] = wantL[size_t(r)] * alpha + ps;
      wantM[size_t(r)] = mn;
    }
  Args args;
  args.buf(s).buf(o).buf(m).buf(l).index(blocks);
  jit.call("softmax", args);
  expectExact(m, wantM, "running max");
  expectNear(l, wantL, wantL, "running sum");
  expectNear(o, wantO, wantO, "accumulator");
}

const char *kSwap = R"mlir(
func.func @swap(%A: memref<?xf32>, %O: memref<?xf32>, %T: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %big = arith.constant 1000 : index
  %p0 = tile.load %A[%c0] rows %c0 of %big : memref<?xf32> -> tensor<4xf32>
  %q0 = tile.load %A[%c4] rows %c0 of %big : memref<?xf32> -> tensor<4xf32>
  %z0 = arith.constant dense<0.0> : tensor<4xf32>
  %r:3 = scf.for %t = %c0 to %T step %c1
      iter_args(%p = %p0, %q = %q0, %z = %z0)
      -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
    %two = arith.constant dense<2.0> : tensor<4xf32>
    %z2 = arith.mulf %z, %two : tensor<4xf32>
    %zn = arith.addf %z2, %p : tensor<4xf32>
    scf.yield %q, %p, %zn : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
  }
  tile.store %r#0, %O[%c0] rows %c0 of %big : tensor<4xf32>, memref<?xf32>
  tile.store %r#1, %O[%c4] rows %c0 of %big : tensor<4xf32>, memref<?xf32>
  tile.store %r#2, %O[%c8] rows %c0 of %big : tensor<4xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, ForYieldSwappingIterArgs) {
  JIT_OR_FAIL(jit, kSwap);
  for (int64_t trips : std::vector<int64_t>{0, 1, 2, 5, randInt(3, 9)}) {
    std::vector<float> a = randInts(8), o = poisoned(12);
    std::vector<float> p(a.begin(), a.begin() + 4), q(a.begin() + 4, a.end());
    std::vector<float> z(4, 0);
    for (int64_t t = 0; t < trips; ++t) {
      for (int i = 0; i < 4; ++i)
        z[size_t(i)] = z[size_t(i)] * 2 + p[size_t(i)];
      std::swap(p, q);
    }
    std::vector<float> want = p;
    want.insert(want.end(), q.begin(), q.end());
    want.insert(want.end(), z.begin(), z.end());
    Args args;
    args.buf(a).buf(o).index(trips);
    jit.call("swap", args);
    expectExact(o, want, ("swap, trips " + std::to_string(trips)).c_str());
  }
}

const char *kIf = R"mlir(
func.func @if_tile(%A: memref<?xf32>, %O: memref<?xf32>, %flag: index) {
  %c0 = arith.constant 0 : index
  %c3 = arith.constant 3 : index
  %big = arith.constant 1000 : index
  %a = tile.load %A[%c0] rows %c0 of %big stride %c3
      : memref<?xf32> -> tensor<4x3xf32>
  %cond = arith.cmpi ne, %flag, %c0 : index
  %t = scf.if %cond -> (tensor<4x3xf32>) {
    %e = arith.negf %a : tensor<4x3xf32>
    scf.yield %e : tensor<4x3xf32>
  } else {
    scf.yield %a : tensor<4x3xf32>
  }
  %u = arith.addf %t, %a : tensor<4x3xf32>
  tile.store %u, %O[%c0] rows %c0 of %big stride %c3
      : tensor<4x3xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, IfYieldingATile) {
  JIT_OR_FAIL(jit, kIf);
  for (int64_t flag : {0, 1}) {
    std::vector<float> a = randFloats(12), o = poisoned(12), want(12);
    for (size_t i = 0; i < 12; ++i)
      want[i] = (flag ? -a[i] : a[i]) + a[i];
    Args args;
    args.buf(a).buf(o).index(flag);
    jit.call("if_tile", args);
    expectExact(o, want, flag ? "then branch" : "else branch");
  }
}

//===----------------------------------------------------------------------===//
// tile.atomic_add, arith.truncf
//===----------------------------------------------------------------------===//

const char *kAtomic = R"mlir(
func.func @atomic(%A: memref<?xf32>, %D: memref<?xf32>, %D1: memref<?xf32>,
                  %r0: index, %n: index) {
  %c0 = arith.constant 0 : index
  %c6 = arith.constant 6 : index
  %big = arith.constant 1000 : index
  %t = tile.load %A[%c0] rows %c0 of %big stride %c6
      : memref<?xf32> -> tensor<5x6xf32>
  tile.atomic_add %t, %D[%c0] rows %r0 of %n stride %c6
      : tensor<5x6xf32>, memref<?xf32>
  %v = tile.load %A[%c0] rows %c0 of %big : memref<?xf32> -> tensor<5xf32>
  tile.atomic_add %v, %D1[%c0] rows %r0 of %n : tensor<5xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, AtomicAddFromManyThreads) {
  JIT_OR_FAIL(jit, kAtomic);
  const int64_t r0 = randInt(0, 3), n = r0 + randInt(1, 4);
  const int threads = 4, calls = 50;
  std::vector<float> a = randInts(30);
  std::vector<float> d = randInts(size_t((r0 + 5) * 6));
  std::vector<float> d1 = randInts(size_t(r0 + 5));
  std::vector<float> wantD = d, wantD1 = d1;
  for (int64_t r = 0; r < 5 && r0 + r < n; ++r) {
    for (int64_t c = 0; c < 6; ++c)
      wantD[size_t((r0 + r) * 6 + c)] +=
          float(threads * calls) * a[size_t(r * 6 + c)];
    wantD1[size_t(r0 + r)] += float(threads * calls) * a[size_t(r)];
  }
  auto fn = jit.entry("atomic");
  ASSERT_NE(fn, nullptr) << jit.diagnostics();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      Args args;
      args.buf(a).buf(d).buf(d1).index(r0).index(n);
      for (int i = 0; i < calls; ++i)
        fn(args.data());
    });
  for (std::thread &t : pool)
    t.join();
  expectExact(d, wantD, "2-D atomic_add");
  expectExact(d1, wantD1, "1-D atomic_add");
}

const char *kTrunc = R"mlir(
func.func @trunc(%A: memref<?xf32>, %B: memref<?xbf16>, %H: memref<?xf16>,
                 %E: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %big = arith.constant 1000 : index
  %a = tile.load %A[%c0] rows %c0 of %big stride %c16
      : memref<?xf32> -> tensor<4x16xf32>
  %b = arith.truncf %a : tensor<4x16xf32> to tensor<4x16xbf16>
  %h = arith.truncf %a : tensor<4x16xf32> to tensor<4x16xf16>
  %e = arith.extf %b : tensor<4x16xbf16> to tensor<4x16xf32>
  tile.store %b, %B[%c0] rows %c0 of %big stride %c16
      : tensor<4x16xbf16>, memref<?xbf16>
  tile.store %h, %H[%c0] rows %c0 of %big stride %c16
      : tensor<4x16xf16>, memref<?xf16>
  tile.store %e, %E[%c0] rows %c0 of %big stride %c16
      : tensor<4x16xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, TruncfRoundsEachElement) {
  JIT_OR_FAIL(jit, kTrunc);
  std::vector<float> a = randFloats(64, -100, 100);
  // Ties (round to even) and values that need rounding up.
  const float special[] = {1.00390625f, 1.01171875f, 1.0009765625f, -3.0f,
                           65504.0f,    1e-8f,       0.0f,          -0.0f};
  std::copy(std::begin(special), std::end(special), a.begin());
  std::vector<uint16_t> b(64, 0xffff), h(64, 0xffff);
  std::vector<float> e = poisoned(64);
  std::vector<float> gotB(64), gotH(64), wantB(64), wantH(64), wantE(64);
  Args args;
  args.buf(a).buf(b).buf(h).buf(e);
  jit.call("trunc", args);
  for (size_t i = 0; i < 64; ++i) {
    // Compare the bit patterns, as floats.
    gotB[i] = float(b[i]);
    gotH[i] = float(h[i]);
    wantB[i] = float(flashjit::floatToBf16(a[i]));
    wantH[i] = float(flashjit::floatToFp16(a[i]));
    wantE[i] = flashjit::bf16ToFloat(flashjit::floatToBf16(a[i]));
  }
  expectExact(gotB, wantB, "truncf to bf16 (bits)");
  expectExact(gotH, wantH, "truncf to f16 (bits)");
  expectExact(e, wantE, "extf of the bf16");
}

//===----------------------------------------------------------------------===//
// A whole forward program: the FlashAttention-2 KV loop on tiles
//===----------------------------------------------------------------------===//

const char *kForward = R"mlir(
func.func @fwd(%Q: memref<?xbf16>, %K: memref<?xbf16>, %V: memref<?xbf16>,
               %O: memref<?xf32>, %nq: index, %nkv: index, %m0: index,
               %scale: f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cbn = arith.constant {BN} : index
  %cbn1 = arith.constant {BN1} : index
  %cd = arith.constant {D} : index
  %q = tile.load %Q[%c0] rows %m0 of %nq stride %cd
      : memref<?xbf16> -> tensor<{BM}x{D}xbf16>
  %o0 = arith.constant dense<0.0> : tensor<{BM}x{D}xf32>
  %mi0 = arith.constant dense<0xFF800000> : tensor<{BM}xf32>
  %l0 = arith.constant dense<0.0> : tensor<{BM}xf32>
  %sc = tile.splat %scale : f32 -> tensor<{BM}x{BN}xf32>
  %cols = tile.iota dim 1 : tensor<{BM}x{BN}xi32>
  %nkvi = arith.index_cast %nkv : index to i32
  %nkvt = tile.splat %nkvi : i32 -> tensor<{BM}x{BN}xi32>
  %ninf = arith.constant dense<0xFF800000> : tensor<{BM}x{BN}xf32>
  %nkvr = arith.addi %nkv, %cbn1 : index
  %nb = arith.divui %nkvr, %cbn : index
  %r:3 = scf.for %t = %c0 to %nb step %c1
      iter_args(%o = %o0, %m = %mi0, %l = %l0)
      -> (tensor<{BM}x{D}xf32>, tensor<{BM}xf32>, tensor<{BM}xf32>) {
    %n0 = arith.muli %t, %cbn : index
    %k = tile.load %K[%c0] rows %n0 of %nkv stride %cd
        : memref<?xbf16> -> tensor<{BN}x{D}xbf16>
    %v = tile.load %V[%c0] rows %n0 of %nkv stride %cd
        : memref<?xbf16> -> tensor<{BN}x{D}xbf16>
    %s = tile.dot %q, %k {transpose_rhs}
        : tensor<{BM}x{D}xbf16>, tensor<{BN}x{D}xbf16> -> tensor<{BM}x{BN}xf32>
    %ss = arith.mulf %s, %sc : tensor<{BM}x{BN}xf32>
    %n0i = arith.index_cast %n0 : index to i32
    %n0t = tile.splat %n0i : i32 -> tensor<{BM}x{BN}xi32>
    %key = arith.addi %cols, %n0t : tensor<{BM}x{BN}xi32>
    %valid = arith.cmpi slt, %key, %nkvt : tensor<{BM}x{BN}xi32>
    %sm = arith.select %valid, %ss, %ninf
        : tensor<{BM}x{BN}xi1>, tensor<{BM}x{BN}xf32>
    %mx = tile.reduce "max" %sm dim 1 : tensor<{BM}x{BN}xf32> -> tensor<{BM}xf32>
    %mn = arith.maxnumf %m, %mx : tensor<{BM}xf32>
    %dm = arith.subf %m, %mn : tensor<{BM}xf32>
    %alpha = math.exp2 %dm : tensor<{BM}xf32>
    %mnb = tile.broadcast %mn dim 1 : tensor<{BM}xf32> -> tensor<{BM}x{BN}xf32>
    %sd = arith.subf %sm, %mnb : tensor<{BM}x{BN}xf32>
    %p = math.exp2 %sd : tensor<{BM}x{BN}xf32>
    %ps = tile.reduce "sum" %p dim 1 : tensor<{BM}x{BN}xf32> -> tensor<{BM}xf32>
    %la = arith.mulf %l, %alpha : tensor<{BM}xf32>
    %ln = arith.addf %la, %ps : tensor<{BM}xf32>
    %p16 = arith.truncf %p : tensor<{BM}x{BN}xf32> to tensor<{BM}x{BN}xbf16>
    %ab = tile.broadcast %alpha dim 1 : tensor<{BM}xf32> -> tensor<{BM}x{D}xf32>
    %oa = arith.mulf %o, %ab : tensor<{BM}x{D}xf32>
    %on = tile.dot %p16, %v acc %oa : tensor<{BM}x{D}xf32>
        : tensor<{BM}x{BN}xbf16>, tensor<{BN}x{D}xbf16> -> tensor<{BM}x{D}xf32>
    scf.yield %on, %mn, %ln
        : tensor<{BM}x{D}xf32>, tensor<{BM}xf32>, tensor<{BM}xf32>
  }
  %lb = tile.broadcast %r#2 dim 1 : tensor<{BM}xf32> -> tensor<{BM}x{D}xf32>
  %of = arith.divf %r#0, %lb : tensor<{BM}x{D}xf32>
  tile.store %of, %O[%c0] rows %m0 of %nq stride %cd
      : tensor<{BM}x{D}xf32>, memref<?xf32>
  return
}
)mlir";

TEST(TileToLoops, ForwardKvLoopMatchesReference) {
  const int64_t bm = 32, bn = 32, d = 64;
  JIT_OR_FAIL(jit, fill(kForward, {{"BM", std::to_string(bm)},
                                   {"BN", std::to_string(bn)},
                                   {"BN1", std::to_string(bn - 1)},
                                   {"D", std::to_string(d)}}));
  const int64_t nkv = randInt(40, 300), nq = randInt(1, 80);
  const int64_t m0 = bm * randInt(0, int((nq - 1) / bm));
  const float scale = float(1 / std::sqrt(double(d)) / std::log(2.0));
  std::vector<uint16_t> q = randBf16(size_t(nq * d));
  std::vector<uint16_t> k = randBf16(size_t(nkv * d));
  std::vector<uint16_t> v = randBf16(size_t(nkv * d));
  std::vector<float> o = poisoned(size_t(nq * d));
  using flashjit::bf16ToFloat;
  std::vector<float> want = o, scaleOf(o.size(), 0);
  for (int64_t r = 0; r < bm && m0 + r < nq; ++r) {
    const int64_t i = m0 + r;
    float m = -kInf, l = 0;
    std::vector<float> acc(static_cast<size_t>(d), 0.0f);
    for (int64_t n0 = 0; n0 < nkv; n0 += bn) {
      std::vector<float> sm(static_cast<size_t>(bn));
      float mx = -kInf;
      for (int64_t c = 0; c < bn; ++c) {
        float s = 0;
        if (n0 + c < nkv)
          for (int64_t kk = 0; kk < d; ++kk)
            s = s + bf16ToFloat(q[size_t(i * d + kk)]) *
                        bf16ToFloat(k[size_t((n0 + c) * d + kk)]);
        sm[size_t(c)] = n0 + c < nkv ? s * scale : -kInf;
        mx = std::fmax(mx, sm[size_t(c)]);
      }
      float mn = std::fmax(m, mx), alpha = std::exp2(m - mn), ps = 0;
      std::vector<float> p16(static_cast<size_t>(bn));
      for (int64_t c = 0; c < bn; ++c) {
        float p = std::exp2(sm[size_t(c)] - mn);
        ps += p;
        p16[size_t(c)] = bf16ToFloat(flashjit::floatToBf16(p));
      }
      l = l * alpha + ps;
      m = mn;
      for (int64_t j = 0; j < d; ++j) {
        float a = acc[size_t(j)] * alpha;
        for (int64_t c = 0; c < bn; ++c) {
          float vv =
              n0 + c < nkv ? bf16ToFloat(v[size_t((n0 + c) * d + j)]) : 0;
          a = a + p16[size_t(c)] * vv;
        }
        acc[size_t(j)] = a;
      }
    }
    for (int64_t j = 0; j < d; ++j) {
      want[size_t(i * d + j)] = acc[size_t(j)] / l;
      scaleOf[size_t(i * d + j)] = 1; // |v| <= 2: O is a convex mix of V
    }
  }
  Args args;
  args.buf(q).buf(k).buf(v).buf(o).index(nq).index(nkv).index(m0).f32(scale);
  jit.call("fwd", args);
  expectNear(o, want, scaleOf, "O");
}

} // namespace
