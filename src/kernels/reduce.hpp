#pragma once
#include <cstddef>

#include "gradcomm/types.hpp"
#include "kernels/simd.hpp"

namespace gradcomm::kernels {

/// dst[i] = a[i] OP b[i] for i < n. dst may be the same pointer as a or b.
/// float16/bfloat16 compute in float32 and round once per call.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t n);
/// data[i] = data[i] / divisor (the last step of kAvg), floating types only.
using DivideFn = void (*)(void* data, size_t n, double divisor);

struct ReduceTable {
  ReduceFn reduce[kNumDataTypes][4];  // by opIndex: sum, prod, min, max
  DivideFn divide[kNumDataTypes];     // null for integer types
};

/// Kernel table of one level (see kernels/simd.hpp); entries fall back to
/// lower levels where a level has no specialised code, and kAvx512Bf16 uses
/// the kAvx512 table.
const ReduceTable& reduceTable(SimdLevel level);

/// Kernel for (type, op). kAvg maps to the sum kernel (the division is a
/// separate step); throws UnsupportedError for kAvg on integer types.
ReduceFn reduceFunction(DataType type, ReduceOp op, SimdLevel level);
DivideFn divideFunction(DataType type, SimdLevel level);

/// The column of `op` in ReduceTable::reduce: sum, prod, min, max (kAvg
/// runs the sum kernel; the division is a separate step). Throws
/// InvalidArgument for a value outside the enum.
int opIndex(ReduceOp op);

/// Throws UnsupportedError (a message that says what to do) when the pair is
/// not supported, e.g. kAvg on an integer type.
void checkSupported(DataType type, ReduceOp op);

/// Per-level tables, defined in reduce_{scalar,avx2,avx512}.cpp. The AVX
/// tables are null when the compiler could not build them.
const ReduceTable* scalarTable();
const ReduceTable* avx2Table();
const ReduceTable* avx512Table();

}  // namespace gradcomm::kernels
