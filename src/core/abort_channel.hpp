#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace gradcomm::core {

/// Abort notices: how a rank whose communicator failed tells every other
/// rank of the context why, so they fail with its reason instead of
/// waiting for data that will not come. Built on the transport's data plane
/// alone: one receive from any rank kept posted (Tag::kAbort), and one send
/// per peer when this rank fails. Best effort and never blocking: a dead
/// peer's send is skipped or left incomplete. Calls are serialised with the
/// transport's (the engine's drive lock; the creating thread before the
/// engine exists).
class AbortChannel {
 public:
  /// The longest reason sent; longer ones are cut.
  static constexpr size_t kMaxText = 960;

  /// Posts the receive; `t` must outlive the channel.
  explicit AbortChannel(transport::Transport& t);
  ~AbortChannel();
  AbortChannel(const AbortChannel&) = delete;
  AbortChannel& operator=(const AbortChannel&) = delete;

  /// Tells every other rank that this rank failed, with `reason`.
  void broadcast(const std::string& reason);
  /// A notice from another rank, if one arrived: "rank R: reason". Each
  /// notice is reported once.
  std::optional<std::string> poll();

 private:
  void post();
  void pollSends();

  transport::Transport& t_;
  std::vector<char> buffer_ = std::vector<char>(kMaxText + 64);
  transport::RequestPtr recv_;  // null once the receive itself failed: no more notices
  std::vector<transport::RequestPtr> sends_;   // unfinished
  std::vector<std::vector<char>> texts_;       // one per broadcast, read by its sends
};

}  // namespace gradcomm::core
