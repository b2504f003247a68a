// Compression kernels, compiled once per ISA. Include this from exactly one
// translation unit per level (kernels_{scalar,avx2,avx512,avx512bf16}.cpp),
// each built with its own -m flags (see CMakeLists.txt). Everything here has
// internal linkage, and nothing here instantiates std templates or calls
// inline library functions, so the linker can never hand a baseline caller
// a copy built for a wider ISA (that happens with COMDAT folding at -O0).
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "compression/cpu/kernel_table.hpp"
#include "compression/half_saturate.hpp"
#include "kernels/half.hpp"

namespace gradcomm::compression::detail {
namespace {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t kFp16MaxBits = 0x477FE000u;  // 65504.0f, the largest finite fp16

// ---- scalar element code (the reference every vector path must match) --------

inline uint32_t keyOf(float t) { return kernels::floatBits(t) & kAbsMask; }

inline float finiteOrZero(float r) { return (kernels::floatBits(r) & kInfBits) == kInfBits ? 0.0f : r; }

// fp16 for compression saturates: a finite value beyond the fp16 range
// becomes +-65504 instead of infinity, so one gradient spike does not turn
// the sum into inf (error feedback carries the excess). inf and NaN pass.
struct ScalarFp16 {
  static inline uint16_t encode(float f) { return floatToHalfSaturating(f); }
  // Quiets a signalling NaN, as vcvtph2ps does, so every level agrees.
  static inline float decode(uint16_t h) {
    const float f = kernels::halfToFloat(h);
    return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) ? kernels::bitsToFloat(kernels::floatBits(f) | 0x00400000u) : f;
  }
};
// bf16 keeps IEEE behaviour: it has float32's range, so only values within
// half an ulp of FLT_MAX round to infinity.
struct ScalarBf16 {
  static inline uint16_t encode(float f) { return kernels::floatToBf16(f); }
  static inline float decode(uint16_t h) { return kernels::bf16ToFloat(h); }
};

// What was not sent, in gradient units: t - d/s, computed as (t*s - d)/s with
// the numerator from one fused multiply-add so that it is exact up to one
// rounding of the (small) error rather than of t. Non-finite results become
// 0: an inf/NaN step is sent as such, and must not poison every later step.
template <bool kScaled>
inline float residualOf(float t, float s, float d) {
  if constexpr (kScaled) return finiteOrZero(__builtin_fmaf(t, s, -d) / s);
  else return finiteOrZero(t - d);
}

template <class S, bool kScaled>
inline void castTail(const float* in, uint16_t* out, size_t i, size_t n, float s) {
  for (; i < n; ++i) out[i] = S::encode(kScaled ? in[i] * s : in[i]);
}

template <class S>
inline void decodeTail(const uint16_t* in, float* out, size_t i, size_t n) {
  for (; i < n; ++i) out[i] = S::decode(in[i]);
}

template <class S, bool kScaled>
inline void residualTail(const float* in, float* res, uint16_t* out, size_t i, size_t n, float s) {
  for (; i < n; ++i) {
    const float t = in[i] + res[i];
    const uint16_t q = S::encode(kScaled ? t * s : t);
    out[i] = q;
    res[i] = residualOf<kScaled>(t, s, S::decode(q));
  }
}

// Branch-free append: the slot at *count always exists (count < cap), and
// is simply overwritten when the element does not pass.
template <bool kAdd, bool kStore, class IndexT>
inline size_t filterTail(const ScanSource& src, size_t i, size_t end, uint32_t lo, IndexT* idx, float* val,
                         size_t* countp, size_t cap) {
  size_t count = *countp;
  for (; i < end && count < cap; ++i) {
    float t = src.a[i];
    if constexpr (kAdd) t = t + src.b[i];
    if constexpr (kStore) src.store[i] = t;
    idx[count] = static_cast<IndexT>(i);
    val[count] = t;
    count += keyOf(t) >= lo ? 1 : 0;
  }
  *countp = count;
  return i;
}

// ---- vector code ---------------------------------------------------------------

#if defined(__AVX512F__)
struct Vec {
  using F = __m512;
  using H = __m256i;  // 16 half-precision values
  static constexpr size_t kWidth = 16;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static H loadH(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void storeH(uint16_t* p, H h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fmsub(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static F finiteOrZero(F r) {
    const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(r), _mm512_set1_ps(__builtin_inff()), _CMP_LT_OQ);
    return _mm512_maskz_mov_ps(finite, r);
  }
};

struct VFp16 {
  using Scalar = ScalarFp16;
  static Vec::H encode(Vec::F y) {
    const __m512i bits = _mm512_castps_si512(y);
    const __m512i mag = _mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(kAbsMask)));
    const __mmask16 over = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(static_cast<int>(kFp16MaxBits))) &
                           _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(static_cast<int>(kInfBits)));
    const __m512i saturated = _mm512_or_si512(_mm512_andnot_si512(_mm512_set1_epi32(static_cast<int>(kAbsMask)), bits),
                                              _mm512_set1_epi32(static_cast<int>(kFp16MaxBits)));
    y = _mm512_mask_mov_ps(y, over, _mm512_castsi512_ps(saturated));
    return _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void encode2(uint16_t* p, Vec::F y0, Vec::F y1) {
    Vec::storeH(p, encode(y0));
    Vec::storeH(p + Vec::kWidth, encode(y1));
  }
  static Vec::F decode(Vec::H h) { return _mm512_cvtph_ps(h); }
};

