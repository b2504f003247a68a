// CPU reduction kernels at every SIMD level this CPU has, against a plain
// reference, for every type and op, with special values; and the
// float16/bfloat16 conversions against an independent brute-force rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gradcomm/error.hpp"
#include "kernels/half.hpp"
#include "kernels/reduce.hpp"
#include "support/reference.hpp"

using namespace gradcomm;
using namespace gradcomm::kernels;
using gradcomm::testing::allOps;
using gradcomm::testing::allTypes;

namespace {

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> v{SimdLevel::kScalar};
  if (detectSimd() >= SimdLevel::kAvx2) v.push_back(SimdLevel::kAvx2);
  if (detectSimd() >= SimdLevel::kAvx512) v.push_back(SimdLevel::kAvx512);
  return v;
}

// Value of half bits as double; all 65536 encodings.
double halfValue(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double sign = (h & 0x8000) ? -1 : 1;
  if (e == 31) return m ? std::nan("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// Round `x` to the nearest finite half by search (ties to even mantissa),
// overflow to infinity at 65520 and beyond: the IEEE definition, computed in
// a different way than the library.
uint16_t referenceHalf(float f) {
  if (std::isnan(f)) return 0x7E00;
  double x = std::fabs(static_cast<double>(f));
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (x >= 65520.0) return sign | 0x7C00;
  // Finite non-negative halves are ordered like their encodings 0..0x7BFF.
  uint16_t lo = 0, hi = 0x7BFF;
  while (lo < hi) {  // first encoding with value >= x
    uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (halfValue(mid) < x) lo = static_cast<uint16_t>(mid + 1); else hi = mid;
  }
  uint16_t up = lo, down = lo > 0 ? static_cast<uint16_t>(lo - 1) : 0;
  double dUp = halfValue(up) - x, dDown = x - halfValue(down);
  uint16_t pick = dDown < dUp ? down : dUp < dDown ? up : ((down & 1) ? up : down);
  if (halfValue(up) < x) pick = up;  // x above the largest finite (rounds down)
  return sign | pick;
}

uint16_t referenceBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t lower = u & 0xFFFF, upper = u >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) ++upper;
  return static_cast<uint16_t>(upper);
}

float randomFloat(std::mt19937& rng) {
  // Mix of ranges: normal halves, subnormal halves, huge, tiny, exact ties.
  std::uniform_int_distribution<uint32_t> bits;
  switch (rng() % 4) {
    case 0: { uint32_t u = bits(rng); float f; std::memcpy(&f, &u, 4); return f; }
    case 1: return std::ldexp(static_cast<float>(rng() % 2048), -static_cast<int>(rng() % 40));
    case 2: return static_cast<float>(static_cast<int>(rng() % 200000) - 100000) / 3.0f;
    default: {
      // A value exactly halfway between two halves.
      uint16_t h = static_cast<uint16_t>(rng() % 0x7BFF);
      return static_cast<float>((halfValue(h) + halfValue(static_cast<uint16_t>(h + 1))) / 2);
    }
  }
}

}  // namespace

TEST(HalfConversion, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = halfToFloat(static_cast<uint16_t>(h));
    double want = halfValue(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(f)))) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << "half bits " << h;
    ASSERT_EQ(floatToHalf(f), h) << "half bits " << h;
  }
}

TEST(HalfConversion, FloatToHalfRoundsToNearestEvenLikeTheDefinition) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) {
    float f = randomFloat(rng);
    uint16_t got = floatToHalf(f), want = referenceHalf(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(halfToFloat(got)));
      continue;
    }
    ASSERT_EQ(got, want) << "float " << f;
  }
  EXPECT_EQ(floatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(floatToHalf(65519.99f), 0x7BFF);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7C00);   // overflow rounds to infinity
  EXPECT_EQ(floatToHalf(-1e30f), 0xFC00);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // tie to even: 2
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
}

TEST(Bf16Conversion, RoundsToNearestEvenAndKeepsSpecials) {
  std::mt19937 rng(99);
  for (int i = 0; i < 200000; ++i) {
    float f = randomFloat(rng);
    uint16_t got = floatToBf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16ToFloat(got)));
      continue;
    }
    ASSERT_EQ(got, referenceBf16(f)) << f;
  }
  EXPECT_EQ(floatToBf16(INFINITY), 0x7F80);
  EXPECT_EQ(floatToBf16(-INFINITY), 0xFF80);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::nanf("")))));
}

