#include "transport/shm_group.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "gradcomm/error.hpp"
#include "transport/transport.hpp"

namespace gradcomm::transport {
namespace {

constexpr const char* kPrefix = "gradcomm-";

std::string errnoText(int e) { return std::strerror(e); }

}  // namespace

size_t ShmGroup::strideFor(size_t bufferBytes) {
  const size_t page = 4096;
  const size_t buf = (bufferBytes + page - 1) / page * page;
  return kBlockBytes + 2 * buf;
}

ShmGroup::ShmGroup(std::vector<int> ranks, int localRank, size_t bufferBytes, char* base, std::shared_ptr<void> owner)
    : ranks_(std::move(ranks)),
      localRank_(localRank),
      bufferBytes_(bufferBytes),
      stride_(strideFor(bufferBytes)),
      base_(base),
      owner_(std::move(owner)) {
  static_assert(sizeof(ShmRankBlock) <= kBlockBytes, "control block too large");
}

ShmRankBlock& ShmGroup::block(int local) const {
  return *reinterpret_cast<ShmRankBlock*>(base_ + static_cast<size_t>(local) * stride_);
}

char* ShmGroup::buffer(int local, int which) const {
  return base_ + static_cast<size_t>(local) * stride_ + kBlockBytes +
         static_cast<size_t>(which) * ((stride_ - kBlockBytes) / 2);
}

bool ShmGroup::alive(int local) const {
  const pid_t pid = block(local).pid;
  if (pid <= 0 || pid == getpid()) return true;
  return ::kill(pid, 0) == 0 || errno != ESRCH;
}

void ShmGroup::publish(int b, uint64_t rid, uint32_t fingerprint) {
  ShmRankBlock& me = block(localRank_);
  ShmRankBlock::Mailbox& box = me.mailbox[b];
  box.fingerprint = fingerprint;
  // Release, not relaxed: a peer may read this value before `ready` below
  // shows the round (when it asks about the round this mailbox held two
  // rounds ago); it must then also see the reads the value stands for.
  box.consumedAtStage.store(static_cast<uint32_t>(me.consumed.load(std::memory_order_relaxed)),
                            std::memory_order_release);
  box.ready.store(rid, std::memory_order_release);
}

bool ShmGroup::finishedReading(int q, uint64_t rid) const {
  const ShmRankBlock& peer = block(q);
  const ShmRankBlock::Mailbox& box = peer.mailbox[(rid + 1) & 1];
  // Read like a seqlock: the value belongs to round rid + 1's staging when
  // `ready` shows that round before and after. A rank stages a round only
  // after its peers finished reading the one two before it (its own
  // reading trails its staging by the few rounds a call pipelines), so the
  // value is within a few rounds of rid and its low 32 bits compare safely.
  // A value from a later staging is larger: still a true answer. That
  // happens: a rank that finished a wave of the hierarchical allreduce
  // stages the next wave's first two rounds at once, so the value can come
  // from round rid + 3's staging while `ready` still shows rid + 1. Hence
  // acquire on the value itself (paired with its release in publish), not
  // only on `ready`: the answer carries the peer's reads whichever staging
  // wrote it (tests/inproc/test_shm_threads.cpp). Acquire also keeps the
  // second look at `ready` after it, as a fence would.
  if (box.ready.load(std::memory_order_acquire) == rid + 1) {
    const uint32_t seen = box.consumedAtStage.load(std::memory_order_acquire);
    if (box.ready.load(std::memory_order_relaxed) == rid + 1 &&
        static_cast<int32_t>(seen - static_cast<uint32_t>(rid)) >= 0) {
      return true;
    }
  }
  return peer.consumed.load(std::memory_order_acquire) >= rid;
}

int ShmGroup::peerStillReading(uint64_t rid) const {
  if (rid <= 2) return -1;
  for (int q = 0; q < localSize(); ++q) {
    if (q != localRank_ && !finishedReading(q, rid - 2)) return q;
  }
  return -1;
}

void ShmGroup::announce(const CallSignature& call) {
  ShmRankBlock& b = block(localRank_);
  uint64_t words[sizeof(CallSignature) / 8];
  std::memcpy(words, &call, sizeof words);
  // Seqlock: readers that see the same sequence number before and after
  // copying the words got a consistent signature.
  b.announcedSeq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < sizeof words / 8; ++i) b.announcedSignature[i].store(words[i], std::memory_order_relaxed);
  b.announcedSeq.store(call.seq + 1, std::memory_order_release);
}