struct VBf16 {
  using Scalar = ScalarBf16;
  // Integer round-to-nearest-even; exact for every input, subnormals included.
  static Vec::H encodeBits(Vec::F y) {
    const __m512i bits = _mm512_castps_si512(y);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    const __m512i result = _mm512_mask_mov_epi32(_mm512_srli_epi32(rounded, 16), nan, quiet);
    return _mm512_cvtepi32_epi16(result);
  }
#if defined(__AVX512BF16__)
  // vcvtneps2bf16 rounds like encodeBits but treats subnormal inputs as zero
  // (it ignores MXCSR); the rare vector holding one takes the integer path.
  static Vec::H encode(Vec::F y) {
    if (_mm512_fpclass_ps_mask(y, 0x20)) return encodeBits(y);
    return reinterpret_cast<Vec::H>(_mm512_cvtneps_pbh(y));
  }
  static void encode2(uint16_t* p, Vec::F y0, Vec::F y1) {
    if (_mm512_fpclass_ps_mask(y0, 0x20) | _mm512_fpclass_ps_mask(y1, 0x20)) {
      Vec::storeH(p, encodeBits(y0));
      Vec::storeH(p + Vec::kWidth, encodeBits(y1));
      return;
    }
    _mm512_storeu_si512(p, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(y1, y0)));
  }
#else
  static Vec::H encode(Vec::F y) { return encodeBits(y); }
  static void encode2(uint16_t* p, Vec::F y0, Vec::F y1) {
    Vec::storeH(p, encodeBits(y0));
    Vec::storeH(p + Vec::kWidth, encodeBits(y1));
  }
#endif
  static Vec::F decode(Vec::H h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

// Appends the lanes of t (elements i..i+15) selected by m. Compresses into a
// register and stores whole vectors: the memory form of vcompress is
// microcoded and slow on some cores; the slack past `count` is within `cap`
// and is overwritten by later appends.
template <class IndexT>
inline size_t appendSelected(__m512 t, __mmask16 m, size_t i, IndexT* idx, float* val, size_t count) {
  _mm512_storeu_ps(val + count, _mm512_maskz_compress_ps(m, t));
  if constexpr (sizeof(IndexT) == 4) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i ids = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))), iota);
    _mm512_storeu_si512(idx + count, _mm512_maskz_compress_epi32(m, ids));
  } else {
    const __m512i iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i base = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(i)), iota);
    const __mmask8 m0 = static_cast<__mmask8>(m), m1 = static_cast<__mmask8>(m >> 8);
    _mm512_storeu_si512(idx + count, _mm512_maskz_compress_epi64(m0, base));
    _mm512_storeu_si512(idx + count + __builtin_popcount(m0),
                        _mm512_maskz_compress_epi64(m1, _mm512_add_epi64(base, _mm512_set1_epi64(8))));
  }
  return count + static_cast<size_t>(__builtin_popcount(m));
}

