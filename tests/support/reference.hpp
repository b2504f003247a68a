#pragma once
// Reference semantics for checking collectives: deterministic inputs per
// (seed, rank) and the expected reduction computed element by element in a
// plain, obviously-correct way (not the library's kernels).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gradcomm/types.hpp"
#include "kernels/half.hpp"

namespace gradcomm::testing {

/// One element as a double (integers exactly where they fit).
inline double loadElem(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kFloat16: return kernels::halfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return kernels::bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

/// Fills `count` elements with values for which every reduction order gives
/// the same exact result: small integers for floating types (sums and
/// products stay exactly representable), full-range values for integers
/// (which wrap, and wrapping arithmetic is associative).
inline std::vector<unsigned char> makeInput(DataType t, ReduceOp op, size_t count, uint64_t seed, int rank) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(rank) * 7919ull + 17);
  std::vector<unsigned char> buf(count * dataTypeSize(t) + 1);
  for (size_t i = 0; i < count; ++i) {
    int small = static_cast<int>(rng() % 17) - 8;  // -8..8
    if (op == ReduceOp::kProd) {
      static const int kProd[] = {-2, -1, 1, 2, 1, -1};
      small = kProd[rng() % 6];
    }
    switch (t) {
      case DataType::kFloat32: static_cast<float*>(static_cast<void*>(buf.data()))[i] = static_cast<float>(small); break;
      case DataType::kFloat64: static_cast<double*>(static_cast<void*>(buf.data()))[i] = small; break;
      case DataType::kFloat16:
        static_cast<uint16_t*>(static_cast<void*>(buf.data()))[i] = kernels::floatToHalf(static_cast<float>(small));
        break;
      case DataType::kBFloat16:
        static_cast<uint16_t*>(static_cast<void*>(buf.data()))[i] = kernels::floatToBf16(static_cast<float>(small));
        break;
      case DataType::kInt8: static_cast<int8_t*>(static_cast<void*>(buf.data()))[i] = static_cast<int8_t>(rng()); break;
      case DataType::kUInt8: static_cast<uint8_t*>(static_cast<void*>(buf.data()))[i] = static_cast<uint8_t>(rng()); break;
      case DataType::kInt32: static_cast<int32_t*>(static_cast<void*>(buf.data()))[i] = static_cast<int32_t>(rng()); break;
      case DataType::kInt64: static_cast<int64_t*>(static_cast<void*>(buf.data()))[i] = static_cast<int64_t>(rng()); break;
    }
  }
  buf.resize(count * dataTypeSize(t));
  return buf;
}

template <typename U> inline U wrapApply(ReduceOp op, U a, U b) {
  switch (op) {
    case ReduceOp::kSum: return static_cast<U>(a + b);
    case ReduceOp::kProd: return static_cast<U>(a * b);
    default: return a;
  }
}

/// Expected result of reducing `inputs` (one buffer per rank) with `op`,
/// written in the element type.
inline std::vector<unsigned char> reduceReference(DataType t, ReduceOp op,
                                                  const std::vector<std::vector<unsigned char>>& inputs, size_t count) {
  const int n = static_cast<int>(inputs.size());
  std::vector<unsigned char> out(count * dataTypeSize(t));
  for (size_t i = 0; i < count; ++i) {
    if (!isFloatingPoint(t)) {
      // Integers: wrapping arithmetic in 64 bits, then truncate.
      uint64_t acc = 0;
      int64_t mn = 0, mx = 0;
      for (int r = 0; r < n; ++r) {
        int64_t v = static_cast<int64_t>(loadElem(t, inputs[r].data(), i));
        if (t == DataType::kInt64) std::memcpy(&v, inputs[r].data() + i * 8, 8);
        if (r == 0) {
          acc = static_cast<uint64_t>(v);
          mn = mx = v;
          continue;
        }
        if (op == ReduceOp::kSum) acc += static_cast<uint64_t>(v);
        if (op == ReduceOp::kProd) acc *= static_cast<uint64_t>(v);
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
      }
      uint64_t res = op == ReduceOp::kMin ? static_cast<uint64_t>(mn) : op == ReduceOp::kMax ? static_cast<uint64_t>(mx) : acc;
      std::memcpy(out.data() + i * dataTypeSize(t), &res, dataTypeSize(t));  // little endian truncation
      continue;
    }
    double acc = 0;
    bool nan = false;
    for (int r = 0; r < n; ++r) {
      double v = loadElem(t, inputs[r].data(), i);
      nan = nan || std::isnan(v);
      if (r == 0) {
        acc = v;
      } else if (op == ReduceOp::kSum || op == ReduceOp::kAvg) {
        acc += v;
      } else if (op == ReduceOp::kProd) {
        acc *= v;
      } else if (op == ReduceOp::kMin) {
        acc = v < acc ? v : acc;
      } else if (op == ReduceOp::kMax) {
        acc = v > acc ? v : acc;
      }
    }
    if (nan && (op == ReduceOp::kMin || op == ReduceOp::kMax)) acc = std::nan("");
    switch (t) {
      case DataType::kFloat64: {
        double v = op == ReduceOp::kAvg ? acc / n : acc;
        std::memcpy(out.data() + i * 8, &v, 8);
        break;
      }
      case DataType::kFloat32: {
        float v = op == ReduceOp::kAvg ? static_cast<float>(acc) / static_cast<float>(n) : static_cast<float>(acc);
        std::memcpy(out.data() + i * 4, &v, 4);
        break;
      }
      case DataType::kFloat16:
      case DataType::kBFloat16: {
        float v = op == ReduceOp::kAvg ? static_cast<float>(acc) / static_cast<float>(n) : static_cast<float>(acc);
        uint16_t h = t == DataType::kFloat16 ? kernels::floatToHalf(v) : kernels::floatToBf16(v);
        std::memcpy(out.data() + i * 2, &h, 2);
        break;
      }
      default: break;
    }
  }
  return out;
}

/// Index of the first element that differs (NaN equals NaN), or -1.
inline long long firstDifference(DataType t, const void* got, const void* want, size_t count) {
  const size_t e = dataTypeSize(t);
  for (size_t i = 0; i < count; ++i) {
    if (isFloatingPoint(t)) {
      double a = loadElem(t, got, i), b = loadElem(t, want, i);
      if (std::isnan(a) && std::isnan(b)) continue;
      if (std::memcmp(static_cast<const char*>(got) + i * e, static_cast<const char*>(want) + i * e, e) != 0) {
        return static_cast<long long>(i);
      }
    } else if (std::memcmp(static_cast<const char*>(got) + i * e, static_cast<const char*>(want) + i * e, e) != 0) {
      return static_cast<long long>(i);
    }
  }
  return -1;
}

inline std::vector<DataType> allTypes() {
  return {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
          DataType::kInt8,    DataType::kUInt8,   DataType::kInt32,   DataType::kInt64};
}
inline std::vector<ReduceOp> allOps() {
  return {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};
}
inline bool supported(DataType t, ReduceOp op) { return op != ReduceOp::kAvg || isFloatingPoint(t); }

}  // namespace gradcomm::testing
