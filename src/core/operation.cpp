#include "core/operation.hpp"

namespace gradcomm::detail {

void OperationState::finish(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    finishedAt = Clock::now();
    error = e;
    status.store(e ? kFailed : kDone, std::memory_order_release);
  }
  cv.notify_all();
}

void OperationState::rethrowIfFailed() const {
  if (status.load(std::memory_order_acquire) == kFailed && error) std::rethrow_exception(error);
}

}  // namespace gradcomm::detail