template <bool kAdd, bool kStore>
inline __m512 loadT(const ScanSource& src, size_t i) {
  __m512 t = _mm512_loadu_ps(src.a + i);
  if constexpr (kAdd) t = _mm512_add_ps(t, _mm512_loadu_ps(src.b + i));
  if constexpr (kStore) _mm512_storeu_ps(src.store + i, t);
  return t;
}

template <bool kAdd, bool kStore, class IndexT>
size_t filterVec(const ScanSource& src, size_t i, size_t end, uint32_t lo, IndexT* idx, float* val, size_t* countp,
                 size_t cap) {
  constexpr size_t kW = 16;
  size_t count = *countp;
  const __m512i absMask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  const __m512i loV = _mm512_set1_epi32(static_cast<int>(lo));
  auto selectMask = [&](__m512 t) {
    return _mm512_cmpge_epu32_mask(_mm512_and_si512(_mm512_castps_si512(t), absMask), loV);
  };
  // Branch-free: a branch on "anything selected here?" is taken by ~15% of
  // vectors at a 1% selection rate, at random, and its mispredictions cost
  // more than compressing every vector.
  for (; i + kW <= end; i += kW) {
    if (count + kW > cap) {
      *countp = count;
      return i;
    }
    const __m512 t = loadT<kAdd, kStore>(src, i);
    count = appendSelected(t, selectMask(t), i, idx, val, count);
  }
  *countp = count;
  return filterTail<kAdd, kStore>(src, i, end, lo, idx, val, countp, cap);
}

#elif defined(__AVX2__)
struct Vec {
  using F = __m256;
  using H = __m128i;  // 8 half-precision values
  static constexpr size_t kWidth = 8;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static H loadH(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static void storeH(uint16_t* p, H h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F fmsub(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static F finiteOrZero(F r) {
    const F abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), r);
    return _mm256_and_ps(r, _mm256_cmp_ps(abs, _mm256_set1_ps(__builtin_inff()), _CMP_LT_OQ));
  }
};

struct VFp16 {
  using Scalar = ScalarFp16;
  static Vec::H encode(Vec::F y) {
    const __m256i bits = _mm256_castps_si256(y);
    const __m256i absMask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
    const __m256i mag = _mm256_and_si256(bits, absMask);
    // Magnitudes fit in 31 bits, so signed compares order them correctly.
    const __m256i aboveMax = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(static_cast<int>(kFp16MaxBits)));
    const __m256i infOrNan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(static_cast<int>(kInfBits - 1)));
    const __m256i over = _mm256_andnot_si256(infOrNan, aboveMax);
    const __m256i saturated =
        _mm256_or_si256(_mm256_andnot_si256(absMask, bits), _mm256_set1_epi32(static_cast<int>(kFp16MaxBits)));
    y = _mm256_blendv_ps(y, _mm256_castsi256_ps(saturated), _mm256_castsi256_ps(over));
    return _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void encode2(uint16_t* p, Vec::F y0, Vec::F y1) {
    Vec::storeH(p, encode(y0));
    Vec::storeH(p + Vec::kWidth, encode(y1));
  }
  static Vec::F decode(Vec::H h) { return _mm256_cvtph_ps(h); }
};

