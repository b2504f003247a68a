#pragma once
// Instruction-set levels of the compression kernels, chosen at run time.
#include <string>
#include <vector>

namespace gradcomm::compression {

/// kAvx2 includes F16C and FMA; kAvx512 is F/BW/VL/DQ; kAvx512Bf16 adds the
/// AVX-512 BF16 conversions (vcvtne2ps2bf16).
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };
inline constexpr int kNumIsas = 4;

const char* toString(Isa isa);
/// Best level this CPU and OS support.
Isa detectIsa();
/// Every level this CPU can run, lowest first (always includes kScalar).
std::vector<Isa> supportedIsas();
/// Parses "auto|scalar|avx2|avx512|avx512bf16"; levels above the CPU's best
/// are clamped to detectIsa(). Throws ConfigError when malformed.
Isa resolveIsa(const std::string& request);

}  // namespace gradcomm::compression
