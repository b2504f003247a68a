#include <string>

#include "compression/compression.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression {

namespace {

[[noreturn]] void throwResidualSize(size_t held, size_t count) {
  throw InvalidArgument("error-feedback residual holds " + std::to_string(held) +
                        " elements but the tensor now has " + std::to_string(count) +
                        "; keep one Residual per tensor, or clear() it when the tensor changes");
}

std::string residualPlace(int device) {
  return device < 0 ? std::string("host memory") : "device memory (device " + std::to_string(device) + ")";
}

[[noreturn]] void throwResidualPlace(int held, int wanted) {
  throw InvalidArgument("the error-feedback residual lives in " + residualPlace(held) +
                        " (from earlier compressed allreduces of this tensor), but this call's buffers are in " +
                        residualPlace(wanted) + "; keep one ErrorFeedback per tensor and place, or clear() it " +
                        "when the tensor moves");
}

}  // namespace

float* Residual::data(size_t count) {
  if (device_) throwResidualPlace(deviceOrdinal_, -1);
  if (buffer_.empty()) {
    buffer_.assign(count, 0.0f);
  } else if (buffer_.size() != count) {
    throwResidualSize(buffer_.size(), count);
  }
  return buffer_.empty() ? nullptr : buffer_.data();
}

float* Residual::deviceData(size_t count, int device, const DeviceAllocator& allocate) {
  if (!buffer_.empty()) throwResidualPlace(-1, device);
  if (device_ && deviceOrdinal_ != device) throwResidualPlace(deviceOrdinal_, device);
  if (device_ && deviceCount_ != count) throwResidualSize(deviceCount_, count);
  if (!device_ && count) {
    device_ = allocate(count * sizeof(float));
    deviceCount_ = count;
    deviceOrdinal_ = device;
  }
  return static_cast<float*>(device_.get());
}

void Residual::checkPlace(int device) const {
  if (!empty() && this->device() != device) throwResidualPlace(this->device(), device);
}

void Residual::clear() {
  // swap, not clear(): a changed model should not keep the old allocation.
  std::vector<float>().swap(buffer_);
  device_.reset();
  deviceCount_ = 0;
  deviceOrdinal_ = -1;
}

}  // namespace gradcomm::compression
