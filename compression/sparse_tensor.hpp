#pragma once
// A sparse float tensor (what top-k selects).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomm::compression {

/// Dense lengths from this one up need 64-bit indices.
inline constexpr uint64_t kWideIndexThreshold = uint64_t{1} << 32;

/// True when a dense tensor of `denseCount` elements needs 64-bit indices.
inline bool needsWideIndices(size_t denseCount) { return static_cast<uint64_t>(denseCount) >= kWideIndexThreshold; }

/// Selected elements of a dense float tensor of `denseCount` elements: nnz()
/// (index, value) pairs, indices strictly increasing, held in `indices32`
/// when denseCount < 2^32 and in `indices64` otherwise.
struct SparseTensor {
  size_t denseCount = 0;
  std::vector<uint32_t> indices32;
  std::vector<uint64_t> indices64;
  std::vector<float> values;

  /// Number of (index, value) pairs.
  size_t nnz() const { return values.size(); }
  /// True when the indices are in `indices64`.
  bool wideIndices() const { return needsWideIndices(denseCount); }
  /// Index of pair i, whichever the width.
  uint64_t index(size_t i) const { return wideIndices() ? indices64[i] : indices32[i]; }
};

}  // namespace gradcomm::compression
