//===- HalfFloat.h - bf16 / fp16 <-> fp32 conversions -----------*- C++ -*-===//
//
/// \file
/// Bit-exact conversions between float and the 16-bit formats, rounding to
/// nearest even. Used by the host tensors, the reference, and registered with
/// the CPU JIT as the compiler-rt builtins (__truncsfbf2, __truncsfhf2,
/// __extendhfsf2) that GCC 12's static libgcc lacks.
//
//===----------------------------------------------------------------------===//
#ifndef FLASHJIT_KERNELS_HALFFLOAT_H
#define FLASHJIT_KERNELS_HALFFLOAT_H

#include <cstdint>
#include <cstring>

namespace flashjit {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// float -> bf16 bits, round to nearest even; NaN stays a quiet NaN.
inline uint16_t floatToBf16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float bf16ToFloat(uint16_t h) { return bitsFloat(uint32_t(h) << 16); }

/// float -> IEEE binary16 bits, round to nearest even, with subnormals,
/// overflow to infinity and NaN preserved.
inline uint16_t floatToFp16(float f) {
  uint32_t u = floatBits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u)
    return uint16_t(sign | 0x7e00u); // NaN
  if (absu >= 0x477ff000u)           // rounds to >= 65520: infinity
    return uint16_t(sign | 0x7c00u);
  if (absu < 0x38800000u) { // below the smallest normal (2^-14): subnormal
    // Scale so that the fp16 subnormal unit (2^-24) becomes 1.0, then round
    // to an integer with the FPU's round-to-nearest-even.
    float scaled = bitsFloat(absu) * 16777216.0f; // 2^24
    // Adding and subtracting 2^23 rounds to an integer (ties to even).
    float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return uint16_t(sign | uint16_t(rounded));
  }
  uint32_t mant = absu & 0x7fffffu;
  uint32_t exp = (absu >> 23) - 127 + 15;
  uint32_t half = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
    ++half; // may carry into the exponent, which is still correct
  return uint16_t(sign | half);
}

inline float fp16ToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = float(mant) / 16777216.0f; // mant * 2^-24
    return bitsFloat(floatBits(v) | sign);
  }
  if (exp == 31)
    return bitsFloat(sign | 0x7f800000u | (mant << 13));
  return bitsFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

} // namespace flashjit

#endif // FLASHJIT_KERNELS_HALFFLOAT_H
