#pragma once
// Gradient compression: what to compress to (Spec) and the error-feedback
// memory that makes lossy compression converge (Residual). The kernels live
// in cpu/ and cuda/; the sparse wire format in sparse_format.hpp.
#include <cstddef>
#include <string>
#include <vector>

#include "base/compression_spec.hpp"

namespace gradcomm::compression {

/// Error-feedback memory of one tensor: the part of past gradients that
/// compression has not sent yet, in gradient units (before any pre-scaling).
class Residual {
 public:
  /// The buffer for a tensor of `count` floats, zero-filled on first use.
  /// Throws InvalidArgument when `count` differs from the size in use.
  float* data(size_t count);
  /// The buffer as it is (null when empty).
  const float* data() const { return buffer_.empty() ? nullptr : buffer_.data(); }
  /// Elements held; 0 before first use and after clear().
  size_t size() const { return buffer_.size(); }
  bool empty() const { return buffer_.empty(); }
  /// Forgets the carried error and the size (after a skipped step or a
  /// change of model); the next data() call sizes the buffer afresh.
  void clear();

 private:
  std::vector<float> buffer_;
};

}  // namespace gradcomm::compression
