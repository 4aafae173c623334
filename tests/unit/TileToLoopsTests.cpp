//===- TileToLoopsTests.cpp - The tile ops on the CPU vs plain C++ --------===//
//
/// \file
/// Parses small tile-IR functions, lowers them with buildCpuLoweringPipeline
/// (flashjit-lower-tile-to-loops, then the host tail), JIT-compiles them with
/// MLIR's ExecutionEngine and compares what they write with a plain C++
/// reference of the semantics TileOps.td gives: the tile ops, elementwise
/// ops, atomic adds and rounding. Fresh random inputs every run; outputs are
/// poisoned with NaN first, so a row that must not be written keeps its NaN.
/// Exact comparisons where the arithmetic is exact, else 1e-5 relative.
//
//===----------------------------------------------------------------------===//

#include "tests/unit/TileJit.h"

#include <thread>

using namespace flashjit::test;

namespace {

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

} // namespace
