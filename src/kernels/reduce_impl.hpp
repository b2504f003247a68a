// Reduction kernels, compiled once per SIMD level. Include this from exactly
// one translation unit per level (reduce_scalar.cpp, reduce_avx2.cpp,
// reduce_avx512.cpp), each built with its own -m flags. Everything here has
// internal linkage so the variants can never be merged by the linker.
#include <cstddef>
#include <cstdint>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/half.hpp"
#include "kernels/reduce.hpp"

namespace gradcomm::kernels {
namespace {

// ---- scalar element operations ---------------------------------------------

// Integer sum and product wrap around (two's complement), computed in the
// unsigned type so that overflow is defined behaviour.
template <typename T> struct Unsigned { using type = T; };
template <> struct Unsigned<int8_t> { using type = uint8_t; };
template <> struct Unsigned<int32_t> { using type = uint32_t; };
template <> struct Unsigned<int64_t> { using type = uint64_t; };
template <> struct Unsigned<uint8_t> { using type = uint32_t; };  // avoid int promotion surprises

struct OpSum {
  template <typename T> static inline T apply(T a, T b) {
    using U = typename Unsigned<T>::type;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
  static inline float apply(float a, float b) { return a + b; }
  static inline double apply(double a, double b) { return a + b; }
};
struct OpProd {
  template <typename T> static inline T apply(T a, T b) {
    using U = typename Unsigned<T>::type;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  }
  static inline float apply(float a, float b) { return a * b; }
  static inline double apply(double a, double b) { return a * b; }
};
// min/max propagate NaN: if either operand is NaN the result is NaN.
struct OpMin {
  template <typename T> static inline T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};
struct OpMax {
  template <typename T> static inline T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};

template <typename T, typename Op>
void reduceLoop(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = Op::apply(x[i], y[i]);
}

template <typename T>
void divideLoop(void* data, size_t n, double divisor) {
  T* d = static_cast<T*>(data);
  const T div = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) d[i] = d[i] / div;
}

struct HalfScalar {
  static inline float load(uint16_t v) { return halfToFloat(v); }
  static inline uint16_t store(float v) { return floatToHalf(v); }
};
struct Bf16Scalar {
  static inline float load(uint16_t v) { return bf16ToFloat(v); }
  static inline uint16_t store(float v) { return floatToBf16(v); }
};

template <typename Conv, typename Op>
inline void reduceConvertedTail(uint16_t* d, const uint16_t* x, const uint16_t* y, size_t i, size_t n) {
  for (; i < n; ++i) d[i] = Conv::store(Op::apply(Conv::load(x[i]), Conv::load(y[i])));
}

template <typename Conv>
inline void divideConvertedTail(uint16_t* d, size_t i, size_t n, float div) {
  for (; i < n; ++i) d[i] = Conv::store(Conv::load(d[i]) / div);
}

// ---- vector code -------------------------------------------------------------

#if defined(__AVX512F__)
struct VecF32 {
  using T = float;
  using V = __m512;
  static constexpr size_t kWidth = 16;
  static V load(const T* p) { return _mm512_loadu_ps(p); }
  static void store(T* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V set1(T v) { return _mm512_set1_ps(v); }
  static V keepNan(V r, V a) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), r, a); }
  static V min(V a, V b) { return keepNan(_mm512_min_ps(a, b), a); }
  static V max(V a, V b) { return keepNan(_mm512_max_ps(a, b), a); }
};
struct VecF64 {
  using T = double;
  using V = __m512d;
  static constexpr size_t kWidth = 8;
  static V load(const T* p) { return _mm512_loadu_pd(p); }
  static void store(T* p, V v) { _mm512_storeu_pd(p, v); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V div(V a, V b) { return _mm512_div_pd(a, b); }
  static V set1(T v) { return _mm512_set1_pd(v); }
  static V keepNan(V r, V a) { return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), r, a); }
  static V min(V a, V b) { return keepNan(_mm512_min_pd(a, b), a); }
  static V max(V a, V b) { return keepNan(_mm512_max_pd(a, b), a); }
};
// 16 half-precision values <-> one float vector.
struct ConvHalf : HalfScalar {
  static constexpr size_t kWidth = 16;
  static __m512 loadVec(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void storeVec(uint16_t* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};
struct ConvBf16 : Bf16Scalar {
  static constexpr size_t kWidth = 16;
  static __m512 loadVec(const uint16_t* p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static void storeVec(uint16_t* p, __m512 v) {
    __m512i bits = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i result = _mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded, quiet), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(result));
  }
};
#elif defined(__AVX2__)
struct VecF32 {
  using T = float;
  using V = __m256;
  static constexpr size_t kWidth = 8;
  static V load(const T* p) { return _mm256_loadu_ps(p); }
  static void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V set1(T v) { return _mm256_set1_ps(v); }
  static V keepNan(V r, V a) { return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)); }
  static V min(V a, V b) { return keepNan(_mm256_min_ps(a, b), a); }
  static V max(V a, V b) { return keepNan(_mm256_max_ps(a, b), a); }
};
struct VecF64 {
  using T = double;
  using V = __m256d;
  static constexpr size_t kWidth = 4;
  static V load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V div(V a, V b) { return _mm256_div_pd(a, b); }
  static V set1(T v) { return _mm256_set1_pd(v); }
  static V keepNan(V r, V a) { return _mm256_blendv_pd(r, a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q)); }
  static V min(V a, V b) { return keepNan(_mm256_min_pd(a, b), a); }
  static V max(V a, V b) { return keepNan(_mm256_max_pd(a, b), a); }
};
struct ConvHalf : HalfScalar {
  static constexpr size_t kWidth = 8;
  static __m256 loadVec(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void storeVec(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};
struct ConvBf16 : Bf16Scalar {
  static constexpr size_t kWidth = 8;
  static __m256 loadVec(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static void storeVec(uint16_t* p, __m256 v) {
    __m256i bits = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m256i result = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
    // packus works within 128-bit lanes; gather the two halves afterwards.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};
#else
#endif

#if defined(__AVX2__) || defined(__AVX512F__)
struct VSum { template <class W, class V> static V vec(V a, V b) { return W::add(a, b); } using Scalar = OpSum; };
struct VProd { template <class W, class V> static V vec(V a, V b) { return W::mul(a, b); } using Scalar = OpProd; };
struct VMin { template <class W, class V> static V vec(V a, V b) { return W::min(a, b); } using Scalar = OpMin; };
struct VMax { template <class W, class V> static V vec(V a, V b) { return W::max(a, b); } using Scalar = OpMax; };

template <typename W, typename VOp>
void reduceVec(void* dst, const void* a, const void* b, size_t n) {
  using T = typename W::T;
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  size_t i = 0;
  for (; i + 2 * W::kWidth <= n; i += 2 * W::kWidth) {
    auto r0 = VOp::template vec<W>(W::load(x + i), W::load(y + i));
    auto r1 = VOp::template vec<W>(W::load(x + i + W::kWidth), W::load(y + i + W::kWidth));
    W::store(d + i, r0);
    W::store(d + i + W::kWidth, r1);
  }
  for (; i < n; ++i) d[i] = VOp::Scalar::apply(x[i], y[i]);
}

template <typename W>
void divideVec(void* data, size_t n, double divisor) {
  using T = typename W::T;
  T* d = static_cast<T*>(data);
  const auto div = W::set1(static_cast<T>(divisor));
  size_t i = 0;
  for (; i + W::kWidth <= n; i += W::kWidth) W::store(d + i, W::div(W::load(d + i), div));
  for (; i < n; ++i) d[i] = d[i] / static_cast<T>(divisor);
}

template <typename Conv, typename VOp>
void reduceConverted(void* dst, const void* a, const void* b, size_t n) {
  using W = VecF32;
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + Conv::kWidth <= n; i += Conv::kWidth) {
    Conv::storeVec(d + i, VOp::template vec<W>(Conv::loadVec(x + i), Conv::loadVec(y + i)));
  }
  reduceConvertedTail<Conv, typename VOp::Scalar>(d, x, y, i, n);
}

template <typename Conv>
void divideConverted(void* data, size_t n, double divisor) {
  uint16_t* d = static_cast<uint16_t*>(data);
  const auto div = VecF32::set1(static_cast<float>(divisor));
  size_t i = 0;
  for (; i + Conv::kWidth <= n; i += Conv::kWidth) {
    Conv::storeVec(d + i, VecF32::div(Conv::loadVec(d + i), div));
  }
  divideConvertedTail<Conv>(d, i, n, static_cast<float>(divisor));
}

template <typename W>
void fillFloat(ReduceTable& t, DataType type) {
  int k = static_cast<int>(type);
  t.reduce[k][0] = &reduceVec<W, VSum>;
  t.reduce[k][1] = &reduceVec<W, VProd>;
  t.reduce[k][2] = &reduceVec<W, VMin>;
  t.reduce[k][3] = &reduceVec<W, VMax>;
  t.divide[k] = &divideVec<W>;
}

template <typename Conv>
void fillConverted(ReduceTable& t, DataType type) {
  int k = static_cast<int>(type);
  t.reduce[k][0] = &reduceConverted<Conv, VSum>;
  t.reduce[k][1] = &reduceConverted<Conv, VProd>;
  t.reduce[k][2] = &reduceConverted<Conv, VMin>;
  t.reduce[k][3] = &reduceConverted<Conv, VMax>;
  t.divide[k] = &divideConverted<Conv>;
}
#endif

template <typename Conv, typename Op>
void reduceConvertedScalar(void* dst, const void* a, const void* b, size_t n) {
  reduceConvertedTail<Conv, Op>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                static_cast<const uint16_t*>(b), 0, n);
}

template <typename Conv>
void divideConvertedScalar(void* data, size_t n, double divisor) {
  divideConvertedTail<Conv>(static_cast<uint16_t*>(data), 0, n, static_cast<float>(divisor));
}

template <typename T>
void fillGeneric(ReduceTable& t, DataType type) {
  int k = static_cast<int>(type);
  t.reduce[k][0] = &reduceLoop<T, OpSum>;
  t.reduce[k][1] = &reduceLoop<T, OpProd>;
  t.reduce[k][2] = &reduceLoop<T, OpMin>;
  t.reduce[k][3] = &reduceLoop<T, OpMax>;
}

template <typename Conv>
void fillConvertedScalar(ReduceTable& t, DataType type) {
  int k = static_cast<int>(type);
  t.reduce[k][0] = &reduceConvertedScalar<Conv, OpSum>;
  t.reduce[k][1] = &reduceConvertedScalar<Conv, OpProd>;
  t.reduce[k][2] = &reduceConvertedScalar<Conv, OpMin>;
  t.reduce[k][3] = &reduceConvertedScalar<Conv, OpMax>;
  t.divide[k] = &divideConvertedScalar<Conv>;
}

// Integer kernels are plain loops at every level: the compiler vectorises
// them for the level's -m flags.
ReduceTable buildTable() {
  ReduceTable t{};
  fillGeneric<int8_t>(t, DataType::kInt8);
  fillGeneric<uint8_t>(t, DataType::kUInt8);
  fillGeneric<int32_t>(t, DataType::kInt32);
  fillGeneric<int64_t>(t, DataType::kInt64);
#if defined(__AVX2__) || defined(__AVX512F__)
  fillFloat<VecF32>(t, DataType::kFloat32);
  fillFloat<VecF64>(t, DataType::kFloat64);
  fillConverted<ConvHalf>(t, DataType::kFloat16);
  fillConverted<ConvBf16>(t, DataType::kBFloat16);
#else
  fillGeneric<float>(t, DataType::kFloat32);
  fillGeneric<double>(t, DataType::kFloat64);
  t.divide[static_cast<int>(DataType::kFloat32)] = &divideLoop<float>;
  t.divide[static_cast<int>(DataType::kFloat64)] = &divideLoop<double>;
  fillConvertedScalar<HalfScalar>(t, DataType::kFloat16);
  fillConvertedScalar<Bf16Scalar>(t, DataType::kBFloat16);
#endif
  return t;
}

}  // namespace
}  // namespace gradcomm::kernels
