#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/workspace.hpp"
#include "core/abort_channel.hpp"
#include "core/call_check.hpp"
#include "core/host_control.hpp"
#include "core/operation.hpp"
#include "gradcomm/error.hpp"
#include "transport/transport.hpp"

namespace gradcomm::core {

struct EngineSettings {
  std::chrono::nanoseconds timeout{std::chrono::seconds(300)};  ///< 0: none
  int pollSpins = 200;
  /// Between polls that find nothing, hand the core over (sched_yield)
  /// instead of spinning: set when ranks outnumber cores (GRADCOMM_WAIT).
  bool yieldWhenIdle = false;
  std::chrono::nanoseconds pollMaxSleep{std::chrono::microseconds(200)};
  /// How long the idle thread keeps polling before it blocks.
  std::chrono::nanoseconds linger{std::chrono::milliseconds(5)};
  /// Called (from any thread, possibly more than once) when a peer may
  /// have died or hung: an operation timed out, a transfer failed, or a
  /// peer's notice says one of these. The job cannot end cleanly any more;
  /// the creator decides what that means (communicatorFromMpi: an MPI that
  /// gradcomm initialised is aborted at exit instead of finalised).
  std::function<void(const std::string& reason)> onPeerFailure;
};

/// Exponential back-off of an idle polling loop: spin, then yield, then
/// sleep for doubling intervals up to a cap, so that a waiting rank does
/// not steal the core the computation needs.
class Backoff {
 public:
  /// `yields`: how many sched_yield()s come between spinning and sleeping. A
  /// yield returns at once when the core is free and hands the core over
  /// when another thread (a peer rank on an oversubscribed host) needs it.
  Backoff(int spins, int yields, std::chrono::nanoseconds maxSleep)
      : spins_(spins), yields_(yields), maxSleep_(maxSleep) {}
  void reset() { idle_ = 0; }
  /// One idle look.
  void idle();

 private:
  int spins_;
  int yields_;
  std::chrono::nanoseconds maxSleep_;
  int idle_ = 0;
};

/// Transfers that run beside the operation FIFO (gossip pushes and their
/// pre-posted receives): the engine advances every registered task on each
/// drive pass, on the driving thread, so Transport calls stay serialised,
/// while no operation in the queue waits for them and they wait for none.
class BackgroundTask {
 public:
  virtual ~BackgroundTask() = default;
  /// Tests the task's transfers; true when something completed. Must not
  /// throw: a failed transfer is the task's business, never the engine's.
  virtual bool advance(transport::Transport& transport) = 0;
  /// True while transfers are in flight (the engine keeps polling).
  virtual bool pending() const = 0;
};

/// Runs a communicator's operations one at a time, in submission order.
/// Progress is driven by the communicator's background thread or, while a
/// caller waits, by the waiting thread itself (whoever holds the drive
/// lock), so a small collective completes with no thread hand-off.
/// Failures are sticky: the first failed operation aborts the engine, its
/// peers are told, and every later operation fails with the same reason.
class ProgressEngine : public std::enable_shared_from_this<ProgressEngine> {
 public:
  /// `aborts` runs over `transport`.
  ProgressEngine(std::unique_ptr<transport::Transport> transport, std::unique_ptr<AbortChannel> aborts,
                 EngineSettings settings);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  void start();
  /// Queues `op`. With `eager`, when the engine was idle the submitting
  /// thread takes one progress step at once (a small collective whose peers
  /// are already there completes before submit returns, and its first
  /// messages leave without waiting for a thread hand-off).
  void submit(const std::shared_ptr<detail::OperationState>& op, bool eager = false);
  /// What submitInline() came to.
  struct InlineOutcome {
    bool taken = false;     ///< false: nothing ran; submit the call as an operation
    bool finished = false;  ///< it completed; start and end are its times
    detail::Clock::time_point start{};
    detail::Clock::time_point end{};
    /// Taken and not finished: the operation that carries on (peers were
    /// late) or that failed.
    std::shared_ptr<detail::OperationState> op;
  };
  /// Runs a small call through `algo`'s inline path in the calling thread,
  /// with no operation object, when the engine is idle (see
  /// Algorithm::runsInline). `ctx` carries the call's tag, `signature` its
  /// sequence number. An operation is made only when the peers are late
  /// (it carries the rest of the schedule) or the call fails.
  InlineOutcome submitInline(const algorithms::Algorithm& algo, const algorithms::CollectiveCall& call,
                             algorithms::RunContext ctx, const transport::CallSignature& signature, size_t bytes);
  /// Drives progress until `op` finishes or `deadline` passes; true if finished.
  bool waitFor(detail::OperationState& op, detail::Clock::time_point deadline);
  /// Stops the thread and fails whatever is pending with `reason`.
  void shutdown(const std::string& reason);
  /// Marks the engine failed (as if an operation had failed) and tells peers.
  void abort(ErrorCode code, const std::string& reason, bool tellPeers);
  /// Throws (with the original error code) if the engine has failed.
  void throwIfFailed() const;
  /// Something outside the queue failed in a way another rank's failure
  /// explains (a device call's group was aborted): waits up to `wait` for
  /// that rank's abort notice; when one comes, the engine fails with it,
  /// which this throws (a RemoteError naming the rank and its reason).
  void throwIfPeerAborted(std::chrono::milliseconds wait, const std::string& what);