// Inputs for kernel tests: random values plus NaN, +-inf, +-0 and (for the
// half types) subnormals and values that overflow in the result.
std::vector<unsigned char> kernelInput(DataType t, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> b(n * dataTypeSize(t));
  for (size_t i = 0; i < n; ++i) {
    float f = static_cast<float>(static_cast<int>(rng() % 20001) - 10000) / 64.0f;
    switch (rng() % 16) {
      case 0: f = std::nanf(""); break;
      case 1: f = INFINITY; break;
      case 2: f = -INFINITY; break;
      case 3: f = -0.0f; break;
      case 4: f = 0.0f; break;
      case 5: f = std::ldexp(1.0f, -20); break;  // subnormal in half
      case 6: f = 60000.0f; break;               // sums overflow half
      default: break;
    }
    void* p = b.data();
    switch (t) {
      case DataType::kFloat32: static_cast<float*>(p)[i] = f; break;
      case DataType::kFloat64: static_cast<double*>(p)[i] = static_cast<double>(f) + 1e-12 * static_cast<double>(rng() % 1000); break;
      case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = floatToHalf(f); break;
      case DataType::kBFloat16: static_cast<uint16_t*>(p)[i] = floatToBf16(f); break;
      case DataType::kInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(rng()); break;
      case DataType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(rng()); break;
      case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(rng()); break;
      case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>((static_cast<uint64_t>(rng()) << 32) | rng()); break;
    }
  }
  return b;
}

// Plain scalar semantics of one element: the documented contract.
template <typename T> T refOp(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b))) ? (std::isnan(static_cast<double>(a)) ? a : b) : (a < b ? a : b);
    case ReduceOp::kMax: return (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b))) ? (std::isnan(static_cast<double>(a)) ? a : b) : (a > b ? a : b);
  }
  return a;
}

template <typename U> U refInt(ReduceOp op, U a, U b, bool isSigned, int bits) {
  auto sx = [&](U v) {  // sign-extended value for comparisons
    if (!isSigned) return static_cast<int64_t>(v);
    uint64_t w = v;
    return static_cast<int64_t>(w << (64 - bits)) >> (64 - bits);
  };
  switch (op) {
    case ReduceOp::kSum: return static_cast<U>(a + b);
    case ReduceOp::kProd: return static_cast<U>(a * b);
    case ReduceOp::kMin: return sx(a) < sx(b) ? a : b;
    case ReduceOp::kMax: return sx(a) > sx(b) ? a : b;
    default: return a;
  }
}

void expectKernelMatches(SimdLevel level, DataType t, ReduceOp op, size_t n) {
  auto a = kernelInput(t, n, 11 + static_cast<uint32_t>(n));
  auto b = kernelInput(t, n, 23 + static_cast<uint32_t>(n));
  std::vector<unsigned char> got(a.size() + 64, 0xCD);
  reduceFunction(t, op, level)(got.data(), a.data(), b.data(), n);
  for (size_t k = a.size(); k < got.size(); ++k) ASSERT_EQ(got[k], 0xCD) << "kernel wrote past the end";
  for (size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(std::string(toString(level)) + " " + toString(t) + " " + toString(op) + " n=" + std::to_string(n) +
                 " i=" + std::to_string(i));
    const void* pa = a.data();
    const void* pb = b.data();
    const void* pg = got.data();
    switch (t) {
      case DataType::kFloat32: {
        float want = refOp(op, static_cast<const float*>(pa)[i], static_cast<const float*>(pb)[i]);
        float g = static_cast<const float*>(pg)[i];
        if (std::isnan(want)) ASSERT_TRUE(std::isnan(g)); else ASSERT_EQ(std::memcmp(&g, &want, 4), 0) << g << " vs " << want;
        break;
      }
      case DataType::kFloat64: {
        double want = refOp(op, static_cast<const double*>(pa)[i], static_cast<const double*>(pb)[i]);
        double g = static_cast<const double*>(pg)[i];
        if (std::isnan(want)) ASSERT_TRUE(std::isnan(g)); else ASSERT_EQ(std::memcmp(&g, &want, 8), 0) << g << " vs " << want;
        break;
      }
      case DataType::kFloat16:
      case DataType::kBFloat16: {
        bool half = t == DataType::kFloat16;
        auto toF = [&](uint16_t v) { return half ? halfToFloat(v) : bf16ToFloat(v); };
        float x = toF(static_cast<const uint16_t*>(pa)[i]), y = toF(static_cast<const uint16_t*>(pb)[i]);
        float r = refOp(op, x, y);
        uint16_t want = half ? referenceHalf(r) : referenceBf16(r);
        uint16_t g = static_cast<const uint16_t*>(pg)[i];
        if (std::isnan(r)) ASSERT_TRUE(std::isnan(toF(g))); else ASSERT_EQ(g, want) << x << " op " << y;
        break;
      }
      case DataType::kInt8:
        ASSERT_EQ(static_cast<uint8_t>(static_cast<const int8_t*>(pg)[i]),
                  refInt<uint8_t>(op, static_cast<const uint8_t*>(pa)[i], static_cast<const uint8_t*>(pb)[i], true, 8));
        break;
      case DataType::kUInt8:
        ASSERT_EQ(static_cast<const uint8_t*>(pg)[i],
                  refInt<uint8_t>(op, static_cast<const uint8_t*>(pa)[i], static_cast<const uint8_t*>(pb)[i], false, 8));
        break;
      case DataType::kInt32:
        ASSERT_EQ(static_cast<const uint32_t*>(pg)[i],
                  refInt<uint32_t>(op, static_cast<const uint32_t*>(pa)[i], static_cast<const uint32_t*>(pb)[i], true, 32));
        break;
      case DataType::kInt64:
        ASSERT_EQ(static_cast<const uint64_t*>(pg)[i],
                  refInt<uint64_t>(op, static_cast<const uint64_t*>(pa)[i], static_cast<const uint64_t*>(pb)[i], true, 64));
        break;
    }
  }
}

