#pragma once
// The decision logic of the device top-k's radix select, kept free of CUDA
// so that the same code runs in the kernel and in a host unit test
// (tests/unit/test_compression.cpp simulates the device pipeline with it).
//
// Keys are the 31 magnitude bits of t (bits & 0x7FFFFFFF), so NaN ranks
// above inf. Digits of 11, 11 and 9 bits are settled top first; after each
// histogram pass selectStep() either fixes the final rule — take every key
// above `threshold`, plus the first `ties` keys equal to it in index order —
// or extends the prefix for the next pass.
#include <cstdint>

#if defined(__CUDACC__)
#define GRADCOMM_HOST_DEVICE __host__ __device__
#else
#define GRADCOMM_HOST_DEVICE
#endif

namespace gradcomm::compression::cuda::detail {

/// `ties` meaning every key equal to the threshold.
constexpr unsigned long long kAllTies = ~0ull;
/// Buckets of the widest digit.
constexpr int kRadixBuckets = 2048;

/// One digit: the bits key >> shift & ((1 << bits) - 1).
struct Digit {
  int shift;
  int bits;
};

/// Progress of one selection; lives in device memory between kernels.
struct SelectState {
  uint32_t prefix;               // key bits settled so far
  uint32_t prefixMask;           // which bits those are
  uint32_t threshold;            // final rule: key > threshold ...
  uint32_t done;                 // 1 once the rule is final
  unsigned long long remaining;  // elements still to find inside the prefix
  unsigned long long above;      // elements whose key is above the prefix range
  unsigned long long ties;       // ... plus this many keys == threshold, lowest index first
  unsigned long long total;      // elements the rule selects
};

/// The digits, top first.
GRADCOMM_HOST_DEVICE inline Digit radixDigit(int pass) {
  return pass == 0 ? Digit{20, 11} : pass == 1 ? Digit{9, 11} : Digit{0, 9};
}

/// Start selecting k of n (all of them when k == n).
GRADCOMM_HOST_DEVICE inline void initSelect(SelectState& s, unsigned long long k, bool all) {
  s.prefix = 0;
  s.prefixMask = 0;
  s.threshold = 0;
  s.done = all ? 1u : 0u;
  s.remaining = k;
  s.above = 0;
  s.ties = all ? kAllTies : 0;
  s.total = all ? k : 0;
}

/// True when `key` is counted by the next histogram pass.
GRADCOMM_HOST_DEVICE inline bool inPrefix(const SelectState& s, uint32_t key) {
  return (key & s.prefixMask) == s.prefix;
}

/// key >= lower, written as key > lower - 1 (or everything from key 0).
GRADCOMM_HOST_DEVICE inline void selectAtLeast(SelectState& s, uint32_t lower) {
  if (lower == 0) {
    s.threshold = 0;
    s.ties = kAllTies;
  } else {
    s.threshold = lower - 1;
    s.ties = 0;
  }
}

/// One decision after the histogram of digit `d` (hist[1 << d.bits]) of the
/// keys in the prefix. Approximate selection stops as soon as a bucket edge
/// gives a count in [low, high].
GRADCOMM_HOST_DEVICE inline void selectStep(SelectState& s, const unsigned long long* hist, Digit d, bool last,
                                            bool approximate, unsigned long long low, unsigned long long high) {
  if (s.done) return;
  const int buckets = 1 << d.bits;
  unsigned long long cum = 0;
  int b = buckets - 1;
  for (; b > 0; --b) {
    if (cum + hist[b] >= s.remaining) break;
    cum += hist[b];
  }
  const unsigned long long inBucket = hist[b];
  const unsigned long long above = s.above + cum;
  const unsigned long long need = s.remaining - cum;
  const uint32_t lower = s.prefix | (static_cast<uint32_t>(b) << d.shift);
  const uint32_t upper = lower | ((1u << d.shift) - 1u);
  if (need == inBucket) {  // the whole bucket is in
    selectAtLeast(s, lower);
    s.total = above + inBucket;
    s.done = 1;
  } else if (last) {  // the last digit: the bucket is a single key
    s.threshold = lower;
    s.ties = need;
    s.total = above + need;
    s.done = 1;
  } else if (approximate && above + inBucket <= high) {
    selectAtLeast(s, lower);
    s.total = above + inBucket;
    s.done = 1;
  } else if (approximate && above >= low) {
    s.threshold = upper;
    s.ties = 0;
    s.total = above;
    s.done = 1;
  } else {
    s.prefix = lower;
    s.prefixMask |= static_cast<uint32_t>(buckets - 1) << d.shift;
    s.above = above;
    s.remaining = need;
  }
}

}  // namespace gradcomm::compression::cuda::detail
