#pragma once
// Reference semantics of the compression kernels, computed a different way
// than the library (rounding on a double grid, brute-force sorting), and
// test inputs rich in special values. Shared by the CPU and CUDA tests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compression/sparse_tensor.hpp"

namespace gradcomm::testing {

/// dense[indices[i]] += values[i] for i < nnz (the indices in range).
template <typename IndexT>
void scatterAddReference(float* dense, const IndexT* indices, const float* values, size_t nnz) {
  for (size_t i = 0; i < nnz; ++i) dense[indices[i]] += values[i];
}

/// Adds a top-k selection into dense[s.denseCount].
inline void scatterAddReference(float* dense, const compression::SparseTensor& s) {
  for (size_t i = 0; i < s.nnz(); ++i) dense[s.index(i)] += s.values[i];
}

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Seed of the randomised compression tests: GRADCOMM_TEST_SEED, or a fixed
/// default; printed so that a failure can be replayed.
inline uint64_t compressionSeed(const char* test) {
  static const uint64_t seed = [] {
    const char* env = std::getenv("GRADCOMM_TEST_SEED");
    return env ? std::strtoull(env, nullptr, 0) : uint64_t{20240611};
  }();
  std::printf("[   seed   ] %s: GRADCOMM_TEST_SEED=%llu\n", test, static_cast<unsigned long long>(seed));
  return seed;
}

// x rounded to a multiple of `ulp` (a power of two), ties to even, in double:
// every float and every such multiple below 2^1000 is exact in double.
inline double roundToGrid(double x, double ulp) { return std::nearbyint(x / ulp) * ulp; }

/// fp16 of compression: round to nearest even, finite values beyond 65504
/// saturate, inf stays inf, NaN stays NaN with its payload truncated.
inline uint16_t refHalf(float f) {
  const uint32_t u = bitsOf(f);
  const uint16_t sign = (u >> 16) & 0x8000;
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7E00 | ((u >> 13) & 0x3FF));
  if (std::isinf(f)) return static_cast<uint16_t>(sign | 0x7C00);
  const double x = std::fabs(static_cast<double>(f));
  if (x >= 65504.0) return static_cast<uint16_t>(sign | 0x7BFF);
  const double ulp = x < std::ldexp(1.0, -14) ? std::ldexp(1.0, -24) : std::ldexp(1.0, std::ilogb(x) - 10);
  const double v = roundToGrid(x, ulp);
  if (v == 0) return sign;
  if (v < std::ldexp(1.0, -14)) return static_cast<uint16_t>(sign | static_cast<uint16_t>(v / std::ldexp(1.0, -24)));
  if (v >= 65520.0) return static_cast<uint16_t>(sign | 0x7BFF);  // unreachable: 65504 is on the grid
  const int e = std::ilogb(v);
  const int mantissa = static_cast<int>(v / std::ldexp(1.0, e - 10)) - 1024;
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | mantissa);
}

/// bf16: IEEE round to nearest even (overflow to inf), NaN quiet with the
/// upper payload kept.
inline uint16_t refBf16(float f) {
  const uint32_t u = bitsOf(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040);
  const uint16_t sign = (u >> 16) & 0x8000;
  if (std::isinf(f)) return static_cast<uint16_t>(sign | 0x7F80);
  const double x = std::fabs(static_cast<double>(f));
  if (x == 0) return sign;
  const double ulp = x < std::ldexp(1.0, -126) ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(x) - 7);
  const double v = roundToGrid(x, ulp);
  if (v >= std::ldexp(1.0, 128)) return static_cast<uint16_t>(sign | 0x7F80);
  return static_cast<uint16_t>(sign | (bitsOf(static_cast<float>(v)) >> 16));
}

/// Exact value of half bits; a NaN comes back quiet (as F16C gives it).
inline float refHalfValue(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  if (e == 31) return floatOf(sign | 0x7F800000u | (m ? 0x00400000u : 0u) | (static_cast<uint32_t>(m) << 13));
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return floatOf(sign | bitsOf(static_cast<float>(v)));
}

inline float refBf16Value(uint16_t h) { return floatOf(static_cast<uint32_t>(h) << 16); }

inline uint16_t refEncode(bool fp16, float f) { return fp16 ? refHalf(f) : refBf16(f); }
inline float refDecode(bool fp16, uint16_t h) { return fp16 ? refHalfValue(h) : refBf16Value(h); }

