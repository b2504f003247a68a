#include "transport/shm_group.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <set>

#include "base/units.hpp"
#include "gradcomm/error.hpp"
#include "transport/transport.hpp"

namespace gradcomm::transport {
namespace {

constexpr const char* kPrefix = "gradcomm-";
constexpr const char* kShmDir = "/dev/shm";

using core::errnoText;

uint64_t pidNamespaceInode() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// ---- liveness locks ------------------------------------------------------------------
// A process's lock on its slot lives in the open file description of its
// segment descriptor, which fork() shares with the child: a child that
// outlived its parent (a data-loader worker) would keep the dead parent's
// lock. So every segment descriptor is listed here, and a forked child
// points each at /dev/null (dropping its share of the description while
// the number stays valid for the segment's destructor to close). A mapping
// holds the description too: segments are mapped MADV_DONTFORK, so a
// child has none (it must not use the parent's communicators anyway).

std::mutex gLockFdsMu;
std::set<int>* gLockFds = nullptr;  // guarded by gLockFdsMu; never freed (used at fork until exit)

void lockFdsBeforeFork() { gLockFdsMu.lock(); }
void lockFdsInParent() { gLockFdsMu.unlock(); }
void lockFdsInChild() {
  if (gLockFds) {
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int fd : *gLockFds) {
      if (null >= 0) {
        ::dup3(null, fd, O_CLOEXEC);
      } else {
        ::close(fd);
      }
    }
    if (null >= 0) ::close(null);
  }
  gLockFdsMu.unlock();
}

void listLockFd(int fd) {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(lockFdsBeforeFork, lockFdsInParent, lockFdsInChild); });
  std::lock_guard<std::mutex> lock(gLockFdsMu);
  if (!gLockFds) gLockFds = new std::set<int>();
  gLockFds->insert(fd);
}

void unlistLockFd(int fd) {
  std::lock_guard<std::mutex> lock(gLockFdsMu);
  if (gLockFds) gLockFds->erase(fd);
}

struct flock slotLock(int slot, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = slot;
  fl.l_len = 1;
  fl.l_pid = 0;  // required by open-file-description locks
  return fl;
}

/// Whether another open file description holds `slot`'s lock on `fd`; true
/// when the kernel cannot tell (the peer is then taken for alive).
bool slotLocked(int fd, int slot) {
  struct flock fl = slotLock(slot, F_WRLCK);
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}

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

std::unique_ptr<ShmGroup> ShmGroup::renumbered(std::vector<int> ranks) const {
  auto g = std::make_unique<ShmGroup>(*this);
  g->ranks_ = std::move(ranks);
  return g;
}

ShmRankBlock& ShmGroup::block(int local) const {
  return *reinterpret_cast<ShmRankBlock*>(base_ + static_cast<size_t>(local) * stride_);
}

char* ShmGroup::buffer(int local, int which) const {
  return base_ + static_cast<size_t>(local) * stride_ + kBlockBytes +
         static_cast<size_t>(which) * ((stride_ - kBlockBytes) / 2);
}

bool ShmGroup::alive(int local) const {
  const ShmRankBlock& b = block(local);
  if (segment_ && b.holdsLock) return segment_->lockHeld(local);
  // No lock to look at: a process id means something only in the PID
  // namespace it came from; elsewhere the peer counts as alive (the
  // timeout, or the network transport, notices its death).
  static const uint64_t myNamespace = pidNamespaceInode();
  const pid_t pid = b.pid;
  if (pid <= 0 || pid == getpid()) return true;
  if (b.pidNamespace == 0 || b.pidNamespace != myNamespace) return true;
  return ::kill(pid, 0) == 0 || errno != ESRCH;
}

void ShmGroup::registerSelf(const std::shared_ptr<ShmSegment>& segment) {
  ShmRankBlock& b = block(localRank_);
  b.pid = static_cast<int32_t>(getpid());
  b.pidNamespace = pidNamespaceInode();
  segment_ = segment;
  b.holdsLock = segment && segment->holdLock(localRank_) ? 1 : 0;
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

int ShmGroup::localIndexOf(int rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == rank) return static_cast<int>(i);
  }
  return -1;
}

