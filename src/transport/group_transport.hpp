#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/shm_group.hpp"
#include "transport/transport.hpp"

namespace gradcomm::transport {

/// A group of some of another transport's ranks, over that transport's
/// connections: ranks are renumbered (member i is the base's rank
/// members[i]) and every message carries the group's Tag::comm, so the
/// group's messages never meet another group's. It owns nothing but the
/// rank map: the base transport (and the engine that drives it) stay the
/// context's.
class GroupTransport : public Transport {
 public:
  /// `release` runs when the group is destroyed (it frees the group's id).
  GroupTransport(Transport& base, std::vector<int> members, uint32_t comm, std::function<void()> release = {});
  ~GroupTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string name() const override { return base_.name(); }

  RequestPtr isend(int peer, const void* data, size_t bytes, const Tag& tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, const Tag& tag) override;
  bool probeMismatch(int peer, const Tag& expected) override;
  /// The sender comes back as a group rank.
  RequestPtr irecvAny(void* data, size_t capacity, const Tag& tag) override;

  bool abandonedTransfersPending() override { return base_.abandonedTransfersPending(); }

  /// The base's shared memory, renumbered for the group (see
  /// ShmGroup::renumbered), when every host's ranks of the base that hold
  /// a member are all members; `chunkBytes` as the base's. Without it the
  /// group has none, and its same-host messages use the base transport.
  void shareMemory(std::unique_ptr<ShmGroup> shm, size_t chunkBytes) {
    shm_ = std::move(shm);
    chunkBytes_ = chunkBytes;
  }
  ShmGroup* sharedMemory() override { return shm_.get(); }
  size_t sharedMemoryChunkBytes() const override { return chunkBytes_; }

  /// The base transport's rank of group rank `r`.
  int baseRank(int r) const { return members_[static_cast<size_t>(r)]; }
  const std::vector<int>& members() const { return members_; }

 private:
  Tag mapped(const Tag& tag) const {
    Tag t = tag;
    t.comm = comm_;
    return t;
  }
  int checkedPeer(int peer) const;

  Transport& base_;
  std::vector<int> members_;
  uint32_t comm_;
  int rank_ = -1;
  std::function<void()> release_;
  std::unique_ptr<ShmGroup> shm_;
  size_t chunkBytes_ = 0;
};

/// The shared memory a group of `members` (ranks of a base transport, in
/// the group's order) may use: the base's `shm`, renumbered for the group
/// (ShmGroup::renumbered), when on every host that holds a member the
/// members are all of the base's ranks there, listed in the base's order
/// (`hosts`: every host's base ranks). `*chunkBytes` is then `baseChunk`,
/// else 0 and the result null: every member decides alike, from the same
/// lists. Null with a chunk size where the hosts are whole but this rank
/// has no segment (alone on its host).
std::unique_ptr<ShmGroup> sharedMemoryForGroup(const std::vector<std::vector<int>>& hosts, const ShmGroup* shm,
                                               size_t baseChunk, const std::vector<int>& members, size_t* chunkBytes);

}  // namespace gradcomm::transport
