#include "reducer/bucket_layout.hpp"

namespace gradcomm::reducer {

BucketLayout assignBuckets(const std::vector<GradientInfo>& grads, const std::vector<size_t>& order,
                           size_t firstCapBytes, size_t capBytes) {
  BucketLayout layout;
  layout.bucketOf.assign(grads.size(), 0);
  layout.offsetOf.assign(grads.size(), 0);
  size_t bytes = 0;
  for (size_t g : order) {
    const GradientInfo& info = grads[g];
    const size_t gradBytes = info.count * dataTypeSize(info.type);
    bool open = !layout.buckets.empty();
    if (open) {
      const auto& b = layout.buckets.back();
      const size_t capNow = layout.buckets.size() == 1 ? firstCapBytes : capBytes;
      if (b.type != info.type || bytes + gradBytes > capNow) open = false;
    }
    if (!open) {
      layout.buckets.emplace_back();
      layout.buckets.back().type = info.type;
      bytes = 0;
    }
    auto& b = layout.buckets.back();
    layout.bucketOf[g] = layout.buckets.size() - 1;
    layout.offsetOf[g] = b.count;
    b.gradients.push_back(g);
    b.offsets.push_back(b.count);
    b.count += info.count;
    bytes += gradBytes;
  }
  return layout;
}

std::vector<size_t> reverseOrder(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = n - 1 - i;
  return v;
}

}  // namespace gradcomm::reducer
