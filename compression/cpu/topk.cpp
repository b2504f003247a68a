#include "compression/cpu/topk.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "compression/cpu/kernel_table.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression {
namespace {

using detail::ScanSource;

constexpr size_t kVectorSlack = 16;  // the widest vector append writes this far past the count
constexpr size_t kMinHeadroom = 1024;

inline uint32_t keyOf(float t) {
  uint32_t u;
  std::memcpy(&u, &t, sizeof u);
  return u & 0x7FFFFFFFu;
}

uint64_t splitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Reused between calls: the sample and the cuts need O(sample + k) keys and
// a histogram, and fresh allocations of that size cost page faults every step.
struct Scratch {
  std::vector<uint32_t> keys;
  std::vector<uint32_t> bucket;
  std::vector<uint32_t> histogram;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

std::vector<uint32_t>& scratchKeys() { return scratch().keys; }

constexpr size_t kCutBuckets = size_t{1} << 16;

// The k-th largest of keys[0, count) (k <= count), and how many are larger.
// A histogram of (key - min) >> shift over at most 64K buckets finds the
// bucket of the k-th key; only that bucket goes through nth_element. A plain
// nth_element over all candidates costs ~4 ns a key in mispredicted
// branches; this is ~1 ns a key unless most keys share one bucket.
uint32_t kthLargest(const std::vector<uint32_t>& keys, size_t count, size_t k, size_t& above) {
  uint32_t lo = 0xFFFFFFFFu, hi = 0;
  for (size_t i = 0; i < count; ++i) {
    lo = std::min(lo, keys[i]);
    hi = std::max(hi, keys[i]);
  }
  int shift = 0;
  while (((hi - lo) >> shift) >= kCutBuckets) ++shift;
  const size_t buckets = static_cast<size_t>((hi - lo) >> shift) + 1;
  Scratch& s = scratch();
  s.histogram.assign(buckets, 0);
  for (size_t i = 0; i < count; ++i) ++s.histogram[(keys[i] - lo) >> shift];
  size_t b = buckets - 1, larger = 0;
  while (larger + s.histogram[b] < k) larger += s.histogram[b--];
  const uint32_t bucketKey = static_cast<uint32_t>(b);
  s.bucket.resize(s.histogram[b]);
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    s.bucket[n] = keys[i];  // branch-free append; the slot exists while n < bucket size
    n += ((keys[i] - lo) >> shift) == bucketKey ? 1 : 0;
    if (n == s.bucket.size()) break;
  }
  const size_t rank = k - larger - 1;  // position of the k-th key inside its bucket
  std::nth_element(s.bucket.begin(), s.bucket.begin() + static_cast<std::ptrdiff_t>(rank), s.bucket.end(),
                   std::greater<uint32_t>());
  const uint32_t kth = s.bucket[rank];
  above = larger;
  for (size_t i = 0; i < rank; ++i) above += s.bucket[i] > kth ? 1 : 0;
  return kth;
}

// Cuts idx/val[0, count) to its top k (ties to the lower index, which is
// the earlier entry: entries are in index order) and keeps the order.
// Returns the magnitude key of the k-th entry.
template <typename IndexT>
uint32_t keepTopK(IndexT* idx, float* val, size_t& count, size_t k) {
  std::vector<uint32_t>& keys = scratchKeys();
  keys.resize(count);
  for (size_t i = 0; i < count; ++i) keys[i] = keyOf(val[i]);
  size_t above = 0;
  const uint32_t kth = kthLargest(keys, count, k, above);
  size_t ties = k - above;
  // Branch-free: most candidates are kept, at random, so a branch here
  // would mispredict often.
  size_t out = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t key = keys[i];
    const size_t tie = key == kth ? 1 : 0;
    const size_t keep = (key > kth ? 1 : 0) | (tie & (ties != 0 ? 1 : 0));
    ties -= tie & keep;
    idx[out] = idx[i];
    val[out] = val[i];
    out += keep;
  }
  count = out;
  return kth;
}