TEST(ReduceKernels, EveryLevelTypeAndOpMatchesTheReference) {
  for (SimdLevel level : levels()) {
    for (DataType t : allTypes()) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1000}, size_t{4099}}) {
          expectKernelMatches(level, t, op, n);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(ReduceKernels, InPlaceAliasingIsAllowed) {
  for (SimdLevel level : levels()) {
    std::vector<float> a(1000), b(1000);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(i);
      b[i] = 2.0f * static_cast<float>(i);
    }
    reduceFunction(DataType::kFloat32, ReduceOp::kSum, level)(a.data(), a.data(), b.data(), a.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], 3.0f * static_cast<float>(i)) << toString(level);
  }
}

TEST(ReduceKernels, MinMaxPropagateNaNFromEitherSide) {
  for (SimdLevel level : levels()) {
    for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        // 40 elements: NaN on the left in even slots, on the right in odd.
        const size_t n = 40;
        std::vector<double> x(n, 1.0), y(n, 2.0);
        for (size_t i = 0; i < n; i += 2) x[i] = NAN;
        for (size_t i = 1; i < n; i += 4) y[i] = NAN;
        std::vector<unsigned char> a(n * dataTypeSize(t)), b(a.size()), out(a.size());
        for (size_t i = 0; i < n; ++i) {
          float fx = static_cast<float>(x[i]), fy = static_cast<float>(y[i]);
          switch (t) {
            case DataType::kFloat32: reinterpret_cast<float*>(a.data())[i] = fx; reinterpret_cast<float*>(b.data())[i] = fy; break;
            case DataType::kFloat64: reinterpret_cast<double*>(a.data())[i] = x[i]; reinterpret_cast<double*>(b.data())[i] = y[i]; break;
            case DataType::kFloat16: reinterpret_cast<uint16_t*>(a.data())[i] = floatToHalf(fx); reinterpret_cast<uint16_t*>(b.data())[i] = floatToHalf(fy); break;
            default: reinterpret_cast<uint16_t*>(a.data())[i] = floatToBf16(fx); reinterpret_cast<uint16_t*>(b.data())[i] = floatToBf16(fy); break;
          }
        }
        reduceFunction(t, op, level)(out.data(), a.data(), b.data(), n);
        for (size_t i = 0; i < n; ++i) {
          bool wantNan = std::isnan(x[i]) || std::isnan(y[i]);
          double g = gradcomm::testing::loadElem(t, out.data(), i);
          EXPECT_EQ(std::isnan(g), wantNan) << toString(level) << " " << toString(t) << " " << toString(op) << " i=" << i;
          if (!wantNan) EXPECT_EQ(g, op == ReduceOp::kMin ? 1.0 : 2.0);
        }
      }
    }
  }
}

TEST(ReduceKernels, DivideMatchesScalarDivisionForFloatTypes) {
  for (SimdLevel level : levels()) {
    std::vector<float> f(37);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 1.7f - 20.0f;
    auto g = f;
    divideFunction(DataType::kFloat32, level)(g.data(), g.size(), 3.0);
    for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(g[i], f[i] / 3.0f);
    std::vector<uint16_t> h(37);
    for (size_t i = 0; i < h.size(); ++i) h[i] = floatToHalf(f[i]);
    auto hh = h;
    divideFunction(DataType::kFloat16, level)(hh.data(), hh.size(), 7.0);
    for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(hh[i], floatToHalf(halfToFloat(h[i]) / 7.0f));
  }
}

TEST(ReduceKernels, AvgOnIntegersIsRejectedWithAClearMessage) {
  try {
    reduceFunction(DataType::kInt32, ReduceOp::kAvg, SimdLevel::kScalar);
    FAIL() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("avg is not supported for integer type int32"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(reduceFunction(DataType::kFloat16, ReduceOp::kAvg, SimdLevel::kScalar));
}

TEST(SimdDispatch, RequestsAreClampedToTheCpu) {
  EXPECT_EQ(resolveSimd("scalar"), SimdLevel::kScalar);
  EXPECT_EQ(resolveSimd("auto"), detectSimd());
  EXPECT_LE(static_cast<int>(resolveSimd("avx512")), static_cast<int>(detectSimd()));
  EXPECT_THROW(resolveSimd("sse9"), ConfigError);
}
