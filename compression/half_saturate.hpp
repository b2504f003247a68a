#pragma once
// The fp16 rule of compression in scalar form, shared by the CPU kernels
// (their reference and tail code) and the sparse wire format. `static
// inline` for the same reason as kernels/half.hpp: the kernel translation
// units are compiled with different -m flags.
#include <cstdint>

#include "kernels/half.hpp"

namespace gradcomm::compression {

/// float -> fp16, round to nearest even; finite values beyond the fp16
/// range become +-65504 (not inf), inf stays inf, NaN stays NaN.
static inline uint16_t floatToHalfSaturating(float f) {
  const uint32_t x = kernels::floatBits(f);
  const uint32_t magnitude = x & 0x7FFFFFFFu;
  // Above 65504 (0x477FE000) yet finite: plain rounding would give inf at
  // 65520 and beyond.
  if (magnitude > 0x477FE000u && magnitude < 0x7F800000u) {
    return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7BFFu);
  }
  return kernels::floatToHalf(f);
}

}  // namespace gradcomm::compression
