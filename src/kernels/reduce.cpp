#include "kernels/reduce.hpp"

#include <algorithm>
#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::kernels {
namespace {

const ReduceTable* tableOrNull(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512Bf16:
    case SimdLevel::kAvx512: return avx512Table();
    case SimdLevel::kAvx2: return avx2Table();
    case SimdLevel::kScalar: return scalarTable();
  }
  return scalarTable();
}

struct Tables {
  ReduceTable level[3];
};

// Tables of levels above the CPU's best are never built: even filling an
// AVX-512 table may execute AVX-512 instructions.
const Tables& tables() {
  static const Tables all = [] {
    Tables out{};
    // The reduction kernels stop at AVX-512 (BF16 conversions add nothing here).
    const int best = std::min(static_cast<int>(detectSimd()), 2);
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

const ReduceTable& reduceTable(SimdLevel level) {
  int index = static_cast<int>(level);
  if (index < 0) index = 0;
  if (index > 2) index = 2;  // kAvx512Bf16 runs the AVX-512 reduction kernels
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
