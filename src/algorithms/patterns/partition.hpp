#pragma once
// Pure index math shared by the planners: how a count splits into chunks
// and segments. No transport, no buffers: unit-tested on its own.
#include <cstddef>

namespace gradcomm::algorithms::patterns {

/// Splits `count` elements into `parts` contiguous chunks whose sizes differ
/// by at most one (the first count % parts chunks are one longer). Chunks
/// at or past `parts` are empty and sit at the end.
struct Partition {
  size_t count = 0;
  size_t parts = 1;
  size_t sizeOf(size_t i) const { return i >= parts ? 0 : count / parts + (i < count % parts ? 1 : 0); }
  size_t offsetOf(size_t i) const {
    if (i >= parts) return count;
    return i * (count / parts) + (i < count % parts ? i : count % parts);
  }
};

/// Splits a range of `count` elements into segments of at most `segment`.
struct Segments {
  size_t count = 0;
  size_t segment = 1;
  size_t number() const { return count == 0 ? 0 : (count + segment - 1) / segment; }
  size_t offsetOf(size_t s) const { return s * segment; }
  size_t sizeOf(size_t s) const {
    size_t begin = s * segment;
    if (begin >= count) return 0;
    return count - begin < segment ? count - begin : segment;
  }
};

/// Elements per pipeline segment for an element size and a byte budget.
inline size_t segmentElements(size_t segmentBytes, size_t elemSize) {
  size_t n = segmentBytes / elemSize;
  return n == 0 ? 1 : n;
}

/// The same, never more than `largest` elements (the biggest piece a plan
/// cuts), so that receive slots sized by the segment stay as small as the
/// data when the segment is large.
inline size_t segmentElements(size_t segmentBytes, size_t elemSize, size_t largest) {
  size_t n = segmentElements(segmentBytes, elemSize);
  return largest == 0 ? 1 : (n < largest ? n : largest);
}

inline int mod(long long a, int p) {
  long long r = a % p;
  return static_cast<int>(r < 0 ? r + p : r);
}

}  // namespace gradcomm::algorithms::patterns
