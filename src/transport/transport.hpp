#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradcomm/types.hpp"
#include "transport/call_signature.hpp"

namespace gradcomm::transport {

class ShmGroup;

/// Identifies one message of one operation. Transports map it onto their own
/// tag space; a receive matches only a send with an equal tag.
struct Tag {
  uint64_t seq = 0;          ///< operation sequence number on the communicator
  uint32_t fingerprint = 0;  ///< hash of the call signature: equal on all ranks iff the calls match
  uint32_t message = 0;      ///< message index within the operation
  /// The group (communicator split from another) the message belongs to,
  /// 0 for the communicator the transport was formed for. Communicators
  /// split from one another share one transport; a receive matches only a
  /// send of the same group, whatever the other fields.
  uint32_t comm = 0;
  /// The message index of the call check: each rank sends its operation's
  /// CallSignature to the next rank (fingerprint 0, so mismatched calls
  /// still match). Algorithms never use it; transports must keep it apart
  /// from data messages whatever their tag space (MPI: its own channel).
  /// Receives on this channel accept a message shorter than their buffer
  /// (Request::received() says how long), and every message on it starts
  /// with the sender's CallSignature: the check's own, or an algorithm's
  /// signed message (a signature followed by data, see RunContext), so a
  /// receiver can always name the call its peer made. At most one message
  /// per ordered pair of ranks per operation.
  static constexpr uint32_t kCallCheck = UINT32_MAX;
  /// The message index of gossip pushes (src/gossip): `seq` is then the
  /// push's number on its sender-receiver pair, and the fingerprint takes no part. Transports keep them
  /// apart from collective messages and call checks, since gossip runs
  /// beside the operation FIFO and its messages may arrive at any time.
  static constexpr uint32_t kGossip = UINT32_MAX - 1;
  /// The message index of abort notices (core's AbortChannel): text that
  /// any rank may send at any time, received by Transport::irecvAny; seq
  /// and fingerprint take no part. Transports keep them apart from every
  /// other message.
  static constexpr uint32_t kAbort = UINT32_MAX - 2;
  /// A call check, gossip push or abort notice: never a data message.
  bool control() const { return message == kCallCheck || message == kGossip || message == kAbort; }
};

/// An asynchronous send or receive. Dropping an incomplete request cancels
/// it where the transport can (receives) and abandons it otherwise.
class Request {
 public:
  virtual ~Request() = default;
  /// True once complete; never blocks. Throws MismatchError naming the
  /// count when a message's size differs from the receive's (the ranks'
  /// calls differ), on every transport, and TransportError when the
  /// transfer failed (a peer that went away).
  virtual bool test() = 0;
  /// The bytes a completed receive got: its size, except on the call-check
  /// channel (Tag::kCallCheck) and for irecvAny, where a message may be shorter.
  virtual size_t received() const = 0;
  /// The sender of a completed receive posted with irecvAny; -1 for
  /// requests of other kinds.
  virtual int source() const { return -1; }
};
using RequestPtr = std::unique_ptr<Request>;

/// The MPI passthrough collectives of the "native" algorithm. Counts are
/// elements; ops are never kAvg (the caller divides).
class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;
  /// Completes with a MismatchError naming the field that differs unless
  /// every rank passed the same call; `what` describes this rank's call.
  virtual RequestPtr agree(const CallSignature& call, const std::string& what) = 0;
  virtual RequestPtr allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op) = 0;
  virtual RequestPtr broadcast(void* buffer, size_t count, DataType type, int root) = 0;
  virtual RequestPtr reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root) = 0;
  virtual RequestPtr allgather(const void* in, void* out, size_t count, DataType type) = 0;
  virtual RequestPtr reduceScatter(const void* in, void* out, size_t count, DataType type, ReduceOp op) = 0;
  virtual RequestPtr barrier() = 0;
};

/// What a transport that also offers its engine's own collectives (the MPI
/// transport) implements beside Transport; the "native" algorithm asks for
/// it (nativeCollectives), and Transport itself stays the data plane.
class NativeProvider {
 public:
  virtual ~NativeProvider() = default;
  virtual NativeCollectives& native() = 0;
};

