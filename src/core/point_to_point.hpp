#pragma once
// Communicator::send, recv and pointToPoint on the progress engine. The
// engine runs one operation at a time, so a send that waits for its
// receiver must not keep this rank's own receives queued behind it (isend +
// irecv to the same peer on both ranks would deadlock). A channel is one
// point-to-point operation that keeps taking new transfers while it runs:
// calls issued while it is open join it and are posted at once. It closes
// when every transfer in it completed, or when a collective is issued
// (collectives and point-to-point keep their issue order, as with NCCL).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "core/operation.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm::detail {

/// The state behind one Work of point-to-point transfers: finished when
/// the last of them completed, or failed with the channel.
struct P2pCompletion {
  std::shared_ptr<OperationState> state;
  std::atomic<size_t> remaining{0};
  std::atomic<bool> finished{false};
  /// Finishes `state` once (later calls do nothing).
  void finish(std::exception_ptr e);
  /// One transfer completed; the last finishes the Work.
  void transferDone();
};

/// One send or receive.
struct P2pTransfer {
  bool send = false;
  int peer = 0;
  void* data = nullptr;
  size_t count = 0;
  DataType type = DataType::kUInt8;
  size_t bytes = 0;
  int tag = 0;  ///< in [0, Communicator::kMaxTag]
  /// Numbers the transfers between this rank and `peer` in one direction
  /// with one tag, so the k-th send matches the peer's k-th receive.
  uint32_t sequence = 0;
  std::shared_ptr<P2pCompletion> completion;
};

/// Transfers issued together, run as one operation of the progress engine.
class P2pChannel : public std::enable_shared_from_this<P2pChannel> {
 public:
  /// Adds the transfers (all or none); false when the channel has closed
  /// (start a new one).
  bool add(const std::vector<P2pTransfer>& transfers);
  /// Takes no more transfers (a collective was issued after them).
  void close();
  /// The schedule that runs the channel's transfers (once, by the engine).
  algorithms::SchedulePtr makeSchedule(const algorithms::RunContext& ctx);
  /// The channel's operation failed with `e`: it closes and fails the Works
  /// of every transfer that has not completed.
  void fail(std::exception_ptr e);

 private:
  friend class P2pChannelSchedule;
  std::mutex mu_;
  std::vector<P2pTransfer> transfers_;  // guarded by mu_
  bool closed_ = false;                 // guarded by mu_
};

}  // namespace gradcomm::detail
