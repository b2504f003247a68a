#pragma once
// Gradient compression: what to compress to (Spec) and the error-feedback
// memory that makes lossy compression converge (Residual). The kernels live
// in cpu/ and cuda/; the sparse wire format in sparse_format.hpp.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/compression_spec.hpp"

namespace gradcomm::compression {

/// Error-feedback memory of one tensor: the part of past gradients that
/// compression has not sent yet, in gradient units (before any pre-scaling).
/// It lives where the tensor's compressed allreduces run: host memory for
/// host buffers, device memory of one device for device buffers. Its first
/// use decides; a use in the other memory (or on another device) is an
/// InvalidArgument until clear().
class Residual {
 public:
  /// Allocates `bytes` of zero-filled device memory (zeroed in the order of
  /// the stream the compressor runs on) and returns it with its deleter.
  using DeviceAllocator = std::function<std::shared_ptr<void>(size_t bytes)>;

  /// The host buffer for a tensor of `count` floats, zero-filled on first use.
  /// Throws InvalidArgument when `count` differs from the size in use, or
  /// when the residual lives in device memory.
  float* data(size_t count);
  /// The device buffer of `device` for a tensor of `count` floats, made by
  /// `allocate` on first use. Throws InvalidArgument when `count` differs
  /// from the size in use, or when the residual lives in host memory or on
  /// another device.
  float* deviceData(size_t count, int device, const DeviceAllocator& allocate);
  /// The buffer as it is (null when empty): host memory, or device memory
  /// of device() where that is not -1.
  const float* data() const { return device_ ? static_cast<const float*>(device_.get()) : (buffer_.empty() ? nullptr : buffer_.data()); }
  /// Elements held; 0 before first use and after clear().
  size_t size() const { return device_ ? deviceCount_ : buffer_.size(); }
  bool empty() const { return size() == 0; }
  /// The device whose memory holds the residual; -1 for host memory (and
  /// when empty).
  int device() const { return device_ ? deviceOrdinal_ : -1; }
  /// Throws the InvalidArgument of data() / deviceData() when the residual
  /// holds memory other than `device`'s (-1: host memory); empty fits all.
  void checkPlace(int device) const;
  /// Forgets the carried error, the size and the memory (after a skipped
  /// step or a change of model); the next use sizes and places it afresh.
  void clear();

 private:
  std::vector<float> buffer_;
  std::shared_ptr<void> device_;  // with the deleter that frees it on its device
  size_t deviceCount_ = 0;
  int deviceOrdinal_ = -1;
};

}  // namespace gradcomm::compression
