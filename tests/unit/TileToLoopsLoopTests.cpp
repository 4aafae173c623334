//===- TileToLoopsLoopTests.cpp - Tiles in loops and ifs on the CPU -------===//
//
/// \file
/// scf.for carrying tiles (an online softmax, a yield permuting iter_args),
/// scf.if yielding one, and a whole FlashAttention-2 forward KV loop, each
/// lowered by buildCpuLoweringPipeline, JIT-run and compared with plain C++
/// (TileJit.h): fresh random inputs, NaN-poisoned outputs.
//
//===----------------------------------------------------------------------===//

#include "tests/unit/TileJit.h"

using namespace flashjit::test;

namespace {

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
