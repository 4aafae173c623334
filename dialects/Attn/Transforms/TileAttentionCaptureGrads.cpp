//===- TileAttentionCaptureGrads.cpp - Captured gradients, deterministic --===//
//
/// \file
/// The gradients of a score modifier's captured tensors with
/// `deterministic` (kernels/KernelABI.h, abi::bwd::fixedPointCaptureGrads).
/// Without it the main loop adds each contribution into the f32 gradient
/// by atomic adds, whose order (threads of the CPU grid, warps and programs
/// of the GPU) changes the rounding from run to run. Here each contribution
/// v is split exactly into two fixed-point words, added with integer adds
/// (exact, so their sum is the same whatever the order), and a row kernel
/// per captured tensor turns the sums back into f32. Before (the main
/// loop's step, tile.scatter_add into the f32 gradient):
///
///   tile.scatter_add %v, %capture_grad0[%idx]
///       : tensor<64x128xf32>, memref<?xf32>, tensor<64x128xi32>
///
/// After (H = kCaptureHiBits, L = kCaptureLoBits):
///
///   %hf = math.roundeven (%v * 2^H), clamped to +-2^62
///   %lf = math.roundeven ((%v - %hf * 2^-H) * 2^L), clamped
///   tile.scatter_add (arith.fptosi %hf), %capture_hi0[%idx]
///       : tensor<64x128xi64>, memref<?xi64>, tensor<64x128xi32>
///   tile.scatter_add (arith.fptosi %lf), %capture_lo0[%idx] ...
///   tile.scatter_add select(%v - %v != 0, 1, 0), %capture_lo0[W]
///       // W = ceil(n / 32) * 32: a NaN or infinite v is counted
///
///   func.func @attention_capture_grad0(...)   // role "capture_convert"
///     %hi = tile.load %capture_hi0[0] rows %r0 of ceil(%n / 32) stride 32
///         : memref<?xi64> -> tensor<64x32xi64>
///     %lo = tile.load %capture_lo0[0] ...
///     %e = (iota 0 + %r0) * 32 + iota 1; %ok = %e < %n   // the element
///     %g = tile.gather %capture_grad0[select(%ok, %e, 0)]
///     %d = math.fma (sitofp %hi), 2^-H, (sitofp %lo) * 2^-L
///     %bad = tile.gather %capture_lo0[W]            // non-finite count
///     tile.scatter select(%bad != 0, NaN, %g + %d), %capture_grad0[...]
///         if %ok
///
/// v - hf * 2^-H is exact in f32 (it is v's bits below 2^-H), so a word
/// loses only what lies below 2^-L; the range is |v| < 2^38. The integer
/// sums cannot carry a NaN, so a non-finite contribution is counted apart
/// and makes the whole gradient NaN.
//
//===----------------------------------------------------------------------===//

#include "dialects/Attn/Transforms/TiledBackward.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace flashjit;
using flashjit::attn::detail::TiledBackwardBuilder;
namespace bwd = flashjit::abi::bwd;

Value TiledBackwardBuilder::captureWords(unsigned c, bool lo) {
  const unsigned captures = unsigned(totalCapturedTensors(op));
  return arg(firstCaptureArg() + 2 * captures + 2 * c + (lo ? 1 : 0));
}

Value TiledBackwardBuilder::captureSize(unsigned c) {
  const unsigned captures = unsigned(totalCapturedTensors(op));
  return arg(firstCaptureArg() + 4 * captures + c);
}

