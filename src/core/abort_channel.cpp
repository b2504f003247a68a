#include "core/abort_channel.hpp"

#include <algorithm>

#include "algorithms/workspace.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::core {
namespace {

transport::Tag abortTag() {
  transport::Tag tag;
  tag.message = transport::Tag::kAbort;
  return tag;
}

}  // namespace

AbortChannel::AbortChannel(transport::Transport& t) : t_(t) { post(); }

AbortChannel::~AbortChannel() {
  pollSends();
  // What a dropped transfer may still touch (a receive the transport could
  // not take back, a send still going) is left allocated: a few hundred
  // bytes per peer, after failures only.
  recv_.reset();
  for (auto& s : sends_) s.request.reset();
  if (!t_.abandonedTransfersPending()) return;
  algorithms::keepForever(std::move(buffer_));
  for (auto& s : sends_) algorithms::keepForever(std::move(s.text));
}

void AbortChannel::post() {
  std::fill(buffer_.begin(), buffer_.end(), '\0');
  recv_ = t_.irecvAny(buffer_.data(), buffer_.size() - 1, abortTag());
}

void AbortChannel::broadcast(const std::string& reason) {
  for (int peer = 0; peer < t_.size(); ++peer) {
    if (peer == t_.rank()) continue;
    const size_t n = std::min(reason.size(), kMaxText);
    Send s{std::vector<char>(reason.begin(), reason.begin() + static_cast<std::ptrdiff_t>(n)), nullptr};
    try {
      s.request = t_.isend(peer, s.text.data(), s.text.size(), abortTag());
    } catch (const Error&) {
      continue;  // a peer already gone
    }
    sends_.push_back(std::move(s));
  }
  // One look at each sets them moving (a transport may progress only when
  // asked), since a failing rank may not look again before it exits.
  pollSends();
}

void AbortChannel::pollSends() {
  for (auto& s : sends_) {
    try {
      if (s.request->test()) s.request.reset();
    } catch (const Error&) {
      s.request.reset();  // a dead peer
    }
  }
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), [](const Send& s) { return !s.request; }), sends_.end());
}

std::optional<std::string> AbortChannel::poll() {
  pollSends();  // keep them moving; forget those done
  if (!recv_) return std::nullopt;
  bool done = false;
  try {
    done = recv_->test();
  } catch (const Error&) {
    recv_.reset();  // the receive itself failed: no notice, and none to come
    return std::nullopt;
  }
  if (!done) return std::nullopt;
  const size_t n = std::min(recv_->received(), buffer_.size() - 1);
  std::string text = "rank " + std::to_string(recv_->source()) + ": " + std::string(buffer_.data(), n);
  post();
  return text;
}

}  // namespace gradcomm::core