// A magnitude key such that, with ~4 standard deviations of margin, at
// least `low` of the n elements have a key >= it. Strata of equal length
// with one random element each give an unbiased sample in address order.
// If j sampled keys are >= the threshold, about j*n/m elements are, with a
// standard deviation of about sqrt(j)*n/m; (j - 4 sqrt(j)) * n/m >= low
// gives sqrt(j) = 2 + sqrt(4 + low*m/n).
uint32_t sampleThreshold(const float* a, const float* b, size_t n, size_t m, size_t low, uint64_t seed) {
  const double expected = static_cast<double>(low) * static_cast<double>(m) / static_cast<double>(n);
  const double root = 2.0 + std::sqrt(4.0 + expected);
  const double jReal = std::ceil(root * root);
  if (jReal >= static_cast<double>(m)) return 0;
  const size_t j = static_cast<size_t>(jReal);
  std::vector<uint32_t>& keys = scratchKeys();
  keys.resize(m);
  const size_t q = n / m, rem = n % m;
  uint64_t state = seed ^ 0x6A09E667F3BCC909ull;
  for (size_t s = 0; s < m; ++s) {
    const size_t begin = s * q + (s < rem ? s : rem);
    const size_t len = q + (s < rem ? 1 : 0);
    const size_t pos = begin + static_cast<size_t>(splitMix64(state) % len);
    keys[s] = keyOf(b ? a[pos] + b[pos] : a[pos]);
  }
  std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(j - 1), keys.end(),
                   std::greater<uint32_t>());
  return keys[j - 1];
}

// One filter pass from `lo` up, compacting to the running top-k whenever the
// buffer fills; each compaction raises the threshold to just above the k-th.
template <typename IndexT>
void scan(const detail::KernelTable& table, const ScanSource& src, size_t n, uint32_t lo, size_t k, IndexT* idx,
          float* val, size_t& count, size_t capacity, TopKStats& stats) {
  const auto filter = [&] {
    if constexpr (std::is_same_v<IndexT, uint32_t>) return table.filter32;
    else return table.filter64;
  }();
  size_t i = 0;
  while (true) {
    i = filter(src, i, n, lo, idx, val, &count, capacity);
    if (i >= n) break;
    // capacity >= k + kVectorSlack + kMinHeadroom, so this always frees room.
    lo = keepTopK(idx, val, count, k) + 1;
    ++stats.compactions;
  }
  ++stats.dataPasses;
  stats.candidates = count;
}

}  // namespace

size_t topkScratchCapacity(size_t n, size_t k) {
  if (k >= n) return n;
  return k + std::max(k, kMinHeadroom) + kVectorSlack;
}

