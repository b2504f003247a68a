#include "transport/inproc_transport.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gradcomm/error.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::transport {

struct InProcWorld::Transfer {
  int src = 0;
  int dst = 0;
  Tag tag;
  const void* sendData = nullptr;
  void* recvData = nullptr;
  size_t sendBytes = 0;
  size_t recvBytes = 0;
  bool matched = false;
  bool done = false;
  bool cancelled = false;
  int delay = 0;  // tests still to wait in chaos mode
  std::string error;
};

namespace {

constexpr int kAnySource = -1;

bool sameTag(const Tag& a, const Tag& b) {
  return a.comm == b.comm && a.seq == b.seq && a.fingerprint == b.fingerprint && a.message == b.message;
}

std::string describe(const Tag& t) {
  return "operation " + std::to_string(t.seq) + ", message " + std::to_string(t.message);
}

}  // namespace

class InProcRequest : public Request {
 public:
  InProcRequest(std::shared_ptr<InProcWorld> world, std::shared_ptr<InProcWorld::Transfer> transfer, bool isSend)
      : world_(std::move(world)), transfer_(std::move(transfer)), isSend_(isSend) {}
  ~InProcRequest() override {
    if (!complete_) world_->cancel(transfer_, isSend_);
  }
  bool test() override {
    if (complete_) return true;
    complete_ = world_->test(transfer_);
    return complete_;
  }
  size_t received() const override { return !isSend_ && complete_ ? transfer_->sendBytes : 0; }
  int source() const override { return !isSend_ && complete_ ? transfer_->src : -1; }

 private:
  std::shared_ptr<InProcWorld> world_;
  std::shared_ptr<InProcWorld::Transfer> transfer_;
  bool isSend_;
  bool complete_ = false;
};

class InProcTransport : public Transport {
 public:
  InProcTransport(std::shared_ptr<InProcWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  std::string name() const override { return "inproc"; }

  RequestPtr isend(int peer, const void* data, size_t bytes, const Tag& tag) override {
    checkPeer(peer);
    auto t = world_->post(rank_, peer, true, const_cast<void*>(data), bytes, tag);
    return std::make_unique<InProcRequest>(world_, std::move(t), true);
  }
  RequestPtr irecv(int peer, void* data, size_t bytes, const Tag& tag) override {
    checkPeer(peer);
    auto t = world_->post(peer, rank_, false, data, bytes, tag);
    return std::make_unique<InProcRequest>(world_, std::move(t), false);
  }
  bool probeMismatch(int peer, const Tag& expected) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    for (const auto& t : world_->unmatchedSends_[rank_]) {
      if (t->src == peer && t->tag.comm == expected.comm && t->tag.seq == expected.seq && !t->tag.control() &&
          t->tag.fingerprint != expected.fingerprint) {
        return true;
      }
    }
    return false;
  }
  RequestPtr irecvAny(void* data, size_t capacity, const Tag& tag) override {
    auto t = world_->post(kAnySource, rank_, false, data, capacity, tag);
    return std::make_unique<InProcRequest>(world_, std::move(t), false);
  }
  ShmGroup* sharedMemory() override { return shm_.get(); }
  size_t sharedMemoryChunkBytes() const override { return world_->settings_.shmChunkBytes; }
  /// Maps this rank into its host's shared memory (created by the first rank).
  void attachSharedMemory() {
    const auto ranks = world_->hosts()[static_cast<size_t>(world_->hostOf(rank_))];
    const size_t chunk = world_->settings_.shmChunkBytes;
    if (chunk == 0 || ranks.size() < 2) return;
    const size_t bufferBytes = chunk * ranks.size();
    const size_t total = ShmGroup::strideFor(bufferBytes) * ranks.size();
    std::shared_ptr<char> memory;
    {
      std::lock_guard<std::mutex> lock(world_->mu_);
      auto& slot = world_->shmMemory_[static_cast<size_t>(ranks.front())];
      if (!slot) {
        char* p = static_cast<char*>(std::aligned_alloc(4096, (total + 4095) / 4096 * 4096));
        std::memset(p, 0, total);
        slot = std::shared_ptr<char>(p, [](char* q) { std::free(q); });
      }
      memory = slot;
    }
    int local = 0;
    while (ranks[static_cast<size_t>(local)] != rank_) ++local;
    shm_ = std::make_unique<ShmGroup>(ranks, local, bufferBytes, memory.get(), memory);
  }

 private:
  void checkPeer(int peer) const {
    if (peer < 0 || peer >= world_->size() || peer == rank_) {
      throw InternalError("inproc transport: invalid peer " + std::to_string(peer) + " on rank " +
                          std::to_string(rank_));
    }
  }
  std::shared_ptr<InProcWorld> world_;
  int rank_;
  std::unique_ptr<ShmGroup> shm_;
};