void TiledBackwardBuilder::addFixedPoint(Value v, unsigned c, Value index) {
  auto ty = cast<Tensor>(v.getType());
  Tensor wordTy = tile(ty.getShape(), b.getI64Type());
  // Rounded to an integer in f32, kept where fptosi is defined.
  auto word = [&](Value x) {
    Value r = math::RoundEvenOp::create(b, x);
    const double limit = std::ldexp(1.0, 62);
    r = arith::MinNumFOp::create(
        b, arith::MaxNumFOp::create(b, r, constTile(-limit, ty)),
        constTile(limit, ty));
    return r;
  };
  Value hf = word(fmul(v, constTile(std::ldexp(1.0, bwd::kCaptureHiBits), ty)));
  Value rest =
      fsub(v, fmul(hf, constTile(std::ldexp(1.0, -bwd::kCaptureHiBits), ty)));
  Value lf =
      word(fmul(rest, constTile(std::ldexp(1.0, bwd::kCaptureLoBits), ty)));
  for (auto [w, lo] : {std::pair{hf, false}, {lf, true}})
    tile::ScatterAddOp::create(b, arith::FPToSIOp::create(b, wordTy, w),
                               captureWords(c, lo), index);
  // A NaN or infinite v (v - v is NaN) counts at lo[W], W the words' count:
  // the conversion then writes NaN (the words saturated meanwhile).
  Value bad = cmpF(arith::CmpFPredicate::UNE, fsub(v, v), constTile(0.0, ty));
  Value one = arith::ConstantOp::create(
      b, DenseElementsAttr::get(wordTy, b.getI64IntegerAttr(1).getValue()));
  Value none = arith::ConstantOp::create(
      b, DenseElementsAttr::get(wordTy, b.getI64IntegerAttr(0).getValue()));
  Tensor iTy = tile(ty.getShape(), b.getI32Type());
  tile::ScatterAddOp::create(b, select(bad, one, none), captureWords(c, true),
                             splat(toI32(wordCount(c)), iTy));
}

Value TiledBackwardBuilder::wordCount(unsigned c) {
  const int64_t cols = bwd::kCaptureColumns;
  return mulC(arith::DivUIOp::create(b, add(captureSize(c), cIdx(cols - 1)),
                                     cIdx(cols)),
              cols);
}

void TiledBackwardBuilder::buildCaptureConvert(unsigned c) {
  beginFunc(
      (op.getSymName() + bwd::kCaptureGradSuffix + std::to_string(c)).str(),
      "capture_convert", br, bc);
  const int64_t rows = bwd::kRowBlockRows, cols = bwd::kCaptureColumns;
  Value n = captureSize(c);
  Value wordRows =
      arith::DivUIOp::create(b, add(n, cIdx(cols - 1)), cIdx(cols));
  Value first = mulC(pidM(), rows);
  Tensor wordTy = tile({rows, cols}, b.getI64Type());
  Value hi = loadTile(wordTy, captureWords(c, false), cIdx(0), first, wordRows,
                      cIdx(cols));
  Value lo = loadTile(wordTy, captureWords(c, true), cIdx(0), first, wordRows,
                      cIdx(cols));
  Tensor iTy = tile({rows, cols}, b.getI32Type());
  Value element = arith::AddIOp::create(
      b,
      arith::MulIOp::create(b, indexTile(iTy, 0, first),
                            splat(toI32(cIdx(cols)), iTy)),
      iota(iTy, 1));
  Value ok = cmpI(arith::CmpIPredicate::slt, element, splat(toI32(n), iTy));
  Value at = select(ok, element, splat(toI32(cIdx(0)), iTy));
  Tensor fTy = tile({rows, cols}, f32);
  Value grad = captureBuf(c, /*grad=*/true);
  Value g = tile::GatherOp::create(b, fTy, grad, at);
  auto toF32 = [&](Value w) { return arith::SIToFPOp::create(b, fTy, w); };
  Value d = fma(
      toF32(hi), constTile(std::ldexp(1.0, -bwd::kCaptureHiBits), fTy),
      fmul(toF32(lo), constTile(std::ldexp(1.0, -bwd::kCaptureLoBits), fTy)));
  // NaN everywhere when a contribution was not finite.
  Value bad = tile::GatherOp::create(b, wordTy, captureWords(c, true),
                                     splat(toI32(wordCount(c)), iTy));
  Value nan = constTile(std::numeric_limits<double>::quiet_NaN(), fTy);
  Value sum =
      select(cmpI(arith::CmpIPredicate::ne, bad,
                  arith::ConstantOp::create(
                      b, DenseElementsAttr::get(
                             wordTy, b.getI64IntegerAttr(0).getValue()))),
             nan, fadd(g, d));
  tile::ScatterOp::create(b, sum, grad, at, ok);
  func::ReturnOp::create(b);
}