template <typename IndexT>
size_t selectTopK(const float* in, float* residual, size_t n, const TopKOptions& options, IndexT* idx, float* val,
                  size_t capacity, TopKStats* statsOut) {
  TopKStats stats;
  if (n == 0) {
    if (statsOut) *statsOut = stats;
    return 0;
  }
  if (!in || !idx || !val) throw InvalidArgument("top-k: null buffer for " + std::to_string(n) + " elements");
  if (std::is_same<IndexT, uint32_t>::value && needsWideIndices(n)) {
    throw InvalidArgument("top-k: " + std::to_string(n) + " elements need 64-bit indices; use uint64_t");
  }
  if (options.k == 0) throw InvalidArgument("top-k: k is 0; select at least one element (Spec::topkCount)");
  if (residual && in < residual + n && residual < in + n) {
    throw InvalidArgument("top-k: the input and the residual overlap; keep the residual in its own buffer");
  }
  const size_t k = std::min(options.k, n);
  if (capacity < topkScratchCapacity(n, k)) {
    throw InvalidArgument("top-k: output buffers hold " + std::to_string(capacity) + " entries but " +
                          std::to_string(topkScratchCapacity(n, k)) + " are needed (topkScratchCapacity)");
  }

  if (k == n) {  // everything is sent
    for (size_t i = 0; i < n; ++i) {
      idx[i] = static_cast<IndexT>(i);
      val[i] = residual ? in[i] + residual[i] : in[i];
    }
    if (residual) std::fill(residual, residual + n, 0.0f);
    stats.dataPasses = 1;
    stats.candidates = n;
    if (statsOut) *statsOut = stats;
    return n;
  }

  const detail::KernelTable& table = detail::kernelTable(options.isa);
  const ScanSource first{in, residual, residual};          // folds the residual in on the way
  const ScanSource folded{residual ? residual : in, nullptr, nullptr};  // t, once folded
  const size_t low = k - k / 10, high = k + k / 10;
  size_t count = 0;
  bool done = false;

  // The sampled threshold aims (with ~4 standard deviations of margin) to let
  // at least `wanted` elements through: then every element it drops ranks
  // below all it keeps, and cutting the candidates to k is exact.
  if (options.sampleSize > 0 && n / 4 > options.sampleSize) {
    stats.sampled = true;
    const size_t wanted = options.approximate ? low : k;
    const uint32_t lo = sampleThreshold(in, residual, n, options.sampleSize, wanted, options.seed);
    scan(table, first, n, lo, k, idx, val, count, capacity, stats);
    if (count >= wanted) {
      if (count > (options.approximate ? high : k)) keepTopK(idx, val, count, k);
      done = true;
    } else {
      stats.fellBack = true;
      count = 0;
    }
  }

  if (!done) {
    size_t hist[detail::kHistogramBuckets] = {};
    table.histogram(stats.dataPasses == 0 ? first : folded, n, hist);
    ++stats.dataPasses;
    size_t bucket = detail::kHistogramBuckets, above = 0;
    while (bucket > 0 && above < k) above += hist[--bucket];
    const uint32_t lo = static_cast<uint32_t>(bucket) << detail::kHistogramShift;
    scan(table, folded, n, lo, k, idx, val, count, capacity, stats);
    if (count < k) {
      throw InternalError("top-k: the filter pass kept " + std::to_string(count) + " of the " +
                          std::to_string(above) + " elements its histogram counted (k = " + std::to_string(k) +
                          "); was the input modified concurrently?");
    }
    if (count > k) keepTopK(idx, val, count, k);
  }

  if (residual) {
    for (size_t i = 0; i < count; ++i) residual[idx[i]] = 0.0f;
  }
  if (statsOut) *statsOut = stats;
  return count;
}

template size_t selectTopK<uint32_t>(const float*, float*, size_t, const TopKOptions&, uint32_t*, float*, size_t,
                                     TopKStats*);
template size_t selectTopK<uint64_t>(const float*, float*, size_t, const TopKOptions&, uint64_t*, float*, size_t,
                                     TopKStats*);

void topk(const float* in, float* residual, size_t n, const TopKOptions& options, SparseTensor& out,
          TopKStats* stats) {
  out.denseCount = n;
  const size_t capacity = topkScratchCapacity(n, std::min(options.k, n));
  out.values.resize(capacity);
  size_t count = 0;
  try {
    auto select = [&](auto& indices, auto& unused) {
      unused.clear();
      indices.resize(capacity);
      count = selectTopK(in, residual, n, options, indices.data(), out.values.data(), capacity, stats);
      indices.resize(count);
    };
    if (needsWideIndices(n)) select(out.indices64, out.indices32);
    else select(out.indices32, out.indices64);
  } catch (...) {
    // Leave a consistent, empty tensor rather than buffers of scratch.
    out.indices32.clear();
    out.indices64.clear();
    out.values.clear();
    throw;
  }
  out.values.resize(count);
}

}  // namespace gradcomm::compression
