#pragma once
// Which gradients share a bucket, and where each sits in its bucket: pure
// math over sizes and an expected ready order, so it is unit-tested alone.
#include <cstddef>
#include <vector>

#include "gradcomm/types.hpp"

namespace gradcomm::reducer {

struct GradientInfo {
  size_t count;
  DataType type;
};

struct BucketLayout {
  struct Bucket {
    DataType type = DataType::kFloat32;
    std::vector<size_t> gradients;  ///< gradient indices, in bucket order
    std::vector<size_t> offsets;    ///< element offset of each within the bucket
    size_t count = 0;               ///< elements in the bucket
  };
  std::vector<Bucket> buckets;
  std::vector<size_t> bucketOf;  ///< per gradient
  std::vector<size_t> offsetOf;  ///< per gradient: element offset in its bucket
};

/// Packs gradients into buckets in `order` (the order they are expected to
/// become ready): a bucket closes when the next gradient would push it past
/// its cap (firstCapBytes for the first bucket, capBytes after) or has
/// another data type. A gradient larger than the cap gets a bucket alone.
BucketLayout assignBuckets(const std::vector<GradientInfo>& grads, const std::vector<size_t>& order,
                           size_t firstCapBytes, size_t capBytes);

/// The default expectation: backward produces the last registered gradient first.
std::vector<size_t> reverseOrder(size_t n);

}  // namespace gradcomm::reducer