struct VBf16 {
  using Scalar = ScalarBf16;
  static __m256i roundedBits(Vec::F y) {
    const __m256i bits = _mm256_castps_si256(y);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  }
  static Vec::H encode(Vec::F y) {
    const __m256i r = roundedBits(y);
    // packus works within 128-bit lanes; gather the two halves afterwards.
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
  }
  static void encode2(uint16_t* p, Vec::F y0, Vec::F y1) {
    const __m256i packed = _mm256_packus_epi32(roundedBits(y0), roundedBits(y1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
  }
  static Vec::F decode(Vec::H h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

template <bool kAdd, bool kStore, class IndexT>
size_t filterVec(const ScanSource& src, size_t i, size_t end, uint32_t lo, IndexT* idx, float* val, size_t* countp,
                 size_t cap) {
  constexpr size_t kW = 8;
  size_t count = *countp;
  const __m256i absMask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  // key >= lo as a signed compare key > lo - 1: keys fit in 31 bits and lo
  // is at most 2^31, so lo - 1 stays within [-1, 2^31 - 1].
  const __m256i loMinusOne = _mm256_set1_epi32(static_cast<int>(lo - 1));
  alignas(32) float lanes[kW];
  for (; i + kW <= end; i += kW) {
    if (count + kW > cap) {
      *countp = count;
      return i;
    }
    __m256 t = _mm256_loadu_ps(src.a + i);
    if constexpr (kAdd) t = _mm256_add_ps(t, _mm256_loadu_ps(src.b + i));
    if constexpr (kStore) _mm256_storeu_ps(src.store + i, t);
    const __m256i key = _mm256_and_si256(_mm256_castps_si256(t), absMask);
    unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, loMinusOne))));
    if (m) {
      _mm256_store_ps(lanes, t);
      while (m) {
        const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
        idx[count] = static_cast<IndexT>(i + lane);
        val[count] = lanes[lane];
        ++count;
        m &= m - 1;
      }
    }
  }
  *countp = count;
  return filterTail<kAdd, kStore>(src, i, end, lo, idx, val, countp, cap);
}
#endif

#if defined(__AVX2__) || defined(__AVX512F__)
template <class Fmt, bool kScaled>
void castVec(const float* in, uint16_t* out, size_t n, float scale) {
  constexpr size_t kW = Vec::kWidth;
  const Vec::F s = Vec::set1(scale);
  size_t i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    Vec::F y0 = Vec::load(in + i), y1 = Vec::load(in + i + kW);
    if constexpr (kScaled) {
      y0 = Vec::mul(y0, s);
      y1 = Vec::mul(y1, s);
    }
    Fmt::encode2(out + i, y0, y1);
  }
  castTail<typename Fmt::Scalar, kScaled>(in, out, i, n, scale);
}

template <class Fmt>
void decodeVec(const uint16_t* in, float* out, size_t n) {
  constexpr size_t kW = Vec::kWidth;
  size_t i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    Vec::store(out + i, Fmt::decode(Vec::loadH(in + i)));
    Vec::store(out + i + kW, Fmt::decode(Vec::loadH(in + i + kW)));
  }
  decodeTail<typename Fmt::Scalar>(in, out, i, n);
}

template <class Fmt, bool kScaled>
void residualVec(const float* in, float* res, uint16_t* out, size_t n, float scale) {
  constexpr size_t kW = Vec::kWidth;
  const Vec::F s = Vec::set1(scale);
  size_t i = 0;
  for (; i + kW <= n; i += kW) {
    const Vec::F t = Vec::add(Vec::load(in + i), Vec::load(res + i));
    const Vec::H q = Fmt::encode(kScaled ? Vec::mul(t, s) : t);
    Vec::storeH(out + i, q);
    const Vec::F d = Fmt::decode(q);
    const Vec::F r = kScaled ? Vec::div(Vec::fmsub(t, s, d), s) : Vec::sub(t, d);
    Vec::store(res + i, Vec::finiteOrZero(r));
  }
  residualTail<typename Fmt::Scalar, kScaled>(in, res, out, i, n, scale);
}

using Fp16 = VFp16;
using Bf16 = VBf16;
#else
// The scalar level: the element code over the whole range.
template <class S, bool kScaled>
void castVec(const float* in, uint16_t* out, size_t n, float scale) {
  castTail<S, kScaled>(in, out, 0, n, scale);
}

template <class S>
void decodeVec(const uint16_t* in, float* out, size_t n) {
  decodeTail<S>(in, out, 0, n);
}

template <class S, bool kScaled>
void residualVec(const float* in, float* res, uint16_t* out, size_t n, float scale) {
  residualTail<S, kScaled>(in, res, out, 0, n, scale);
}

