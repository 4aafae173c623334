//===- TanhPolynomial.h - tanh on the FMA pipe, for score tiles -*- C++ -*-===//
//
/// \file
/// tanh(x) by a polynomial on the FMA pipe where |x| <= 1 (the GPU
/// lowering's `tanh-polynomial` option, compiler/Conversion/
/// TileToGPUTanh.cpp), so that a softcap score (C tanh(s / C), |s| <= C)
/// does not take the multi-function unit that its exponential also needs
/// (two results a score there put a softcap forward on that unit, T39-T43).
/// Outside that range the lowering keeps tanh.approx.f32. The odd
/// polynomial, in y = x^2:
///
///   y = x * x
///   q = y * (c1 + y (c2 + y c3))
///   tanh(x) ~= x + x q          (one fused multiply-add)
///
/// The coefficients minimise the relative error on [0, 1] (a reweighted
/// least-squares fit, T44); with f32 steps the error is below 1e-4 (about
/// 2^-13.3), where tanh.approx.f32's is 2^-10.987 (the PTX ISA's figure).
/// The polynomial is odd, so it keeps tanh's symmetry; x = +-0 gives 0
/// and NaN stays NaN. The reference below performs the GPU's steps in the
/// same order and rounding, so a unit test can bound the error without a
/// GPU.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_TANHPOLYNOMIAL_H
#define FLASHJIT_KERNELS_TANHPOLYNOMIAL_H

#include <cmath>

namespace flashjit::tanhpoly {

/// The polynomial is used where |x| <= kBound (for every register of a
/// warp's share of the tile: the lowering branches on one vote).
inline constexpr float kBound = 1.0f;
inline constexpr float kC1 = -0.3313330411911011f;
inline constexpr float kC2 = 0.12027541548013687f;
inline constexpr float kC3 = -0.027423057705163956f;
/// The bound the unit test holds the reference to on [-kBound, kBound].
inline constexpr double kMaxRelativeError = 1e-4;

/// The GPU's steps on the host (f32 arithmetic, fused multiply-adds).
inline float reference(float x) {
  const float y = x * x;
  const float q = std::fma(std::fma(kC3, y, kC2), y, kC1) * y;
  return std::fma(x, q, x);
}

} // namespace flashjit::tanhpoly

#endif // FLASHJIT_KERNELS_TANHPOLYNOMIAL_H