/// The documented residual: (t*s - d)/s with one fused multiply-add for the
/// numerator (t - d when s == 1), 0 where not finite.
inline float refResidual(float t, float s, float d) {
  const float r = s == 1.0f ? t - d : std::fma(t, s, -d) / s;
  return std::isfinite(r) ? r : 0.0f;
}

/// Floats that stress conversions: NaNs with payloads, infinities, zeros,
/// float subnormals, fp16 subnormals and boundaries, exact ties for both
/// formats, values near FLT_MAX.
inline std::vector<float> specialFloats() {
  std::vector<float> v = {
      0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 65504.0f, -65504.0f, 65519.99f, 65520.0f, -65520.0f, 70000.0f, 1e6f, -1e30f,
      std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
      std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(), 1e-40f, -3e-39f,
      floatOf(0x007FFFFF), floatOf(0x807FFFFF), floatOf(0x00008000), floatOf(0x00018000),
      std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -25), std::ldexp(1.0f, -26),
      std::ldexp(1.5f, -20), 6.0e-8f, 1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11),  // fp16 ties
      floatOf(0x3F808000), floatOf(0x3F818000), floatOf(0x3F80C000), floatOf(0x7F7F8000), floatOf(0x7F7F7FFF),  // bf16 ties
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), floatOf(0x7F812345),
      floatOf(0xFFBFFFFF), floatOf(0x7F800001)};
  return v;
}

/// n floats: a random mix of random bit patterns, ordinary values, values
/// halfway between fp16 neighbours and the special values above.
inline std::vector<float> mixedFloats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<float> specials = specialFloats();
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (rng() % 6) {
      case 0: v[i] = floatOf(static_cast<uint32_t>(rng())); break;
      case 1: v[i] = specials[rng() % specials.size()]; break;
      case 2: {
        const uint16_t h = static_cast<uint16_t>(rng() % 0x7BFF);
        v[i] = static_cast<float>((static_cast<double>(refHalfValue(h)) + refHalfValue(static_cast<uint16_t>(h + 1))) / 2);
        break;
      }
      case 3: v[i] = static_cast<float>(std::ldexp(static_cast<double>(rng() % 100000) - 50000, -static_cast<int>(rng() % 60))); break;
      default: v[i] = std::normal_distribution<float>(0.0f, 3.0f)(rng); break;
    }
  }
  return v;
}

/// Magnitude order of top-k: larger |x| first (NaN above inf), then lower index.
inline uint32_t magnitudeKey(float f) { return bitsOf(f) & 0x7FFFFFFFu; }

/// Indices of the top k of t by brute-force sorting, in increasing order.
inline std::vector<uint64_t> bruteForceTopK(const std::vector<float>& t, size_t k) {
  std::vector<uint64_t> order(t.size());
  for (size_t i = 0; i < t.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) {
    const uint32_t ka = magnitudeKey(t[a]), kb = magnitudeKey(t[b]);
    return ka != kb ? ka > kb : a < b;
  });
  order.resize(std::min(k, order.size()));
  std::sort(order.begin(), order.end());
  return order;
}

/// Empty when `selected` (increasing indices) is a top-c set of t: every
/// selected element ranks above every unselected one. Otherwise says why.
inline std::string topSetViolation(const std::vector<float>& t, const std::vector<uint64_t>& selected) {
  std::vector<char> chosen(t.size(), 0);
  for (size_t i = 0; i < selected.size(); ++i) {
    if (selected[i] >= t.size()) return "index " + std::to_string(selected[i]) + " out of range";
    if (i > 0 && selected[i] <= selected[i - 1]) return "indices not strictly increasing at " + std::to_string(i);
    chosen[selected[i]] = 1;
  }
  // Weakest selected and strongest unselected in (key desc, index asc) order.
  bool haveSel = false, haveUnsel = false;
  uint32_t selKey = 0, unselKey = 0;
  uint64_t selIdx = 0, unselIdx = 0;
  for (uint64_t i = 0; i < t.size(); ++i) {
    const uint32_t key = magnitudeKey(t[i]);
    if (chosen[i]) {
      if (!haveSel || key < selKey || (key == selKey && i > selIdx)) selKey = key, selIdx = i, haveSel = true;
    } else if (!haveUnsel || key > unselKey) {
      unselKey = key, unselIdx = i, haveUnsel = true;
    }
  }
  if (!haveSel || !haveUnsel) return "";
  if (selKey > unselKey || (selKey == unselKey && selIdx < unselIdx)) return "";
  return "selected element " + std::to_string(selIdx) + " ranks below unselected " + std::to_string(unselIdx);
}

}  // namespace gradcomm::testing
