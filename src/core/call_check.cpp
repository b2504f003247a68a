#include "core/call_check.hpp"

#include <cstring>

#include "algorithms/workspace.hpp"
#include "gradcomm/error.hpp"
#include "core/host_control.hpp"

namespace gradcomm::core {

void CallCheck::start(transport::Transport& t, const transport::CallSignature& mine, HostControl* slots) {
  reset();
  const int p = t.size(), r = t.rank();
  if (p < 2) return;
  t_ = &t;
  mine_ = &mine;
  next_ = (r + 1) % p;
  previous_ = (r + p - 1) % p;
  slots_ = slots && slots->group() ? slots : nullptr;
  nextLocal_ = slots_ ? slots_->group()->localIndexOf(next_) : -1;
  previousLocal_ = slots_ ? slots_->group()->localIndexOf(previous_) : -1;
  sendPending_ = recvPending_ = true;
  transport::Tag tag;
  tag.seq = mine.seq;
  tag.message = transport::Tag::kCallCheck;
  if (previousLocal_ < 0) {
    // Room for a signed message: a previous rank whose call differs may
    // have sent one (its signature first).
    inbox_.resize(sizeof theirs_ + transport::kSignedPayloadLimit);
    recv_ = t.irecv(previous_, inbox_.data(), inbox_.size(), tag);
  }
  if (nextLocal_ < 0) send_ = t.isend(next_, mine_, sizeof *mine_, tag);
}

bool CallCheck::advance(const std::string& what) {
  bool moved = false;
  // The send first: the next rank needs it even when this one is about to fail.
  if (sendPending_) {
    const bool sent = nextLocal_ >= 0 ? slots_->putCheck(nextLocal_, *mine_) : send_->test();
    if (sent) {
      send_.reset();
      sendPending_ = false;
      moved = true;
    }
  }
  if (recvPending_) {
    const bool arrived = previousLocal_ >= 0 ? slots_->takeCheck(previousLocal_, mine_->seq, &theirs_) : recv_->test();
    if (arrived && previousLocal_ < 0) {
      if (recv_->received() < sizeof theirs_) {
        throw MismatchError(what + ": the call check from rank " + std::to_string(previous_) + " has " +
                            std::to_string(recv_->received()) +
                            " bytes, less than a call signature: the ranks run different versions of the library");
      }
      std::memcpy(&theirs_, inbox_.data(), sizeof theirs_);
    }
    if (arrived) {
      recv_.reset();
      recvPending_ = false;
      moved = true;
      if (!theirs_.sameCall(*mine_) || theirs_.seq != mine_->seq) {
        throw MismatchError(transport::mismatchMessage(t_->rank(), what, *mine_, previous_, &theirs_));
      }
    }
  }
  return moved;
}

void CallCheck::reset() {
  recv_.reset();  // cancels
  send_.reset();
  sendPending_ = recvPending_ = false;
}

void CallCheck::abandonMemory() { algorithms::keepForever(std::move(inbox_)); }

std::string CallCheck::waitingFor() const {
  if (recvPending_) return "the call signature of rank " + std::to_string(previous_);
  if (sendPending_) return "rank " + std::to_string(next_) + " to take this rank's call signature";
  return {};
}

}  // namespace gradcomm::core
