#include "kernels/simd.hpp"

#include <cpuid.h>

#include <cstdint>

#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::kernels {
namespace {

uint64_t readXcr0() {
  uint32_t eax = 0, edx = 0;
  // xgetbv with ecx = 0; encoded directly so this file needs no -mxsave.
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

SimdLevel detectOnce() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return SimdLevel::kScalar;
  const bool osxsave = ecx & (1u << 27);
  const bool avx = ecx & (1u << 28);
  const bool f16c = ecx & (1u << 29);
  const bool fma = ecx & (1u << 12);
  if (!osxsave || !avx) return SimdLevel::kScalar;
  const uint64_t xcr0 = readXcr0();
  if ((xcr0 & 0x6) != 0x6) return SimdLevel::kScalar;  // SSE and AVX state
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return SimdLevel::kScalar;
  const bool avx2 = ebx & (1u << 5);
  if (!avx2 || !f16c || !fma) return SimdLevel::kScalar;
  const bool avx512 = (ebx & (1u << 16)) && (ebx & (1u << 17)) && (ebx & (1u << 30)) && (ebx & (1u << 31));
  if (!avx512 || (xcr0 & 0xE0) != 0xE0) return SimdLevel::kAvx2;  // opmask and ZMM state
  // AVX512_BF16 is leaf 7, subleaf 1, EAX bit 5; it uses no new register state.
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5))) return SimdLevel::kAvx512Bf16;
  return SimdLevel::kAvx512;
}

}  // namespace

const char* toString(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

SimdLevel detectSimd() {
  static const SimdLevel level = detectOnce();
  return level;
}

std::vector<SimdLevel> supportedSimdLevels() {
  std::vector<SimdLevel> out;
  for (int i = 0; i <= static_cast<int>(detectSimd()); ++i) out.push_back(static_cast<SimdLevel>(i));
  return out;
}

SimdLevel resolveSimd(const std::string& request) {
  const std::string r = core::toLower(core::trim(request));
  SimdLevel wanted = detectSimd();
  if (r == "scalar") wanted = SimdLevel::kScalar;
  else if (r == "avx2") wanted = SimdLevel::kAvx2;
  else if (r == "avx512") wanted = SimdLevel::kAvx512;
  else if (r == "avx512bf16") wanted = SimdLevel::kAvx512Bf16;
  else if (r != "auto" && !r.empty()) {
    throw ConfigError("SIMD level '" + request + "' is not valid (GRADCOMM_SIMD): expected one of " +
                      "auto|avx512bf16|avx512|avx2|scalar");
  }
  return minLevel(wanted, detectSimd());
}

}  // namespace gradcomm::kernels
