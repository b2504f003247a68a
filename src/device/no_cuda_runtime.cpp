// Builds without CUDA: there is no CUDA runtime to make.
#include "device/runtime.hpp"

namespace gradcomm::device {
std::shared_ptr<Runtime> makeCudaRuntime() { return nullptr; }
}  // namespace gradcomm::device
