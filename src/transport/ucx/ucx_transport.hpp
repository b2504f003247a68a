#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/bootstrap.hpp"
#include "transport/shm_group.hpp"
#include "transport/transport.hpp"

namespace gradcomm::transport {

/// How a Tag, the sender's rank and the message kind are packed into a
/// 64-bit UCX tag. A receive names its source through the tag (UCX tag
/// matching is per worker, not per endpoint).
struct UcxTagLayout {
  static constexpr int kMessageBits = 14;
  static constexpr int kFingerprintBits = 9;
  static constexpr int kSeqBits = 14;
  /// Tag::comm: the group a message belongs to (communicators split from
  /// one another share the worker).
  static constexpr int kCommBits = 10;
  static constexpr int kRankBits = 16;  // + 1 control bit = 64
  static constexpr uint64_t kControlBit = uint64_t{1} << 63;
  static constexpr int kMaxRanks = 1 << kRankBits;

  static uint64_t data(int source, const Tag& tag);
  /// Control messages: kinds in the message bits.
  static constexpr uint32_t kAbort = 0;  ///< carries Tag::kAbort messages
  static constexpr uint32_t kHello = 1;
  static constexpr uint32_t kCallCheck = 2;  ///< carries Tag::kCallCheck messages
  static constexpr uint32_t kGossip = 3;     ///< carries Tag::kGossip messages (the push number in the sequence bits)
  static uint64_t control(int source, uint32_t kind);
  /// Matches a control message of one kind and group from any source.
  static uint64_t anySourceMask();
  /// Mask that matches a data tag exactly.
  static constexpr uint64_t kFullMask = ~uint64_t{0};
  /// Mask of the control bit, the source, the group and the sequence number: a probe
  /// with it finds a peer's message for an operation whatever its fingerprint.
  static uint64_t sourceAndSeqMask();
  static uint32_t fingerprintOf(uint64_t tag);
};

/// Point-to-point over UCX's tag API (ucp): one context and worker per
/// communicator, worker addresses exchanged through the bootstrap,
/// endpoints with peer error handling. UCX picks its transports (shared
/// memory, CMA, TCP, RDMA) from UCX_TLS and UCX_NET_DEVICES as usual; large
/// messages go through its rendezvous protocol straight from and into the
/// caller's buffers. Progress is driven by whoever tests a request (the
/// progress engine), no extra thread.
class UcxTransport : public Transport {
 public:
  /// Collective over `boot`. With shmChunkBytes > 0 and several ranks on
  /// this host, also maps gradcomm's own shared-memory segment (for the
  /// shm algorithm). Throws TransportError when UCX cannot start or finds no
  /// usable transport (the message names UCX_TLS).
  UcxTransport(Bootstrap& boot, size_t shmChunkBytes,
               std::chrono::milliseconds connectTimeout = std::chrono::seconds(60));
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  int rank() const override;
  int size() const override;
  std::string name() const override { return "ucx"; }
  RequestPtr isend(int peer, const void* data, size_t bytes, const Tag& tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, const Tag& tag) override;
  bool probeMismatch(int peer, const Tag& expected) override;
  RequestPtr irecvAny(void* data, size_t capacity, const Tag& tag) override;
  ShmGroup* sharedMemory() override;
  size_t sharedMemoryChunkBytes() const override { return shmChunkBytes_; }
  bool abandonedTransfersPending() override;
  /// The hosts as the exchanged host keys say.
  HostLayout hostLayout() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<ShmGroup> shm_;
  size_t shmChunkBytes_ = 0;
};

/// UCX's version ("1.13.1") and the transports and devices its context
/// would use here under the current UCX_TLS / UCX_NET_DEVICES (for
/// gradcomm-info); "unavailable: why" when UCX does not start.
std::string ucxVersion();
std::string ucxTransportsFound();

}  // namespace gradcomm::transport
