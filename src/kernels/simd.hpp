#pragma once
// The one CPU instruction-set detection of the library: the reduction
// kernels (kernels/reduce.hpp) and the compression kernels
// (compression/cpu/) both pick their per-level tables from this level, and
// GRADCOMM_SIMD caps both.
#include <string>
#include <vector>

namespace gradcomm::kernels {

/// Instruction-set levels of the CPU kernels, chosen at run time. kScalar is
/// portable C++ for the x86-64 baseline; kAvx2 includes F16C and FMA;
/// kAvx512 is F/BW/VL/DQ; kAvx512Bf16 adds the AVX-512 BF16 conversions
/// (only the compression casts have code for it; the reduction kernels run
/// their kAvx512 table there).
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

/// Lower-case name ("scalar", "avx2", "avx512", "avx512bf16").
const char* toString(SimdLevel level);
/// Best level this CPU and OS support (CPUID, and the AVX/AVX-512 register
/// state enabled in XCR0), detected once.
SimdLevel detectSimd();
/// Every level this CPU can run, lowest first (always includes kScalar).
std::vector<SimdLevel> supportedSimdLevels();
/// Parses "auto|avx512bf16|avx512|avx2|scalar" (case-insensitive; empty is
/// auto); "auto" and any level above the CPU's best are clamped to
/// detectSimd(). Throws ConfigError when malformed.
SimdLevel resolveSimd(const std::string& request);
/// The lower of two levels (a cap applied to a request).
inline SimdLevel minLevel(SimdLevel a, SimdLevel b) { return static_cast<int>(a) < static_cast<int>(b) ? a : b; }

}  // namespace gradcomm::kernels