template <bool kAdd, bool kStore, class IndexT>
size_t filterVec(const ScanSource& src, size_t i, size_t end, uint32_t lo, IndexT* idx, float* val, size_t* count,
                 size_t cap) {
  return filterTail<kAdd, kStore>(src, i, end, lo, idx, val, count, cap);
}

using Fp16 = ScalarFp16;
using Bf16 = ScalarBf16;
#endif

template <class Fmt>
void castEntry(const float* in, uint16_t* out, size_t n, float scale) {
  if (scale == 1.0f) castVec<Fmt, false>(in, out, n, scale);
  else castVec<Fmt, true>(in, out, n, scale);
}

template <class Fmt>
void residualEntry(const float* in, float* res, uint16_t* out, size_t n, float scale) {
  if (scale == 1.0f) residualVec<Fmt, false>(in, res, out, n, scale);
  else residualVec<Fmt, true>(in, res, out, n, scale);
}

template <class IndexT>
size_t filterEntry(const ScanSource& src, size_t begin, size_t end, uint32_t lo, IndexT* idx, float* val,
                   size_t* count, size_t cap) {
  if (src.b && src.store) return filterVec<true, true>(src, begin, end, lo, idx, val, count, cap);
  if (src.b) return filterVec<true, false>(src, begin, end, lo, idx, val, count, cap);
  return filterVec<false, false>(src, begin, end, lo, idx, val, count, cap);
}

// Four sub-histograms so that runs of equal buckets do not serialise on one
// counter; 32-bit counters are flushed well before they could wrap.
template <bool kAdd, bool kStore>
void histogramLoop(const ScanSource& src, size_t n, size_t* hist) {
  constexpr size_t kBlock = 2048;
  constexpr size_t kFlushEvery = size_t{1} << 30;
  alignas(64) float block[kBlock];
  uint32_t counts[4][kHistogramBuckets];
  std::memset(counts, 0, sizeof counts);
  size_t sinceFlush = 0;
  auto flush = [&] {
    for (size_t b = 0; b < kHistogramBuckets; ++b) {
      hist[b] += static_cast<size_t>(counts[0][b]) + counts[1][b] + counts[2][b] + counts[3][b];
      counts[0][b] = counts[1][b] = counts[2][b] = counts[3][b] = 0;
    }
    sinceFlush = 0;
  };
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t len = n - base < kBlock ? n - base : kBlock;
    const float* t = src.a + base;
    if constexpr (kAdd) {
      float* dst = kStore ? src.store + base : block;
      for (size_t j = 0; j < len; ++j) dst[j] = src.a[base + j] + src.b[base + j];
      t = dst;
    }
    size_t j = 0;
    for (; j + 4 <= len; j += 4) {
      ++counts[0][keyOf(t[j]) >> kHistogramShift];
      ++counts[1][keyOf(t[j + 1]) >> kHistogramShift];
      ++counts[2][keyOf(t[j + 2]) >> kHistogramShift];
      ++counts[3][keyOf(t[j + 3]) >> kHistogramShift];
    }
    for (; j < len; ++j) ++counts[0][keyOf(t[j]) >> kHistogramShift];
    sinceFlush += len;
    if (sinceFlush >= kFlushEvery) flush();
  }
  flush();
}

void histogramEntry(const ScanSource& src, size_t n, size_t* hist) {
  if (src.b && src.store) histogramLoop<true, true>(src, n, hist);
  else if (src.b) histogramLoop<true, false>(src, n, hist);
  else histogramLoop<false, false>(src, n, hist);
}

KernelTable buildTable() {
  KernelTable t{};
  t.cast[kFp16] = &castEntry<Fp16>;
  t.cast[kBf16] = &castEntry<Bf16>;
  t.decode[kFp16] = &decodeVec<Fp16>;
  t.decode[kBf16] = &decodeVec<Bf16>;
  t.residualCast[kFp16] = &residualEntry<Fp16>;
  t.residualCast[kBf16] = &residualEntry<Bf16>;
  t.filter32 = &filterEntry<uint32_t>;
  t.filter64 = &filterEntry<uint64_t>;
  t.histogram = &histogramEntry;
  return t;
}

}  // namespace
}  // namespace gradcomm::compression::detail
