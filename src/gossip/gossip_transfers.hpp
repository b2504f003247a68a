#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "transport/transport.hpp"

namespace gradcomm::gossip {

/// One gossip transfer: a push to a peer or a pre-posted receive from one,
/// with the buffer it reads or fills. `seq` numbers the pushes of one sender
/// to one receiver (its tag): the n-th receive posted for a sender matches
/// its n-th push here, whatever the two ranks' gossip clocks are.
struct Transfer {
  uint64_t seq = 0;
  int peer = 0;
  std::shared_ptr<std::vector<char>> buffer;  // shared by one step's pushes
  transport::RequestPtr request;
  bool done = false;
  std::string error;  // set when the transfer failed
};

/// The gossip transport piece: the engine's background task that owns
/// every gossip send and receive. Every member is used under the engine's
/// drive lock only (advance(), or inside ProgressEngine::withTransport()).
class GossipTransfers : public core::BackgroundTask {
 public:
  /// The engine's pass: every send, but per sender only its oldest pending
  /// receive (and the next ones once that completed). Pushes of one sender
  /// arrive in its step order, and each test may cost a progress call of the
  /// transport (with MPI's yield_when_idle, a sched_yield).
  bool advance(transport::Transport& transport) override;
  /// Tests every transfer (the averager's own pass, once per step).
  bool advanceAll();
  bool pending() const override { return inFlight_.load(std::memory_order_relaxed) > 0; }

  void post(transport::Transport& transport, bool isSend, uint64_t seq, int peer,
            std::shared_ptr<std::vector<char>> buffer);
  /// Finished receives (completed or failed), taken out.
  std::vector<Transfer> takeFinishedReceives();
  /// Finished sends: the failed ones are returned, the rest forgotten.
  std::vector<Transfer> takeFailedSends();
  /// Abandons unfinished transfers that match `drop` (their buffers are
  /// kept, since a transport may still touch them); returns how many receives went.
  template <typename Pred>
  size_t abandonIf(bool sends, Pred drop);
  /// The unfinished receives, for the caller's bookkeeping.
  const std::vector<Transfer>& receives() const { return receives_; }
  /// Bytes of the buffers of unfinished transfers (a push shared by several
  /// sends counted once).
  size_t bufferBytes() const;
  /// Abandons everything (destruction).
  void abandonAll();
  /// Buffers of abandoned transfers: the owner keeps them as long as the
  /// transport may still write into them.
  std::vector<std::shared_ptr<std::vector<char>>>& abandoned() { return abandoned_; }

 private:
  void recount();
  bool advanceTransfers(bool oldestReceiveOnly);
  std::vector<Transfer> sends_;
  std::vector<Transfer> receives_;
  std::vector<std::shared_ptr<std::vector<char>>> abandoned_;
  std::atomic<size_t> inFlight_{0};
};

template <typename Pred>
size_t GossipTransfers::abandonIf(bool sends, Pred drop) {
  auto& list = sends ? sends_ : receives_;
  size_t n = 0;
  for (auto it = list.begin(); it != list.end();) {
    if (!it->done && drop(*it)) {
      it->request.reset();  // cancels a receive where the transport can
      abandoned_.push_back(std::move(it->buffer));
      it = list.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  recount();
  return n;
}

}  // namespace gradcomm::gossip
