#pragma once
// The call check: the guarantee that ranks which issue different calls find
// out, whatever the algorithm. Each operation sends its CallSignature to the
// next rank and completes only once the previous rank's signature arrived
// and equals its own; wherever calls differ, some rank's predecessor
// differs from it, and that rank fails with a MismatchError naming the
// field. Between ranks of one host the signature goes through shared memory
// (a slot in the sender's control block, a few cache lines), otherwise as a
// message that transports keep apart from data (Tag::kCallCheck).
#include <string>
#include <vector>

#include "transport/call_signature.hpp"
#include "transport/transport.hpp"

namespace gradcomm::core {

class HostControl;

class CallCheck {
 public:
  /// Starts the check of `mine` (kept by reference until done or reset).
  /// With `slots` (where the communicator numbers the host's control
  /// areas), host-local neighbours exchange through its call-check slots.
  void start(transport::Transport& t, const transport::CallSignature& mine, HostControl* slots);
  /// Moves it on without blocking; true when anything moved. Throws a
  /// MismatchError (whose text starts with `what`) when the previous
  /// rank's call differs.
  bool advance(const std::string& what);
  bool done() const { return !sendPending_ && !recvPending_; }
  /// Abandons whatever is pending (cancels its requests).
  void reset();
  /// Hands the receive buffer to algorithms::keepForever (a receive that
  /// could not be cancelled may still write into it).
  void abandonMemory();
  /// "the call signature of rank 3", or empty.
  std::string waitingFor() const;

 private:
  transport::Transport* t_ = nullptr;
  HostControl* slots_ = nullptr;
  const transport::CallSignature* mine_ = nullptr;
  int next_ = -1, previous_ = -1;            // communicator ranks
  int nextLocal_ = -1, previousLocal_ = -1;  // in slots_, or -1: by message
  bool sendPending_ = false, recvPending_ = false;
  transport::RequestPtr send_, recv_;
  transport::CallSignature theirs_;
  /// The message from the previous rank: its signature, or a signed
  /// message (signature + data) when its call runs signed messages.
  std::vector<char> inbox_;
};

}  // namespace gradcomm::core
