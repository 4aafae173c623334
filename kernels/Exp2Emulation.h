//===- Exp2Emulation.h - exp2 on the FMA pipe, for the softmax --*- C++ -*-===//
//
/// \file
/// 2^x by arithmetic alone (the GPU forward's `exp2-emulation` option,
/// compiler/Conversion/TileToGPUExp2.cpp), for a share of the softmax's
/// exponentials so that the multi-function unit (ex2.approx, tanh.approx)
/// is not the one pipe a variant such as softcap waits on (the idea of
/// FlashAttention-4's software exponential; the steps and constants here
/// are this project's). For x <= 127 (the softmax's x = s - max <= 0):
///
///   xc = max(x, -127)          (NaN stays NaN)
///   t  = xc + 1.5 * 2^23       (round to nearest: t's low bits hold j)
///   j  = t - 1.5 * 2^23        (j = round(xc), exact)
///   f  = xc - j                (f in [-0.5, 0.5], exact)
///   p  = 1 + f (c1 + f (c2 + f c3))           (2^f, relative error < 1.1e-4)
///   2^x = p * bits((bits(t) << 23) + bits(1.0))   (2^j built in the
///                                                  exponent field)
///
/// For j = -127 the scale's bits are 0, so x below -126.5 (x = -inf: a
/// masked score) gives +0, as ex2.approx.ftz does; NaN stays NaN through p.
/// The coefficients minimise the relative error on [-0.5, 0.5] with c0
/// fixed at 1 (a reweighted least-squares fit, T31). The reference below
/// performs the GPU's steps in the same order and rounding, so a unit test
/// can bound the error without a GPU.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_EXP2EMULATION_H
#define FLASHJIT_KERNELS_EXP2EMULATION_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashjit::exp2emu {

/// The lower clamp: 2^j stays a float (j + 127 >= 0 in the exponent).
inline constexpr float kLow = -127.0f;
/// 1.5 * 2^23: adding it rounds to an integer held in the low bits.
inline constexpr float kRound = 12582912.0f;
/// p(f) = 1 + f (kC1 + f (kC2 + f kC3)).
inline constexpr float kC1 = 0.6932829022407532f;
inline constexpr float kC2 = 0.2422109693288803f;
inline constexpr float kC3 = 0.05500892922282219f;
/// The bound the unit test holds the reference to on normal results.
inline constexpr double kMaxRelativeError = 1.1e-4;

/// The GPU's steps on the host (f32 arithmetic, fused multiply-adds).
inline float reference(float x) {
  const float xc = std::isnan(x) || x >= kLow ? x : kLow;
  const float t = xc + kRound;
  const float j = t - kRound;
  const float f = xc - j;
  const float p = std::fma(std::fma(std::fma(kC3, f, kC2), f, kC1), f, 1.0f);
  uint32_t tb;
  std::memcpy(&tb, &t, 4);
  const uint32_t scaleBits = (tb << 23) + 0x3f800000u;
  float scale;
  std::memcpy(&scale, &scaleBits, 4);
  return p * scale;
}

} // namespace flashjit::exp2emu

#endif // FLASHJIT_KERNELS_EXP2EMULATION_H
