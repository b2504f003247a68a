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

std::string OperationState::describe() const {
  if (!algo) return customWhat + " #" + std::to_string(seq) + " (algorithm " + algorithm + ")";
  const bool reduces = call.collective == Collective::kAllreduce || call.collective == Collective::kReduce ||
                       call.collective == Collective::kReduceScatter;
  return std::string(toString(call.collective)) + " #" + std::to_string(seq) + " (" + toString(call.type) +
         (reduces ? std::string(" ") + toString(call.op) : std::string()) + ", " + std::to_string(call.count) +
         " elements, algorithm " + algorithm + ")";
}

algorithms::SchedulePtr OperationState::makeSchedule() const {
  return algo ? algo->schedule(call, ctx) : custom(ctx);
}

void OperationState::rethrowIfFailed() const {
  if (status.load(std::memory_order_acquire) == kFailed && error) std::rethrow_exception(error);
}

}  // namespace gradcomm::detail
