#include "p2p_channel.hpp"

#include <deque>

#include <c10/core/ScalarType.h>

#include "gradcomm/error.hpp"

namespace gradcomm::torch_backend {
namespace {

/// What a send tells its receiver before the data: the receiver compares it
/// with its own tensor before it takes the data, so a mismatch is named
/// (and fails both ranks) instead of truncating or misreading bytes.
struct Header {
  uint64_t bytes = 0;
  int64_t scalarType = -1;
};

/// The three messages of one transfer. A send's completion waits for the
/// receiver's acknowledgement, so it fails with the receiver when the
/// receiver rejects the header.
enum Kind : uint32_t { kHeader = 0, kData = 1, kAck = 2 };

/// 14 bits (the narrowest message field of any transport's tag): the kind,
/// the c10d tag and the low 9 bits of the per-(peer, tag) sequence number.
/// Transfers with equal message numbers in flight at once still match in
/// order: every transport matches equal tags first in, first out.
uint32_t messageOf(Kind kind, const P2pTransfer& t) {
  return (static_cast<uint32_t>(kind) << 12) | (static_cast<uint32_t>(t.tag) << 9) | (t.sequence & 0x1ffu);
}

std::string typeName(int64_t scalarType) {
  if (scalarType < 0 || scalarType >= static_cast<int64_t>(c10::ScalarType::NumOptions)) {
    return "dtype #" + std::to_string(scalarType);
  }
  return c10::toString(static_cast<c10::ScalarType>(scalarType));
}

}  // namespace

class P2pChannelSchedule : public algorithms::Schedule {
 public:
  P2pChannelSchedule(std::shared_ptr<P2pChannel> channel, const algorithms::RunContext& ctx)
      : channel_(std::move(channel)), ctx_(ctx) {}

  bool advance() override {
    bool moved = takeNew();
    for (auto& s : states_) {
      if (s.done) continue;
      moved = step(s) || moved;
    }
    return moved;
  }

  bool done() const override {
    if (remaining_ > 0) return false;
    // Closing under the lock: a transfer added after this check goes to a
    // new channel instead of one nobody runs any more.
    std::lock_guard<std::mutex> lock(channel_->mu_);
    if (channel_->transfers_.size() != states_.size()) return false;
    channel_->closed_ = true;
    return true;
  }

  std::string waitingFor() const override {
    for (const auto& s : states_) {
      if (s.done) continue;
      const P2pTransfer& t = s.transfer;
      std::string what = t.send ? "send to rank " : "recv from rank ";
      what += std::to_string(t.peer) + " (" + std::to_string(t.bytes) + " bytes of " + t.dtypeName + ", tag " +
              std::to_string(t.tag) + ", ";
      if (t.send) {
        what += "waiting for the receiver to take it: is rank " + std::to_string(t.peer) +
                " calling recv from this rank before its next collective?)";
      } else {
        what += "waiting for rank " + std::to_string(t.peer) + " to send it)";
      }
      return what;
    }
    return "nothing";
  }

  std::vector<int> awaitedPeers() const override {
    std::vector<int> peers;
    for (const auto& s : states_) {
      if (!s.done) peers.push_back(s.transfer.peer);
    }
    return peers;
  }

 private:
  struct State {
    P2pTransfer transfer;
    Header header;  ///< this rank's (send) or the sender's (recv)
    uint8_t ack = 0;
    std::vector<transport::RequestPtr> requests;  ///< of the current stage
    int stage = 0;                                ///< recv: 0 header, 1 data, 2 ack
    bool done = false;
  };

  transport::Tag tagFor(Kind kind, const P2pTransfer& t) const {
    transport::Tag tag = ctx_.tag;
    tag.message = messageOf(kind, t);
    return tag;
  }

