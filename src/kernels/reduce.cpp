#include "kernels/reduce.hpp"

#include <cpuid.h>

#include <string>

#include "core/units.hpp"
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
  if (avx512 && (xcr0 & 0xE0) == 0xE0) return SimdLevel::kAvx512;  // opmask and ZMM state
  return SimdLevel::kAvx2;
}

const ReduceTable* tableOrNull(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return avx512Table();
    case SimdLevel::kAvx2: return avx2Table();
    case SimdLevel::kScalar: return scalarTable();
  }
  return scalarTable();
}

int opIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return 0;
    case ReduceOp::kProd: return 1;
    case ReduceOp::kMin: return 2;
    case ReduceOp::kMax: return 3;
  }
  throw InvalidArgument("invalid ReduceOp value " + std::to_string(static_cast<int>(op)));
}

}  // namespace

const char* toString(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "?";
}

SimdLevel detectSimd() {
  static const SimdLevel level = detectOnce();
  return level;
}

SimdLevel resolveSimd(const std::string& request) {
  std::string r = core::toLower(request);
  SimdLevel best = detectSimd();
  SimdLevel wanted = best;
  if (r == "scalar") wanted = SimdLevel::kScalar;
  else if (r == "avx2") wanted = SimdLevel::kAvx2;
  else if (r == "avx512") wanted = SimdLevel::kAvx512;
  else if (r != "auto" && !r.empty()) {
    throw ConfigError("GRADCOMM_SIMD='" + request + "' is not valid: expected one of auto|avx512|avx2|scalar");
  }
  return static_cast<int>(wanted) < static_cast<int>(best) ? wanted : best;
}

namespace {

struct Tables {
  ReduceTable level[3];
};

// Tables of levels above the CPU's best are never built: even filling an
// AVX-512 table may execute AVX-512 instructions.
const Tables& tables() {
  static const Tables all = [] {
    Tables out{};
    const int best = static_cast<int>(detectSimd());
    for (int level = 0; level <= best; ++level) {
      out.level[level] = *tableOrNull(static_cast<SimdLevel>(level));
      if (level == 0) continue;
      for (int type = 0; type < kNumDataTypes; ++type) {
        for (int op = 0; op < 4; ++op) {
          if (!out.level[level].reduce[type][op]) out.level[level].reduce[type][op] = out.level[level - 1].reduce[type][op];
        }
        if (!out.level[level].divide[type]) out.level[level].divide[type] = out.level[level - 1].divide[type];
      }
    }
    for (int level = best + 1; level < 3; ++level) out.level[level] = out.level[best];
    return out;
  }();
  return all;
}

}  // namespace

const ReduceTable& reduceTable(SimdLevel level) {
  int index = static_cast<int>(level);
  if (index < 0 || index > 2) index = 0;
  return tables().level[index];
}

void checkSupported(DataType type, ReduceOp op) {
  (void)dataTypeSize(type);  // validates the enum value
  (void)opIndex(op);
  if (op == ReduceOp::kAvg && !isFloatingPoint(type)) {
    throw UnsupportedError(std::string("reduction op avg is not supported for integer type ") + toString(type) +
                           ": an integer average would have to round; use sum and divide, or reduce a "
                           "floating-point type");
  }
}

ReduceFn reduceFunction(DataType type, ReduceOp op, SimdLevel level) {
  checkSupported(type, op);
  ReduceFn fn = reduceTable(level).reduce[static_cast<int>(type)][opIndex(op)];
  if (!fn) throw InternalError(std::string("no reduction kernel for ") + toString(type) + "/" + toString(op));
  return fn;
}

DivideFn divideFunction(DataType type, SimdLevel level) {
  DivideFn fn = reduceTable(level).divide[static_cast<int>(type)];
  if (!fn) throw UnsupportedError(std::string("division is not defined for ") + toString(type));
  return fn;
}

}  // namespace gradcomm::kernels
