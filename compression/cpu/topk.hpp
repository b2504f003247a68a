#pragma once
// Top-k selection by magnitude on the CPU, with optional error feedback.
//
// Order: larger |t| first; NaN ranks above inf (so it is sent, not kept in
// the residual forever); equal magnitudes go to the lower index. Both modes
// return the exact top-c set for some c (all elements ranked above the c-th
// and none below it), with indices in increasing order; exact mode has
// c == k, approximate mode |c - k| <= k/10.
//
// Algorithm, for n > 4 * sampleSize: a stratified random sample of
// sampleSize elements gives a magnitude threshold that, with ~4 standard
// deviations of margin, lets at least `wanted` elements through (k exact,
// 0.9k approximate). One filter pass collects the elements at or above it
// (folding the residual in on the way). If at least `wanted` came through,
// every dropped element ranks below every kept one, so an nth_element over
// the candidates cuts them to exactly k (exact mode; approximate mode only
// cuts when more than 1.1k came through). If fewer came through (about
// 3e-5 of calls on a representative sample), the exact fallback runs: a
// magnitude histogram pass finds the bucket of the k-th element and a second
// filter pass collects from there. Cost: sample + 1 pass normally; worst
// case sample + 3 passes. Smaller inputs use the fallback path directly
// (2 passes).
//
// A bounded candidate buffer (topkScratchCapacity) is compacted to the
// running top-k whenever it fills, raising the threshold; memory stays
// O(k) whatever the distribution (all-equal inputs, adversarial orders).
#include <cstddef>
#include <cstdint>

#include "compression/cpu/isa.hpp"
#include "compression/sparse_tensor.hpp"

namespace gradcomm::compression {

/// Default size of the approximate mode's sample.
inline constexpr size_t kDefaultTopKSample = 16384;

/// How to select.
struct TopKOptions {
  size_t k = 0;                            ///< elements to select (Spec::topkCount); >= 1 when n > 0
  bool approximate = true;                 ///< count within 10% of k (saves the final cut), else exactly k
  uint64_t seed = 0;                       ///< sampling seed; vary it per step (exact results do not depend on it)
  size_t sampleSize = kDefaultTopKSample;  ///< elements sampled for the threshold; 0: never sample
  Isa isa = detectIsa();                   ///< instruction set of the scan kernels
};

/// What a selection did (for tests and tuning).
struct TopKStats {
  size_t dataPasses = 0;    ///< full passes over the n elements
  size_t compactions = 0;   ///< times the candidate buffer filled and was cut to the running top-k
  bool sampled = false;     ///< the threshold came from a sample
  bool fellBack = false;    ///< the sampled threshold let too few through; the histogram path ran too
  size_t candidates = 0;    ///< entries the last scan collected, before the final cut
};

/// Selects the top elements of t = in (+ residual). With a residual (error
/// feedback), t is folded into it in the first pass and, at the end,
/// residual holds everything not sent: t, with sent positions zeroed. `in`
/// and `residual` must not overlap. out.denseCount becomes n.
void topk(const float* in, float* residual, size_t n, const TopKOptions& options, SparseTensor& out,
          TopKStats* stats = nullptr);

/// Entries selectTopK needs in its index and value buffers.
size_t topkScratchCapacity(size_t n, size_t k);

/// topk() into caller buffers of `capacity` >= topkScratchCapacity(n, k)
/// entries; returns the number selected. IndexT is uint32_t (n < 2^32) or
/// uint64_t.
template <typename IndexT>
size_t selectTopK(const float* in, float* residual, size_t n, const TopKOptions& options, IndexT* indices,
                  float* values, size_t capacity, TopKStats* stats = nullptr);

}  // namespace gradcomm::compression
