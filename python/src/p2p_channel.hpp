#pragma once
// c10d send/recv on gradcomm's progress engine. The engine runs one
// operation at a time, so a send that waits for its receiver must not keep
// this rank's own receives queued behind it (isend + irecv to the same peer
// on both ranks would deadlock). A channel is one point-to-point operation
// that keeps taking new transfers while it runs: calls issued while it is
// open join it and are posted at once. It closes when every transfer in it
// completed, or when a collective is issued (collectives and point-to-point
// keep their issue order, as with NCCL).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace gradcomm::torch_backend {

/// Wakes the thread that completes point-to-point Works: the schedule
/// pokes it as each transfer completes. Its mutex also guards the list of
/// calls that thread watches (the process group's).
struct P2pSignal {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;  ///< guarded by mu; bumped by notify()
  void notify() {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++generation;
    }
    cv.notify_all();
  }
};

/// Set once one transfer completed (so its Work need not wait for the
/// others in its channel).
struct P2pTicket {
  std::atomic<bool> done{false};
};

/// One send or receive of a c10d point-to-point call.
struct P2pTransfer {
  bool send = false;
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;
  int64_t scalarType = 0;  ///< at::ScalarType, checked against the peer's
  std::string dtypeName;   ///< for error messages
  /// Numbers the transfers between this rank and `peer` in one direction
  /// with one c10d tag, so the k-th send matches the peer's k-th receive.
  uint32_t sequence = 0;
  int tag = 0;  ///< the c10d tag, in [0, kMaxTag]
  std::shared_ptr<P2pTicket> ticket;  ///< set done when this transfer completed
  std::shared_ptr<P2pSignal> signal;  ///< notified then
};

/// Transfers issued together, run as one operation of the progress engine.
class P2pChannel : public std::enable_shared_from_this<P2pChannel> {
 public:
  /// Largest c10d tag the backend takes: a transport's tag has room for
  /// three bits of it next to the message kind and sequence number.
  static constexpr int kMaxTag = 7;

  /// Adds a transfer; false when the channel has closed (start a new one).
  bool add(P2pTransfer t);
  /// Takes no more transfers (a collective was issued after them).
  void close();
  /// The schedule that runs the channel's transfers (once, by the engine).
  algorithms::SchedulePtr makeSchedule(const algorithms::RunContext& ctx);

 private:
  friend class P2pChannelSchedule;
  std::mutex mu_;
  std::vector<P2pTransfer> transfers_;  // guarded by mu_
  bool closed_ = false;                 // guarded by mu_
};

}  // namespace gradcomm::torch_backend
