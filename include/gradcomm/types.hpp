#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gradcomm/export.hpp"

namespace gradcomm {

/// Element types a collective can carry.
enum class DataType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
};
inline constexpr int kNumDataTypes = 8;

/// Reduction operations. kAvg is a sum divided by the number of ranks and is
/// defined for floating-point types only.
enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };
inline constexpr int kNumReduceOps = 5;

/// The collectives the library implements.
enum class Collective : uint8_t {
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kBarrier,
};
inline constexpr int kNumCollectives = 6;

/// Size of one element in bytes.
GRADCOMM_API size_t dataTypeSize(DataType type);
/// True for float32, float64, float16 and bfloat16.
GRADCOMM_API bool isFloatingPoint(DataType type);
/// Canonical lower-case names ("float32", "sum", "allreduce").
GRADCOMM_API const char* toString(DataType type);
GRADCOMM_API const char* toString(ReduceOp op);
GRADCOMM_API const char* toString(Collective coll);
/// Parse a name (also accepts common aliases such as "fp32", "half", "bf16");
/// throws InvalidArgument listing the valid names.
GRADCOMM_API DataType parseDataType(std::string_view name);
GRADCOMM_API ReduceOp parseReduceOp(std::string_view name);
GRADCOMM_API Collective parseCollective(std::string_view name);

}  // namespace gradcomm