  /// Starts the transfers added since the last call.
  bool takeNew() {
    std::vector<P2pTransfer> fresh;
    {
      std::lock_guard<std::mutex> lock(channel_->mu_);
      for (size_t i = states_.size() + fresh.size(); i < channel_->transfers_.size(); ++i) {
        fresh.push_back(channel_->transfers_[i]);
      }
    }
    for (auto& t : fresh) {
      states_.emplace_back();
      State& s = states_.back();
      s.transfer = std::move(t);
      ++remaining_;
      start(s);
    }
    return !fresh.empty();
  }

  void start(State& s) {
    transport::Transport& tr = *ctx_.transport;
    const P2pTransfer& t = s.transfer;
    if (t.send) {
      // Header, data and the wait for the acknowledgement go out at once.
      s.header.bytes = t.bytes;
      s.header.scalarType = t.scalarType;
      s.requests.push_back(tr.isend(t.peer, &s.header, sizeof(Header), tagFor(kHeader, t)));
      s.requests.push_back(tr.isend(t.peer, t.data, t.bytes, tagFor(kData, t)));
      s.requests.push_back(tr.irecv(t.peer, &s.ack, 1, tagFor(kAck, t)));
    } else {
      s.requests.push_back(tr.irecv(t.peer, &s.header, sizeof(Header), tagFor(kHeader, t)));
    }
  }

  /// True when a request of `s` completed.
  bool step(State& s) {
    bool moved = false;
    for (size_t i = 0; i < s.requests.size();) {
      if (s.requests[i]->test()) {
        s.requests[i] = std::move(s.requests.back());
        s.requests.pop_back();
        moved = true;
      } else {
        ++i;
      }
    }
    if (!s.requests.empty()) return moved;
    const P2pTransfer& t = s.transfer;
    if (t.send || s.stage == 2) {
      s.done = true;
      --remaining_;
      if (t.ticket) t.ticket->done.store(true);
      if (t.signal) t.signal->notify();
      return true;
    }
    transport::Transport& tr = *ctx_.transport;
    if (s.stage == 0) {
      if (s.header.bytes != t.bytes || s.header.scalarType != t.scalarType) {
        const size_t theirSize = c10::elementSize(static_cast<c10::ScalarType>(
            s.header.scalarType >= 0 && s.header.scalarType < static_cast<int64_t>(c10::ScalarType::NumOptions)
                ? s.header.scalarType
                : static_cast<int64_t>(c10::ScalarType::Byte)));
        const size_t mySize = c10::elementSize(static_cast<c10::ScalarType>(t.scalarType));
        throw InvalidArgument("rank " + std::to_string(tr.rank()) + ": recv from rank " + std::to_string(t.peer) +
                              " (tag " + std::to_string(t.tag) + "): rank " + std::to_string(t.peer) + " sent " +
                              std::to_string(s.header.bytes / theirSize) + " elements of " +
                              typeName(s.header.scalarType) + " (" + std::to_string(s.header.bytes) +
                              " bytes) but this rank's recv tensor holds " + std::to_string(t.bytes / mySize) +
                              " elements of " + t.dtypeName + " (" + std::to_string(t.bytes) +
                              " bytes): a send and its recv need the same dtype and number of elements");
      }
      s.requests.push_back(tr.irecv(t.peer, t.data, t.bytes, tagFor(kData, t)));
      s.stage = 1;
    } else {
      s.ack = 1;
      s.requests.push_back(tr.isend(t.peer, &s.ack, 1, tagFor(kAck, t)));
      s.stage = 2;
    }
    return true;
  }

  std::shared_ptr<P2pChannel> channel_;
  algorithms::RunContext ctx_;
  std::deque<State> states_;  // a deque: posted buffers (header, ack) must not move
  size_t remaining_ = 0;
};

bool P2pChannel::add(P2pTransfer t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  transfers_.push_back(std::move(t));
  return true;
}

void P2pChannel::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

algorithms::SchedulePtr P2pChannel::makeSchedule(const algorithms::RunContext& ctx) {
  return algorithms::makeSchedule<P2pChannelSchedule>(ctx.workspace, shared_from_this(), ctx);
}

}  // namespace gradcomm::torch_backend
