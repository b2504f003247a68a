#include <array>
#include <string>

#include "base/units.hpp"
#include "gradcomm/error.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm {
namespace {

template <typename Enum, size_t N>
Enum parseEnum(std::string_view name, const std::array<std::pair<const char*, Enum>, N>& table,
               const char* what, const char* valid) {
  std::string lower = core::toLower(core::trim(name));
  for (const auto& [n, v] : table) {
    if (lower == n) return v;
  }
  throw InvalidArgument("unknown " + std::string(what) + " '" + std::string(name) + "'; valid: " + valid);
}

}  // namespace

size_t dataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  throw InvalidArgument("invalid DataType value " + std::to_string(static_cast<int>(type)));
}

bool isFloatingPoint(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 || type == DataType::kFloat16 ||
         type == DataType::kBFloat16;
}

const char* toString(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "invalid-dtype";
}

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "invalid-op";
}

const char* toString(Collective coll) {
  switch (coll) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kAllgather: return "allgather";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kBarrier: return "barrier";
  }
  return "invalid-collective";
}

DataType parseDataType(std::string_view name) {
  static const std::array<std::pair<const char*, DataType>, 20> kTable{{
      {"float32", DataType::kFloat32}, {"float", DataType::kFloat32},     {"fp32", DataType::kFloat32},
      {"f32", DataType::kFloat32},     {"float64", DataType::kFloat64},   {"double", DataType::kFloat64},
      {"fp64", DataType::kFloat64},    {"float16", DataType::kFloat16},   {"half", DataType::kFloat16},
      {"fp16", DataType::kFloat16},    {"bfloat16", DataType::kBFloat16}, {"bf16", DataType::kBFloat16},
      {"int8", DataType::kInt8},       {"uint8", DataType::kUInt8},       {"int32", DataType::kInt32},
      {"int", DataType::kInt32},       {"int64", DataType::kInt64},       {"char", DataType::kInt8},
      {"byte", DataType::kUInt8},      {"long", DataType::kInt64},
  }};
  return parseEnum(name, kTable, "data type",
                   "float32, float64, float16, bfloat16, int8, uint8, int32, int64");
}

ReduceOp parseReduceOp(std::string_view name) {
  static const std::array<std::pair<const char*, ReduceOp>, 6> kTable{{
      {"sum", ReduceOp::kSum},
      {"prod", ReduceOp::kProd},
      {"min", ReduceOp::kMin},
      {"max", ReduceOp::kMax},
      {"avg", ReduceOp::kAvg},
      {"mean", ReduceOp::kAvg},
  }};
  return parseEnum(name, kTable, "reduction op", "sum, prod, min, max, avg");
}

Collective parseCollective(std::string_view name) {
  static const std::array<std::pair<const char*, Collective>, 9> kTable{{
      {"allreduce", Collective::kAllreduce},
      {"broadcast", Collective::kBroadcast},
      {"bcast", Collective::kBroadcast},
      {"reduce", Collective::kReduce},
      {"allgather", Collective::kAllgather},
      {"reducescatter", Collective::kReduceScatter},
      {"reduce_scatter", Collective::kReduceScatter},
      {"reduce-scatter", Collective::kReduceScatter},
      {"barrier", Collective::kBarrier},
  }};
  return parseEnum(name, kTable, "collective",
                   "allreduce, broadcast, reduce, allgather, reducescatter, barrier");
}

}  // namespace gradcomm
