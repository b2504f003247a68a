#pragma once
// Instruction-set levels of the compression kernels: the library's one CPU
// detection (kernels/simd.hpp) under the names the compression code uses.
#include "kernels/simd.hpp"

namespace gradcomm::compression {

/// A CPU instruction-set level (kernels::SimdLevel); kAvx512Bf16 enables the
/// AVX-512 BF16 casts.
using Isa = kernels::SimdLevel;

/// "scalar", "avx2", "avx512", "avx512bf16" (one function, so both names resolve to it).
using kernels::toString;
/// Best level this CPU and OS support (kernels::detectSimd()).
inline Isa detectIsa() { return kernels::detectSimd(); }

}  // namespace gradcomm::compression
