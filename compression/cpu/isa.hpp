#pragma once
// Instruction-set levels of the compression kernels: the library's one CPU
// detection (kernels/simd.hpp) under the names the compression code uses.
#include <string>
#include <vector>

#include "kernels/simd.hpp"

namespace gradcomm::compression {

/// A CPU instruction-set level (kernels::SimdLevel); kAvx512Bf16 enables the
/// AVX-512 BF16 casts.
using Isa = kernels::SimdLevel;
/// Number of Isa values.
inline constexpr int kNumIsas = kernels::kNumSimdLevels;

/// "scalar", "avx2", "avx512", "avx512bf16" (one function, so both names resolve to it).
using kernels::toString;
/// Best level this CPU and OS support (kernels::detectSimd()).
inline Isa detectIsa() { return kernels::detectSimd(); }
/// Every level this CPU can run, lowest first (always includes kScalar).
inline std::vector<Isa> supportedIsas() { return kernels::supportedSimdLevels(); }
/// kernels::resolveSimd: "auto|scalar|avx2|avx512|avx512bf16", clamped to
/// detectIsa(); throws ConfigError when malformed.
inline Isa resolveIsa(const std::string& request) { return kernels::resolveSimd(request); }

}  // namespace gradcomm::compression
