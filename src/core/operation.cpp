#include "core/operation.hpp"

#include "base/log.hpp"
#include "core/device_staging.hpp"
#include "transport/call_signature.hpp"

#include <cstdlib>
#include <new>
#include <vector>

namespace gradcomm::detail {
namespace {

// A small per-thread free list of blocks for allocate_shared: operations
// are typically created and released on the caller's thread.
constexpr size_t kBlockBytes = 1024;
constexpr size_t kKeep = 32;

struct FreeList {
  std::vector<void*> blocks;
  ~FreeList() {
    for (void* b : blocks) ::operator delete(b);
  }
};
// initial-exec: the library is loaded at start-up, and this avoids a
// __tls_get_addr call per operation.
__attribute__((tls_model("initial-exec"))) thread_local FreeList freeList;

template <typename T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <typename U> PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes <= kBlockBytes && !freeList.blocks.empty()) {
      void* b = freeList.blocks.back();
      freeList.blocks.pop_back();
      return static_cast<T*>(b);
    }
    return static_cast<T*>(::operator new(bytes <= kBlockBytes ? kBlockBytes : bytes));
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) <= kBlockBytes && freeList.blocks.size() < kKeep) {
      freeList.blocks.push_back(p);
      return;
    }
    ::operator delete(p);
  }
  template <typename U> bool operator==(const PoolAllocator<U>&) const { return true; }
  template <typename U> bool operator!=(const PoolAllocator<U>&) const { return false; }
};

}  // namespace

std::shared_ptr<OperationState> OperationState::create() {
  return std::allocate_shared<OperationState>(PoolAllocator<OperationState>());
}

std::shared_ptr<OperationState> OperationState::forCall(const algorithms::Algorithm* algo,
                                                        const algorithms::CollectiveCall& call,
                                                        const algorithms::RunContext& ctx,
                                                        const transport::CallSignature& signature, size_t bytes) {
  auto op = create();
  op->seq = signature.seq;
  op->algo = algo;
  op->fingerprint = ctx.tag.fingerprint;
  op->signature = signature;
  op->bytes = bytes;
  op->call = call;
  op->ctx = ctx;
  return op;
}

void OperationState::finish(std::exception_ptr e) {
  // Waiters poll `status` (they drive progress themselves); the release
  // store publishes finishedAt and the error with it.
  finishedAt = Clock::now();
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      errorCode = err.code();
      errorMessage = err.what();
    } catch (const std::exception& err) {
      errorCode = ErrorCode::kInternal;
      errorMessage = err.what();
    } catch (...) {
      errorCode = ErrorCode::kInternal;
      errorMessage = "unknown error";
    }
  }
  status.store(e ? kFailed : kDone, std::memory_order_release);
  std::vector<std::function<void(std::exception_ptr)>> run;
  {
    std::lock_guard<std::mutex> lock(callbackMu_);
    callbacksRan_ = true;
    run.swap(callbacks_);
  }
  for (const auto& cb : run) runCallback(cb);
}

void OperationState::addCallback(std::function<void(std::exception_ptr)> callback) {
  if (!callback) return;
  {
    std::lock_guard<std::mutex> lock(callbackMu_);
    if (!callbacksRan_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  runCallback(callback);
}

void OperationState::runCallback(const std::function<void(std::exception_ptr)>& cb) const {
  try {
    cb(status.load(std::memory_order_acquire) == kFailed ? makeErrorPtr(errorCode, errorMessage) : nullptr);
  } catch (const std::exception& e) {
    core::log(core::LogLevel::kWarn, -1, "a Work::onComplete callback threw (ignored): " + std::string(e.what()));
  } catch (...) {
    core::log(core::LogLevel::kWarn, -1, "a Work::onComplete callback threw (ignored)");
  }
}

std::string OperationState::describe() const {
  if (!algo) return customWhat + " #" + std::to_string(seq) + " (algorithm " + algorithm + ")";
  return std::string(toString(call.collective)) + " #" + std::to_string(seq) + " (" + toString(call.type) +
         (transport::isReduction(call.collective) ? std::string(" ") + toString(call.op) : std::string()) + ", " + std::to_string(call.count) +
         " elements, algorithm " + algorithmName() + ")";
}

algorithms::SchedulePtr OperationState::makeSchedule() const {
  if (staged) {
    return stagedSchedule(staged, stagedChunk, [this] { return algo ? algo->schedule(call, ctx) : custom(ctx); });
  }
  return algo ? algo->schedule(call, ctx) : custom(ctx);
}

void OperationState::rethrowIfFailed() const {
  if (status.load(std::memory_order_acquire) == kFailed) rethrowAs(errorCode, errorMessage);
}

}  // namespace gradcomm::detail