InProcWorld::InProcWorld(int size, Settings settings)
    : size_(size),
      settings_(settings),
      rng_(settings.seed),
      unmatchedSends_(size),
      unmatchedRecvs_(size),
      shmMemory_(size) {
  std::vector<long long> hostOf(settings.hostOfRank.begin(), settings.hostOfRank.end());
  if (hostOf.empty()) {
    std::vector<int> sizes = settings.hostSizes;
    if (sizes.empty()) {
      const int per = settings.ranksPerHost > 0 ? settings.ranksPerHost : size;
      for (int first = 0; first < size; first += per) sizes.push_back(std::min(per, size - first));
    }
    for (size_t h = 0; h < sizes.size(); ++h) {
      hostOf.insert(hostOf.end(), static_cast<size_t>(sizes[h]), static_cast<long long>(h));
    }
  }
  hosts_ = groupHosts(hostOf);
  for (long long h : hostIndex(hosts_)) hostOf_.push_back(static_cast<int>(h));
}

std::shared_ptr<InProcWorld> InProcWorld::create(int size, Settings settings) {
  if (size < 1) throw InvalidArgument("an in-process world needs at least one rank, got " + std::to_string(size));
  if (!settings.hostOfRank.empty() && settings.hostOfRank.size() != static_cast<size_t>(size)) {
    throw InvalidArgument("the in-process placement names hosts for " + std::to_string(settings.hostOfRank.size()) +
                          " ranks, not " + std::to_string(size));
  }
  if (settings.hostOfRank.empty() && !settings.hostSizes.empty()) {
    long long total = 0;
    for (int n : settings.hostSizes) {
      if (n < 1) throw InvalidArgument("an in-process host needs at least one rank, got " + std::to_string(n));
      total += n;
    }
    if (total != size) {
      throw InvalidArgument("the in-process host sizes add up to " + std::to_string(total) + " ranks, not " +
                            std::to_string(size));
    }
  }
  return std::shared_ptr<InProcWorld>(new InProcWorld(size, settings));
}

std::unique_ptr<Transport> InProcWorld::transport(int rank) {
  if (rank < 0 || rank >= size_) {
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside the in-process world of " +
                          std::to_string(size_));
  }
  auto t = std::make_unique<InProcTransport>(shared_from_this(), rank);
  t->attachSharedMemory();
  return t;
}

std::shared_ptr<InProcWorld::Transfer> InProcWorld::post(int src, int dst, bool isSend, void* data, size_t bytes,
                                                        const Tag& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  // Look for the oldest unmatched counterpart with the same (src, tag); an
  // abort notice's receive takes any source.
  auto fill = [&](Transfer& t) {
    if (isSend) t.sendData = data; else t.recvData = data;
    (isSend ? t.sendBytes : t.recvBytes) = bytes;
  };
  auto& others = isSend ? unmatchedRecvs_[dst] : unmatchedSends_[dst];
  for (auto it = others.begin(); it != others.end(); ++it) {
    auto t = *it;
    if ((t->src != src && t->src != kAnySource && src != kAnySource) || !sameTag(t->tag, tag)) continue;
    others.erase(it);
    if (t->src == kAnySource) t->src = src;
    fill(*t);
    t->matched = true;
    // A call-check or abort-notice receive takes any message that fits its buffer.
    const bool upTo = tag.message == Tag::kCallCheck || tag.message == Tag::kAbort;
    const bool fits = upTo ? t->sendBytes <= t->recvBytes : t->sendBytes == t->recvBytes;
    if (!fits) {
      t->error = "message size mismatch: rank " + std::to_string(src) + " sent " + std::to_string(t->sendBytes) +
                 " bytes, rank " + std::to_string(dst) + " expected " + std::to_string(t->recvBytes) + " (" +
                 describe(tag) + "); ranks disagree about the call's count";
    }
    t->delay = settings_.chaos ? static_cast<int>(rng_() % 4) : 0;
    return t;
  }
  auto t = std::make_shared<Transfer>();
  t->src = src;
  t->dst = dst;
  t->tag = tag;
  fill(*t);
  (isSend ? unmatchedSends_ : unmatchedRecvs_)[dst].push_back(t);
  return t;
}

bool InProcWorld::test(const std::shared_ptr<Transfer>& t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!t->error.empty()) throw MismatchError(t->error);  // only size mismatches set it
  if (t->done) return true;
  if (t->cancelled) {
    throw TransportError("rank " + std::to_string(t->src) + " -> " + std::to_string(t->dst) +
                         ": the other side abandoned the transfer (" + describe(t->tag) + ")");
  }
  if (!t->matched) return false;
  if (t->delay > 0) {
    --t->delay;
    return false;
  }
  if (t->sendBytes) std::memcpy(t->recvData, t->sendData, t->sendBytes);
  t->done = true;
  return true;
}

void InProcWorld::cancel(const std::shared_ptr<Transfer>& t, bool isSend) {
  std::lock_guard<std::mutex> lock(mu_);
  if (t->done) return;
  // A receive its owner abandoned first may already be freed: never copy into it.
  if (isSend && t->matched && t->error.empty() && !t->cancelled) {
    // A matched send still delivers its data (as MPI's eager sends do): the
    // buffer is valid until this returns, and the receiver may need the
    // message to tell what went wrong.
    if (t->sendBytes) std::memcpy(t->recvData, t->sendData, t->sendBytes);
    t->done = true;
    return;
  }
  if (!t->matched) {
    auto& q = isSend ? unmatchedSends_[t->dst] : unmatchedRecvs_[t->dst];
    if (const auto it = std::find(q.begin(), q.end(), t); it != q.end()) q.erase(it);
  }
  t->cancelled = true;
}

}  // namespace gradcomm::transport
