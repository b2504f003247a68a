#pragma once
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::core {
class ProgressEngine;
}

namespace gradcomm::detail {

using Clock = std::chrono::steady_clock;

/// One submitted collective, shared by its Work handles and the engine.
struct OperationState {
  /// Recycles the memory of finished operations (per thread), so a stream
  /// of small collectives does not pay the allocator for each one.
  static std::shared_ptr<OperationState> create();
  /// An operation for `call` run by `algo`: the sequence number comes from
  /// `signature.seq`, the fingerprint from `ctx.tag` (both already set).
  static std::shared_ptr<OperationState> forCall(const algorithms::Algorithm* algo,
                                                 const algorithms::CollectiveCall& call,
                                                 const algorithms::RunContext& ctx,
                                                 const transport::CallSignature& signature, size_t bytes);

  enum Status : int { kQueued, kRunning, kDone, kFailed };

  uint64_t seq = 0;
  uint32_t fingerprint = 0;  ///< signature.fingerprint(), equal on matching ranks
  transport::CallSignature signature;  ///< what the ranks agree on (seq included)
  std::string algorithm;     ///< custom operations only; see algorithmName()
  size_t bytes = 0;
  /// What runs: an algorithm on `call`, or a custom schedule factory.
  const algorithms::Algorithm* algo = nullptr;
  algorithms::CollectiveCall call;
  algorithms::RunContext ctx;  ///< workspace filled in by the engine at start
  std::function<algorithms::SchedulePtr(const algorithms::RunContext&)> custom;
  std::string customWhat;
  /// Point-to-point (ncclSend/ncclRecv): only some ranks take part, so it
  /// takes no sequence number of its own, announces nothing and is not
  /// probed for mismatched collectives.
  bool pointToPoint = false;
  algorithms::SchedulePtr schedule;
  /// A chunk of a call on device buffers (`call` is on its pinned host
  /// copy): the schedule waits for the chunk's copy in and queues its copy
  /// back. Null for host calls.
  std::shared_ptr<class StagedCall> staged;
  size_t stagedChunk = 0;
  /// A call on device buffers: what Work waits for on the device once the
  /// operation finished (the staged call's copies back, or the NCCL
  /// engine's kernel). Null for host calls.
  std::shared_ptr<class DeviceCompletion> deviceDone;

  std::atomic<int> status{kQueued};
  /// How it failed, set before status becomes kFailed. Kept as a code and
  /// a message, not as the exception: every waiter throws an exception of
  /// its own, so no exception object is shared between the thread that
  /// failed the operation and the threads that wait for it.
  ErrorCode errorCode = ErrorCode::kInternal;
  std::string errorMessage;

  /// Timed phases, appended by the schedule on the driving thread.
  std::vector<std::pair<std::string, std::pair<Clock::time_point, Clock::time_point>>> phases;

  Clock::time_point queuedAt{};
  Clock::time_point startedAt{};
  Clock::time_point finishedAt{};

  std::weak_ptr<core::ProgressEngine> engine;

  /// The algorithm that runs (the catalog's name, or a custom label).
  const char* algorithmName() const { return algo ? algo->name() : algorithm.c_str(); }
  bool finished() const { return status.load(std::memory_order_acquire) >= kDone; }
  /// "allreduce #12 (float32 sum, 1000 elements, algorithm ring)", built on
  /// demand (only error messages and traces need it).
  std::string describe() const;
  /// Creates the schedule (on the driving thread).
  algorithms::SchedulePtr makeSchedule() const;
  /// Completes the operation; a non-null `e` fails it with e's error code
  /// and message (InternalError for exceptions that are not gradcomm's).
  void finish(std::exception_ptr e);
  /// Throws the operation's error (a fresh exception of the class of its
  /// code) if it failed.
  void rethrowIfFailed() const;
  /// Work::onComplete: runs `callback` when the operation finishes, or at
  /// once (on this thread) when it already did.
  void addCallback(std::function<void(std::exception_ptr)> callback);

 private:
  /// Runs `cb` with the outcome (the error as a fresh exception_ptr, or
  /// null), swallowing (and logging) what it throws.
  void runCallback(const std::function<void(std::exception_ptr)>& cb) const;
  std::mutex callbackMu_;
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;  // guarded by callbackMu_
  bool callbacksRan_ = false;                                        // guarded by callbackMu_
};

}  // namespace gradcomm::detail
