#include "transport/group_transport.hpp"

#include <algorithm>

#include "gradcomm/error.hpp"

namespace gradcomm::transport {

GroupTransport::GroupTransport(Transport& base, std::vector<int> members, uint32_t comm,
                               std::function<void()> release)
    : base_(base), members_(std::move(members)), comm_(comm), release_(std::move(release)) {
  const auto it = std::find(members_.begin(), members_.end(), base_.rank());
  if (it == members_.end()) {
    throw InternalError("a group transport formed on rank " + std::to_string(base_.rank()) + ", which is not a member");
  }
  rank_ = static_cast<int>(it - members_.begin());
}

GroupTransport::~GroupTransport() {
  if (release_) release_();
}

int GroupTransport::checkedPeer(int peer) const {
  if (peer < 0 || peer >= size()) {
    throw InternalError("group rank " + std::to_string(peer) + " is outside a group of " + std::to_string(size()));
  }
  return members_[static_cast<size_t>(peer)];
}

RequestPtr GroupTransport::isend(int peer, const void* data, size_t bytes, const Tag& tag) {
  return base_.isend(checkedPeer(peer), data, bytes, mapped(tag));
}

RequestPtr GroupTransport::irecv(int peer, void* data, size_t bytes, const Tag& tag) {
  return base_.irecv(checkedPeer(peer), data, bytes, mapped(tag));
}

bool GroupTransport::probeMismatch(int peer, const Tag& expected) {
  return base_.probeMismatch(checkedPeer(peer), mapped(expected));
}

RequestPtr GroupTransport::irecvAny(void* data, size_t capacity, const Tag& tag) {
  struct GroupReceive final : Request {
    GroupReceive(RequestPtr inner, std::vector<int> members) : inner(std::move(inner)), members(std::move(members)) {}
    bool test() override { return inner->test(); }
    size_t received() const override { return inner->received(); }
    int source() const override {
      const auto it = std::find(members.begin(), members.end(), inner->source());
      return it == members.end() ? -1 : static_cast<int>(it - members.begin());
    }
    RequestPtr inner;
    std::vector<int> members;
  };
  return std::make_unique<GroupReceive>(base_.irecvAny(data, capacity, mapped(tag)), members_);
}

std::unique_ptr<ShmGroup> sharedMemoryForGroup(const std::vector<std::vector<int>>& hosts, const ShmGroup* shm,
                                               size_t baseChunk, const std::vector<int>& members, size_t* chunkBytes) {
  *chunkBytes = 0;
  if (baseChunk == 0) return nullptr;
  const std::vector<long long> hostOf = hostIndex(hosts);
  std::vector<size_t> seen(hosts.size(), 0);
  std::vector<int> last(hosts.size(), -1);
  for (int m : members) {
    if (m < 0 || static_cast<size_t>(m) >= hostOf.size() || hostOf[static_cast<size_t>(m)] < 0) return nullptr;
    const auto h = static_cast<size_t>(hostOf[static_cast<size_t>(m)]);
    if (m < last[h]) return nullptr;
    last[h] = m;
    ++seen[h];
  }
  for (int m : members) {
    const auto h = static_cast<size_t>(hostOf[static_cast<size_t>(m)]);
    if (seen[h] != hosts[h].size()) return nullptr;
  }
  *chunkBytes = baseChunk;
  if (!shm) return nullptr;
  std::vector<int> ranks;
  for (int r : shm->ranks()) ranks.push_back(static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin()));
  return shm->renumbered(std::move(ranks));
}

}  // namespace gradcomm::transport
