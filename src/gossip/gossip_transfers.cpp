#include "gossip/gossip_transfers.hpp"

#include <exception>
#include <set>

namespace gradcomm::gossip {

bool GossipTransfers::advance(transport::Transport& /*transport*/) { return advanceTransfers(true); }

bool GossipTransfers::advanceAll() { return advanceTransfers(false); }

bool GossipTransfers::advanceTransfers(bool oldestReceiveOnly) {
  bool moved = false;
  std::set<int> waiting;  // senders whose oldest pending receive is still incomplete
  for (auto* list : {&sends_, &receives_}) {
    const bool receives = list == &receives_;
    for (auto& t : *list) {
      if (t.done) continue;
      if (receives && oldestReceiveOnly && waiting.count(t.peer)) continue;
      try {
        if (t.request->test()) {
          t.done = true;
          moved = true;
        } else if (receives) {
          waiting.insert(t.peer);
        }
      } catch (const std::exception& e) {
        // A failed push or pull (a dead peer) is the averager's to handle:
        // it removes the peer; the engine and its collectives go on.
        t.error = e.what();
        t.done = true;
        moved = true;
      }
    }
  }
  if (moved) recount();
  return moved;
}

void GossipTransfers::post(transport::Transport& transport, bool isSend, uint64_t seq, int peer,
                           std::shared_ptr<std::vector<char>> buffer) {
  Transfer t;
  t.seq = seq;
  t.peer = peer;
  t.buffer = std::move(buffer);
  transport::Tag tag;
  tag.seq = seq;
  tag.message = transport::Tag::kGossip;
  try {
    t.request = isSend ? transport.isend(peer, t.buffer->data(), t.buffer->size(), tag)
                       : transport.irecv(peer, t.buffer->data(), t.buffer->size(), tag);
  } catch (const std::exception& e) {
    // Posting to a peer already known dead fails at once.
    t.error = e.what();
    t.done = true;
  }
  (isSend ? sends_ : receives_).push_back(std::move(t));
  recount();
}

std::vector<Transfer> GossipTransfers::takeFinishedReceives() {
  std::vector<Transfer> out;
  for (auto it = receives_.begin(); it != receives_.end();) {
    if (it->done) {
      out.push_back(std::move(*it));
      it = receives_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<Transfer> GossipTransfers::takeFailedSends() {
  std::vector<Transfer> failed;
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (it->done) {
      if (!it->error.empty()) failed.push_back(std::move(*it));
      it = sends_.erase(it);
    } else {
      ++it;
    }
  }
  return failed;
}

void GossipTransfers::abandonAll() {
  abandonIf(true, [](const Transfer&) { return true; });
  abandonIf(false, [](const Transfer&) { return true; });
  sends_.clear();
  receives_.clear();
  recount();
}

size_t GossipTransfers::bufferBytes() const {
  std::set<const std::vector<char>*> seen;
  size_t bytes = 0;
  for (const auto* list : {&sends_, &receives_}) {
    for (const auto& t : *list) {
      if (!t.done && t.buffer && seen.insert(t.buffer.get()).second) bytes += t.buffer->size();
    }
  }
  return bytes;
}

void GossipTransfers::recount() {
  size_t n = 0;
  for (const auto* list : {&sends_, &receives_}) {
    for (const auto& t : *list) n += t.done ? 0 : 1;
  }
  inFlight_.store(n, std::memory_order_relaxed);
}

}  // namespace gradcomm::gossip
