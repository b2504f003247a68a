#pragma once
// Scalar float16 / bfloat16 conversions, round to nearest even, bit-exact
// with the F16C and AVX-512 paths for every non-NaN input. Functions are
// `static inline` on purpose: kernel translation units are compiled with
// different -m flags, and internal linkage keeps the linker from merging an
// AVX-512 copy into a baseline caller.
#include <cstdint>
#include <cstring>

namespace gradcomm::kernels {

static inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// IEEE binary16 -> float (exact).
static inline float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return bitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return bitsToFloat(sign | floatBits(magnitude));
  }
  return bitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// float -> IEEE binary16, round to nearest even. Values at or beyond
/// 65520 become infinity (IEEE behaviour); NaN stays NaN (quiet).
static inline uint16_t floatToHalf(float f) {
  uint32_t x = floatBits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t magnitude = x & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // inf or NaN
    uint32_t nanBits = magnitude > 0x7F800000u ? (0x200u | ((magnitude >> 13) & 0x3FFu)) : 0u;
    return static_cast<uint16_t>(sign | 0x7C00u | nanBits);
  }
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520
  if (magnitude < 0x38800000u) {
    // Below 2^-14: the result is subnormal (or zero). Adding 0.5f aligns the
    // float's unit in the last place with the half subnormal step 2^-24, so
    // the FPU performs the round-to-nearest-even for us.
    float aligned = bitsToFloat(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (floatBits(aligned) - 0x3F000000u));
  }
  uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xC8000FFFu + odd;  // rebias exponent (-112 << 23) and round half to even
  return static_cast<uint16_t>(sign | (magnitude >> 13));
}

/// bfloat16 -> float (exact).
static inline float bf16ToFloat(uint16_t b) { return bitsToFloat(static_cast<uint32_t>(b) << 16); }

/// float -> bfloat16, round to nearest even; NaN stays NaN (quiet).
static inline uint16_t floatToBf16(float f) {
  uint32_t x = floatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace gradcomm::kernels
