#include "compression/cpu/isa.hpp"

#include <cpuid.h>

#include "core/units.hpp"
#include "gradcomm/error.hpp"
#include "kernels/reduce.hpp"

namespace gradcomm::compression {
namespace {

Isa detectOnce() {
  // The reduction kernels already check AVX2/F16C/FMA, AVX-512 F/BW/VL/DQ
  // and that the OS saves the wider registers; only BF16 is new here.
  switch (kernels::detectSimd()) {
    case kernels::SimdLevel::kScalar: return Isa::kScalar;
    case kernels::SimdLevel::kAvx2: return Isa::kAvx2;
    case kernels::SimdLevel::kAvx512: break;
  }
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5))) return Isa::kAvx512Bf16;
  return Isa::kAvx512;
}

}  // namespace

const char* toString(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

Isa detectIsa() {
  static const Isa isa = detectOnce();
  return isa;
}

std::vector<Isa> supportedIsas() {
  std::vector<Isa> out;
  for (int i = 0; i <= static_cast<int>(detectIsa()); ++i) out.push_back(static_cast<Isa>(i));
  return out;
}

Isa resolveIsa(const std::string& request) {
  const std::string r = core::toLower(core::trim(request));
  Isa wanted = detectIsa();
  if (r == "scalar") wanted = Isa::kScalar;
  else if (r == "avx2") wanted = Isa::kAvx2;
  else if (r == "avx512") wanted = Isa::kAvx512;
  else if (r == "avx512bf16") wanted = Isa::kAvx512Bf16;
  else if (r != "auto" && !r.empty()) {
    throw ConfigError("compression ISA '" + request + "' is not valid: expected auto|scalar|avx2|avx512|avx512bf16");
  }
  return static_cast<int>(wanted) < static_cast<int>(detectIsa()) ? wanted : detectIsa();
}

}  // namespace gradcomm::compression
