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
  sends_.clear();
  if (!t_.abandonedTransfersPending()) return;
  algorithms::keepForever(std::move(buffer_));
  for (auto& text : texts_) algorithms::keepForever(std::move(text));
}

void AbortChannel::post() {
  std::fill(buffer_.begin(), buffer_.end(), '\0');
  recv_ = t_.irecvAny(buffer_.data(), buffer_.size() - 1, abortTag());
}

void AbortChannel::broadcast(const std::string& reason) {
  // Kept until the channel goes (a rank broadcasts once or twice, when it fails).
  const auto end = reason.begin() + static_cast<std::ptrdiff_t>(std::min(reason.size(), kMaxText));
  const std::vector<char>& text = texts_.emplace_back(reason.begin(), end);
  for (int peer = 0; peer < t_.size(); ++peer) {
    if (peer == t_.rank()) continue;
    try {
      sends_.push_back(t_.isend(peer, text.data(), text.size(), abortTag()));
    } catch (const Error&) {
      // a peer already gone
    }
  }
  // One look at each sets them moving (a transport may progress only when
  // asked), since a failing rank may not look again before it exits.
  pollSends();
}

void AbortChannel::pollSends() {
  for (auto& s : sends_) {
    try {
      if (s->test()) s.reset();
    } catch (const Error&) {
      s.reset();  // a dead peer
    }
  }
  sends_.erase(std::remove(sends_.begin(), sends_.end(), nullptr), sends_.end());
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
