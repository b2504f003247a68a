#include "capi/p2p_schedule.hpp"

#include <cstring>
#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::capi {
namespace {

class P2pSchedule : public algorithms::Schedule {
 public:
  P2pSchedule(std::vector<P2pTransfer> transfers, const algorithms::RunContext& ctx)
      : transfers_(std::move(transfers)), ctx_(ctx) {}

  bool advance() override {
    bool moved = false;
    if (!posted_) {
      post();
      posted_ = true;
      moved = true;
    }
    for (size_t i = 0; i < requests_.size();) {
      if (requests_[i].request->test()) {
        requests_[i] = std::move(requests_.back());
        requests_.pop_back();
        moved = true;
      } else {
        ++i;
      }
    }
    return moved;
  }
  bool done() const override { return posted_ && requests_.empty(); }
  std::string waitingFor() const override {
    if (requests_.empty()) return "nothing";
    const P2pTransfer& t = transfers_[requests_.front().index];
    return std::string(t.send ? "send to" : "recv from") + " rank " + std::to_string(t.peer) + " (" +
           std::to_string(t.bytes) + " bytes, point-to-point message " + std::to_string(t.message) + ")";
  }
  std::vector<int> awaitedPeers() const override {
    std::vector<int> peers;
    for (const auto& r : requests_) {
      if (!transfers_[r.index].send) peers.push_back(transfers_[r.index].peer);
    }
    return peers;
  }

 private:
  struct Pending {
    size_t index;
    transport::RequestPtr request;
  };

  void post() {
    const int self = ctx_.transport->rank();
    std::vector<size_t> selfSends, selfRecvs;
    for (size_t i = 0; i < transfers_.size(); ++i) {
      const P2pTransfer& t = transfers_[i];
      if (t.peer == self) {
        (t.send ? selfSends : selfRecvs).push_back(i);
        continue;
      }
      transport::Tag tag = ctx_.tag;
      // 14 bits is the narrowest message field of any transport's tag; the
      // number only has to tell apart transfers in flight at one time.
      tag.message = t.message & 0x3fffu;
      Pending p{i, t.send ? ctx_.transport->isend(t.peer, t.data, t.bytes, tag)
                          : ctx_.transport->irecv(t.peer, t.data, t.bytes, tag)};
      requests_.push_back(std::move(p));
    }
    // The frontend checked that these pair up one to one with equal sizes.
    for (size_t k = 0; k < selfSends.size() && k < selfRecvs.size(); ++k) {
      const P2pTransfer& s = transfers_[selfSends[k]];
      const P2pTransfer& r = transfers_[selfRecvs[k]];
      if (s.bytes && s.data != r.data) std::memmove(r.data, s.data, s.bytes);
    }
  }

  std::vector<P2pTransfer> transfers_;
  algorithms::RunContext ctx_;
  std::vector<Pending> requests_;
  bool posted_ = false;
};

}  // namespace

algorithms::SchedulePtr makeP2pSchedule(std::vector<P2pTransfer> transfers, const algorithms::RunContext& ctx) {
  return algorithms::makeSchedule<P2pSchedule>(ctx.workspace, std::move(transfers), ctx);
}

}  // namespace gradcomm::capi