  transport::Transport& transport() { return *transport_; }
  const transport::Transport& transport() const { return *transport_; }
  /// The host's control plane over the transport's shared memory, or null
  /// (no host-local peers).
  const algorithms::HostAnnouncements* hostAnnouncements() const { return host_.group() ? &host_ : nullptr; }

  /// Keeps `what` until the engine ends (a group's transport, destroyed
  /// while its operations were still queued).
  void retain(std::shared_ptr<void> what) {
    std::lock_guard<std::mutex> lock(queueMu_);
    retained_.push_back(std::move(what));
  }

  /// The device whose work the operations queue from now on (the context's,
  /// set before its first device call is queued): the engine's thread makes
  /// it current before it drives them, so that its CUDA calls never create
  /// a context on another device (device 0, every thread's default).
  void serveDevice(int device) { device_.store(device, std::memory_order_relaxed); }

  /// Registers a task the engine advances on every drive pass.
  void addBackground(std::shared_ptr<BackgroundTask> task);
  /// Unregisters `task`; when this returns, no thread is inside its advance().
  void removeBackground(const BackgroundTask* task);
  /// How often the background thread has left a sleep on its condition
  /// variable: each is a context switch, which on a host whose ranks
  /// outnumber its cores takes the core a peer rank needs.
  uint64_t threadWakeups() const { return threadWakeups_.load(std::memory_order_relaxed); }
  /// Yield mode: the longest a napping thread sleeps before it looks for
  /// work nobody drives (a submitted call whose caller does not wait, when
  /// earlier callers did wait at once; otherwise submission wakes it).
  static constexpr std::chrono::milliseconds kNap{10};

  /// Runs `fn` with the transport while no thread drives (the background
  /// task's own posting and cancelling of transfers), then wakes the thread
  /// so posted transfers progress while the caller computes.
  void withTransport(const std::function<void(transport::Transport&)>& fn);