bool ShmGroup::announced(int local, uint64_t seq, CallSignature* out) const {
  const ShmRankBlock& b = block(local);
  if (b.announcedSeq.load(std::memory_order_acquire) != seq + 1) return false;
  uint64_t words[sizeof(CallSignature) / 8];
  for (size_t i = 0; i < sizeof words / 8; ++i) words[i] = b.announcedSignature[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (b.announcedSeq.load(std::memory_order_relaxed) != seq + 1) return false;
  std::memcpy(out, words, sizeof words);
  return true;
}

bool ShmGroup::putCheck(int next, const CallSignature& call) {
  auto& slot = block(localRank_).checkSlot[call.seq % ShmRankBlock::kCheckSlots];
  // Free once `next` took what it holds (operations that skip the check
  // leave gaps in the sequence numbers, so compare with the slot itself).
  const uint64_t held = slot[0].load(std::memory_order_relaxed);
  if (held != 0 && block(next).checkTaken.load(std::memory_order_acquire) < held) return false;
  uint64_t words[sizeof(CallSignature) / 8];
  std::memcpy(words, &call, sizeof words);
  for (size_t i = 1; i < sizeof words / 8; ++i) slot[i].store(words[i], std::memory_order_relaxed);
  slot[0].store(call.seq + 1, std::memory_order_release);
  return true;
}

bool ShmGroup::takeCheck(int previous, uint64_t seq, CallSignature* out) {
  const auto& slot = block(previous).checkSlot[seq % ShmRankBlock::kCheckSlots];
  if (slot[0].load(std::memory_order_acquire) != seq + 1) return false;
  // The slot stays as it is until checkTaken says we are done with it.
  uint64_t words[sizeof(CallSignature) / 8];
  words[0] = seq;
  for (size_t i = 1; i < sizeof words / 8; ++i) words[i] = slot[i].load(std::memory_order_relaxed);
  std::memcpy(out, words, sizeof words);
  block(localRank_).checkTaken.store(seq + 1, std::memory_order_release);
  return true;
}

int ShmGroup::localIndexOf(int rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == rank) return static_cast<int>(i);
  }
  return -1;
}

std::shared_ptr<ShmSegment> ShmSegment::create(size_t bytes) {
  removeStale();
  std::random_device rd;
  auto seg = std::shared_ptr<ShmSegment>(new ShmSegment());
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string name = "/" + std::string(kPrefix) + std::to_string(getpid()) + "-" + std::to_string(rd() & 0xFFFFFF);
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) throw TransportError("shm_open(" + name + ") failed: " + errnoText(errno) + " (is /dev/shm mounted?)");
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      ::close(fd);
      shm_unlink(name.c_str());
      throw TransportError("cannot size shared-memory segment " + name + " to " + std::to_string(bytes) +
                           " bytes: " + errnoText(e) + " (is /dev/shm large enough? set GRADCOMM_SHM_CHUNK lower or "
                           "GRADCOMM_SHM=0)");
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      shm_unlink(name.c_str());
      throw TransportError("mmap of shared-memory segment failed: " + errnoText(e));
    }
    seg->name_ = name;
    seg->data_ = static_cast<char*>(p);
    seg->bytes_ = bytes;
    seg->owner_ = true;
    seg->linked_ = true;
    return seg;
  }
  throw TransportError("could not find a free shared-memory segment name");
}

std::shared_ptr<ShmSegment> ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw TransportError("shm_open(" + name + ") failed on a peer: " + errnoText(errno));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw TransportError("mmap of shared-memory segment " + name + " failed: " + errnoText(e));
  auto seg = std::shared_ptr<ShmSegment>(new ShmSegment());
  seg->name_ = name;
  seg->data_ = static_cast<char*>(p);
  seg->bytes_ = bytes;
  return seg;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (data_) munmap(data_, bytes_);
}

void ShmSegment::unlink() {
  if (owner_ && linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

void ShmSegment::removeStale() {
  // Names are /dev/shm/gradcomm-<creator pid>-<random>. A segment whose
  // creator is gone and that nobody unlinked (a crash between creation and
  // the attach barrier) is garbage.
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    const std::string n = e->d_name;
    if (n.rfind(kPrefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(n.c_str() + std::strlen(kPrefix)));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) shm_unlink(("/" + n).c_str());
  }
  closedir(dir);
}

void Transport::announceTo(ShmGroup& g, const CallSignature& call) { g.announce(call); }

std::optional<CallSignature> Transport::announcedSignature(int peer, uint64_t seq) {
  ShmGroup* g = sharedMemory();
  const int local = g ? g->localIndexOf(peer) : -1;
  CallSignature sig;
  if (local < 0 || !g->announced(local, seq, &sig)) return std::nullopt;
  return sig;
}

bool Transport::announcedMismatch(int peer, const Tag& expected) {
  auto sig = announcedSignature(peer, expected.seq);
  return sig && sig->fingerprint() != expected.fingerprint;
}

}  // namespace gradcomm::transport
