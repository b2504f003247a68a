#include <string>

#include "compression/compression.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression {

float* Residual::data(size_t count) {
  if (buffer_.empty()) {
    buffer_.assign(count, 0.0f);
  } else if (buffer_.size() != count) {
    throw InvalidArgument("error-feedback residual holds " + std::to_string(buffer_.size()) +
                          " elements but the tensor now has " + std::to_string(count) +
                          "; keep one Residual per tensor, or clear() it when the tensor changes");
  }
  return buffer_.empty() ? nullptr : buffer_.data();
}

void Residual::clear() {
  // swap, not clear(): a changed model should not keep the old allocation.
  std::vector<float>().swap(buffer_);
}

}  // namespace gradcomm::compression