std::shared_ptr<ShmSegment> ShmSegment::create(size_t bytes) {
  removeStale();
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string name = "/" + std::string(kPrefix) + std::to_string(getpid()) + "-" + std::to_string(rd() & 0xFFFFFF);
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) throw TransportError("shm_open(" + name + ") failed: " + errnoText(errno) + " (is /dev/shm mounted?)");
    auto seg = std::shared_ptr<ShmSegment>(new ShmSegment());
    seg->name_ = name;
    seg->fd_ = fd;
    seg->owner_ = true;
    seg->linked_ = true;
    listLockFd(fd);
    // Slot 0 is the creator's: from here on removeStale() spares it.
    seg->holdLock(0);
    // Reserve every page now. Sized with ftruncate alone, the segment is
    // sparse, and the first touch of a page the tmpfs cannot supply (a
    // container's /dev/shm is often 64 MiB) kills the process with SIGBUS
    // in the middle of a collective.
    int e = 0;
    do {
      e = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    } while (e == EINTR);
    if (e != 0) {
      std::string room;
      struct statvfs fs {};
      if (statvfs(kShmDir, &fs) == 0) {
        room = core::formatBytes(static_cast<size_t>(fs.f_bavail) * fs.f_frsize) + " free of " +
               core::formatBytes(static_cast<size_t>(fs.f_blocks) * fs.f_frsize);
      }
      throw TransportError("cannot reserve " + core::formatBytes(bytes) + " of shared memory in " + kShmDir + " (" +
                           room + "): " + errnoText(e) + ". Give /dev/shm more room (docker run --shm-size, a "
                           "Kubernetes emptyDir of medium Memory) or set GRADCOMM_SHM_CHUNK lower; GRADCOMM_SHM=0 "
                           "turns shared memory off");
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw TransportError("mmap of shared-memory segment failed: " + errnoText(errno));
    seg->data_ = static_cast<char*>(p);
    seg->bytes_ = bytes;
    madvise(p, bytes, MADV_DONTFORK);
    return seg;
  }
  throw TransportError("could not find a free shared-memory segment name");
}

std::shared_ptr<ShmSegment> ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw TransportError("shm_open(" + name + ") failed on a peer: " + errnoText(errno));
  auto seg = std::shared_ptr<ShmSegment>(new ShmSegment());
  seg->name_ = name;
  seg->fd_ = fd;
  listLockFd(fd);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw TransportError("mmap of shared-memory segment " + name + " failed: " + errnoText(errno));
  seg->data_ = static_cast<char*>(p);
  seg->bytes_ = bytes;
  madvise(p, bytes, MADV_DONTFORK);
  return seg;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (data_) munmap(data_, bytes_);
  if (fd_ >= 0) {
    unlistLockFd(fd_);
    ::close(fd_);  // the last descriptor of the description: the lock goes
  }
}

void ShmSegment::unlink() {
  if (owner_ && linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

bool ShmSegment::holdLock(int slot) {
  struct flock fl = slotLock(slot, F_WRLCK);
  return fd_ >= 0 && ::fcntl(fd_, F_OFD_SETLK, &fl) == 0;
}

bool ShmSegment::lockHeld(int slot) const { return fd_ < 0 || slotLocked(fd_, slot); }

void ShmSegment::removeStale() {
  // Names are /dev/shm/gradcomm-<creator pid>-<random>. A segment whose
  // creator is gone and that nobody unlinked (a crash between creation and
  // the attach barrier) is garbage. The creator's process id cannot tell:
  // it may be from another PID namespace (a container sharing /dev/shm and
  // IPC). Its lock on slot 0 can, in any namespace; a segment younger than
  // a second may not carry it yet.
  DIR* dir = opendir(kShmDir);
  if (!dir) return;
  timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  while (dirent* e = readdir(dir)) {
    const std::string n = e->d_name;
    if (n.rfind(kPrefix, 0) != 0) continue;
    const int fd = shm_open(("/" + n).c_str(), O_RDWR, 0);
    if (fd < 0) continue;  // another user's, or gone already
    struct stat st {};
    const bool known = fstat(fd, &st) == 0;
    const double age = static_cast<double>(now.tv_sec - st.st_ctim.tv_sec) +
                       static_cast<double>(now.tv_nsec - st.st_ctim.tv_nsec) * 1e-9;
    const bool old = known && age >= 1.0;
    if (old && !slotLocked(fd, 0)) shm_unlink(("/" + n).c_str());
    ::close(fd);
  }
  closedir(dir);
}


}  // namespace gradcomm::transport
