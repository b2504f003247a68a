#pragma once
// Core's control plane between the ranks of one host. The transport's
// shared memory leaves each rank a control area it never reads
// (ShmGroup::control); core lays it out here: the operation each rank runs
// (its announcement), the call check's slots, and the flag a failed rank
// raises. Messages carry the rest of the control plane (abort notices:
// AbortChannel; call checks between hosts: CallCheck).
#include <atomic>
#include <cstdint>

#include "algorithms/algorithm.hpp"
#include "transport/call_signature.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::core {

/// The layout of one rank's control area. Each field sits on its own cache
/// line: a rank writes only its own area, and readers poll single lines.
struct HostControlBlock {
  /// The operation this rank is running, whatever its algorithm: sequence
  /// number + 1 (0: none yet) and its call signature (a CallSignature as
  /// words, guarded by announcedSeq like a seqlock). Lets host-local peers
  /// see a mismatched call even when no message would ever match, and name
  /// the field that differs.
  alignas(64) std::atomic<uint64_t> announcedSeq;
  alignas(64) std::atomic<uint64_t> announcedSignature[sizeof(transport::CallSignature) / 8];
  /// The call check between host-local neighbours (see call_check.hpp):
  /// this rank's signatures for the next rank, in slot seq % kCheckSlots.
  /// Word 0 holds seq + 1 and is written last (0: empty); a slot is
  /// rewritten only after the next rank took what it held (or a later one).
  static constexpr uint64_t kCheckSlots = 16;
  alignas(64) std::atomic<uint64_t> checkSlot[kCheckSlots][sizeof(transport::CallSignature) / 8];
  /// seq + 1 of the last signature this rank took from the previous rank.
  alignas(64) std::atomic<uint64_t> checkTaken;
  /// Non-zero once this rank's communicator failed. A host-local peer looks
  /// at it before each operation: a failed rank's staged data would
  /// otherwise let the peer's next shared-memory call complete, however
  /// late its abort notice arrives over the network.
  alignas(64) std::atomic<uint64_t> failed;
};
static_assert(sizeof(HostControlBlock) <= transport::ShmGroup::kControlBytes, "host control block too large");
static_assert(alignof(HostControlBlock) <= 64, "the control area is aligned to a cache line only");

/// A view of the host's control areas through one ShmGroup (its local
/// indices); every operation is lock-free and never blocks. A view over no
/// group (one rank on its host, or shared memory off) has no peers: it
/// announces nothing and sees no failed peer.
class HostControl final : public algorithms::HostAnnouncements {
 public:
  explicit HostControl(const transport::ShmGroup* group = nullptr) : g_(group) {}
  const transport::ShmGroup* group() const { return g_; }

  /// Publishes the operation this rank starts.
  void announce(const transport::CallSignature& call);
  /// The signature local rank `local` announced for operation `seq`; false
  /// when it has not announced that operation (yet, or any more).
  bool announced(int local, uint64_t seq, transport::CallSignature* out) const override;
  /// Call check: publishes `call` for local rank `next`; false while the
  /// slot it goes to still holds a signature `next` has not taken.
  bool putCheck(int next, const transport::CallSignature& call);
  /// Call check: the signature local rank `previous` published for
  /// operation `seq`, if it has.
  bool takeCheck(int previous, uint64_t seq, transport::CallSignature* out);
  /// Tells the host-local peers that this rank's communicator failed.
  void markFailed();
  /// Communicator rank of a host-local peer whose communicator failed, or -1.
  int failedPeer() const;

  /// Rank `local`'s control area, as laid out here.
  HostControlBlock& block(int local) const { return *static_cast<HostControlBlock*>(g_->control(local)); }

 private:
  const transport::ShmGroup* g_;
};

}  // namespace gradcomm::core