 private:
  void threadMain();
  bool drive();  // requires driveMu_
  /// Fails the active operation because host-local rank `peer` marked its
  /// communicator failed, with the peer's reason when its notice arrives.
  [[noreturn]] void throwPeerFailed(int peer);
  /// A failed peer's notice, polled for up to 50 ms (failure paths only: the
  /// peer's reason is the cause, and it may still be on its way).
  std::optional<std::string> awaitNotice();
  /// Requires driveMu_: nothing is active or queued and the engine has not
  /// failed or stopped, so a submitting caller may take the first step.
  bool idleForCaller() const { return !failedFlag_.load() && !stop_.load() && !busy_.load() && !active_; }
  /// After a submitting caller stepped and let go of driveMu_: the thread
  /// leaves the rest to the caller for a grace period from `droveAt`, and
  /// is woken if `unfinished` (the call, if it goes on) needs it.
  void afterCallerStep(detail::Clock::time_point droveAt, const detail::OperationState* unfinished);
  /// Polls of the peers an inline call makes before it hands its schedule
  /// to the engine (a few microseconds when spinning).
  static constexpr int kInlinePatience = 256;
  /// Spins before a waiting thread starts to yield: none when ranks
  /// outnumber cores.
  int spinsBeforeYield() const { return settings_.yieldWhenIdle ? 0 : settings_.pollSpins; }
  /// The thread's loop when ranks outnumber cores (yieldWhenIdle).
  void threadMainYielding();
  /// Wakes a thread that sleeps on queueCv_ (blocked or napping).
  void wakeThread();
  bool driveBackground();  // requires driveMu_
  bool backgroundPending() const;
  /// One step of whoever polls: drive if the lock is free, then back off
  /// unless something moved.
  void driveOrBackOff(Backoff& backoff);
  void checkHealth(detail::Clock::time_point now);
  void nameMismatch();  // throws the call check's named MismatchError if it comes in time
  std::string waitingFor() const;
  void failActive(std::exception_ptr e);
  /// Marks the engine failed (queueMu_ held, not failed yet).
  void recordFailureLocked(ErrorCode code, const std::string& reason);
  /// The active operation, its schedule released (driving thread).
  std::shared_ptr<detail::OperationState> takeActive();
  void failQueued();

  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<AbortChannel> aborts_;  // over transport_; calls guarded by driveMu_
  HostControl host_;                      // over transport_'s shared memory
  algorithms::Workspace workspace_;  // driving thread only
  EngineSettings settings_;

  mutable std::mutex queueMu_;
  std::condition_variable queueCv_;
  std::deque<std::shared_ptr<detail::OperationState>> queue_;
  bool failed_ = false;
  std::atomic<bool> failedFlag_{false};  // mirrors failed_ for a lock-free check
  ErrorCode failCode_ = ErrorCode::kInternal;
  std::string failReason_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};     // an operation is active or queued
  std::atomic<bool> blocked_{false};  // the thread sleeps on queueCv_ (set under queueMu_)
  std::atomic<int> waiters_{0};       // callers inside waitFor(): they drive, the thread stands aside
  /// Yield mode: the thread naps on queueCv_ (at most kNap) instead of
  /// polling.
  std::atomic<bool> standingAside_{false};
  bool wakeUp_ = false;                     // a wake-up for the napping thread (guarded by queueMu_)
  std::atomic<uint64_t> threadWakeups_{0};  // the thread left a sleep on queueCv_
  /// Yield mode: callers wait for their calls as soon as they submit them
  /// (a blocking style), so an eager submission need not wake the napping
  /// thread. Set by a wait that begins within the grace period of its
  /// call's submission; cleared when the thread finds a call nobody drives.
  std::atomic<bool> callerWaitsAtOnce_{false};
  /// When a caller last drove (an eager submission or the end of a wait),
  /// in steady-clock nanoseconds: the thread leaves the next step to that
  /// caller for a short while, since it is about to wait or submit again.
  std::atomic<int64_t> callerDroveAt_{0};
  /// A submitting caller takes its call's first step (eager submission).
  std::atomic<bool> callerSubmitting_{false};

  std::mutex driveMu_;
  std::shared_ptr<detail::OperationState> active_;   // guarded by driveMu_
  detail::Clock::time_point lastProgress_{};          // guarded by driveMu_
  detail::Clock::time_point lastHealthCheck_{};       // guarded by driveMu_
  detail::Clock::time_point lastProbe_{};             // guarded by driveMu_
  detail::Clock::time_point lastAbortPoll_{};         // guarded by driveMu_
  CallCheck check_;                                   // the active operation's; guarded by driveMu_
  std::vector<std::shared_ptr<BackgroundTask>> background_;  // guarded by driveMu_ and backgroundMu_
  mutable std::mutex backgroundMu_;                   // lets the thread read background_ without driveMu_
  std::atomic<bool> hasBackground_{false};

  std::thread thread_;
  std::atomic<int> device_{-1};  // serveDevice()
  int threadDevice_ = -1;        // the device made current on thread_; guarded by driveMu_
  std::vector<std::shared_ptr<void>> retained_;  // guarded by queueMu_
};

}  // namespace gradcomm::core