/// Point-to-point, asynchronous, byte-oriented. Algorithms see only this.
/// All calls on one Transport are made by one thread at a time (the
/// progress engine serialises them).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  virtual RequestPtr isend(int peer, const void* data, size_t bytes, const Tag& tag) = 0;
  virtual RequestPtr irecv(int peer, void* data, size_t bytes, const Tag& tag) = 0;

  /// True when a message from `peer` for operation `expected.seq` (of
  /// group `expected.comm`) is waiting whose fingerprint differs: the peer
  /// issued a different call. (What host-local peers announce in shared
  /// memory is core's to read: core::HostControl.)
  virtual bool probeMismatch(int peer, const Tag& expected) = 0;
  /// A receive of a message from any rank on `tag` (Tag::kAbort; the
  /// group and message index match, nothing else), into a buffer of
  /// `capacity` bytes; the message may be shorter (Request::received()),
  /// and Request::source() names its sender.
  virtual RequestPtr irecvAny(void* data, size_t capacity, const Tag& tag) = 0;

  /// True while transfers abandoned by failed operations may still write
  /// into their buffers: the memory they target must outlive the transport.
  virtual bool abandonedTransfersPending() { return false; }

  /// A transport of its own for the group `members` (ranks of this
  /// transport, listed in the group's rank order), formed by the members
  /// together (non-members do not call it); null when this transport has
  /// none to offer, and the group's messages then travel over this one,
  /// kept apart by Tag::comm (see GroupTransport). The MPI transport makes
  /// a light one on an MPI communicator of the members (its tags have no
  /// room for a group).
  virtual std::unique_ptr<Transport> subgroup(const std::vector<int>& members) {
    (void)members;
    return nullptr;
  }

  /// Shared memory with the other ranks of this host, or null (one rank per
  /// host, or disabled with GRADCOMM_SHM=0).
  virtual ShmGroup* sharedMemory() { return nullptr; }
  /// The bytes per rank of the hosts' shared-memory buffers
  /// (GRADCOMM_SHM_CHUNK; the same on every rank), also on a rank alone on
  /// its host, which has no group; 0 with shared memory off. Lets a rank
  /// without a group decide as the ranks of other hosts do.
  virtual size_t sharedMemoryChunkBytes() const { return 0; }
};

/// Which ranks share a host, as a transport found out while it was set up
/// (MPI's shared-memory split, UCX's host keys, the in-process world's
/// settings). Its creator hands it to the communicator, which builds its
/// TopologyView from it once; `Transport` itself answers no host questions.
struct HostLayout {
  int size = 0;  ///< ranks of the communicator
  /// Every host's ranks (each ascending, hosts ordered by their lowest
  /// rank), equal on every rank; empty when unknown (the view then puts
  /// every rank on its own host).
  std::vector<std::vector<int>> hosts;
  std::string hostName = "localhost";  ///< a label for this rank's host
};

/// Groups ranks into hosts: `hostOf[r]` is any value equal for exactly the
/// ranks that share a host. Hosts come out ordered by their lowest rank.
inline std::vector<std::vector<int>> groupHosts(const std::vector<long long>& hostOf) {
  std::vector<std::vector<int>> hosts;
  std::vector<long long> ids;
  for (size_t r = 0; r < hostOf.size(); ++r) {
    size_t h = 0;
    while (h < ids.size() && ids[h] != hostOf[r]) ++h;
    if (h == ids.size()) {
      ids.push_back(hostOf[r]);
      hosts.emplace_back();
    }
    hosts[h].push_back(static_cast<int>(r));
  }
  return hosts;
}

/// The inverse of `hosts` (as groupHosts makes it): every rank's host
/// index, up to the highest rank named; -1 for a rank no host names.
inline std::vector<long long> hostIndex(const std::vector<std::vector<int>>& hosts) {
  std::vector<long long> hostOf;
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (int r : hosts[h]) {
      if (static_cast<size_t>(r) >= hostOf.size()) hostOf.resize(static_cast<size_t>(r) + 1, -1);
      hostOf[static_cast<size_t>(r)] = static_cast<long long>(h);
    }
  }
  return hostOf;
}

/// The MPI passthrough collectives of `t`, or null when it has none.
inline NativeCollectives* nativeCollectives(Transport& t) {
  auto* p = dynamic_cast<NativeProvider*>(&t);
  return p ? &p->native() : nullptr;
}

}  // namespace gradcomm::transport
