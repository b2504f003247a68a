#pragma once
// Shared memory between the ranks of one host: a POSIX segment holding, per
// local rank, a control block of atomic flags and two data buffers. Flags
// carry monotonically increasing round numbers, so they never need
// resetting. The segment's name is unlinked as soon as every rank has
// mapped it: whatever happens to the processes later, nothing is left in
// /dev/shm.
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>


namespace gradcomm::transport {

/// The shared-memory allreduce's direct path: a call of at most this many
/// bytes in one round takes one hand-off, and may run inline. The cost
/// model prices it as such.
constexpr size_t kShmDirectMaxBytes = 16 * 1024;

/// Control block of one local rank, in shared memory. Each flag sits on its
/// own cache line: writers never share a line with other writers.
struct ShmRankBlock {
  /// Staging announcement of buffer b: round number, call signature and,
  /// for tiny messages, the data itself, in one cache line, so a peer that
  /// polls the round number gets the rest with the same transfer.
  struct alignas(64) Mailbox {
    std::atomic<uint64_t> ready;  ///< round whose input is staged in buffer b
    uint32_t fingerprint;         ///< call signature of that round
    /// Low 32 bits of this rank's `consumed` when it staged the round (see
    /// ShmGroup::finishedReading).
    std::atomic<uint32_t> consumedAtStage;
    static constexpr size_t kInlineBytes = 48;
    char data[kInlineBytes];  ///< the whole input when it fits
  };
  Mailbox mailbox[2];
  alignas(64) std::atomic<uint64_t> reduced[2];  ///< round whose own slice is reduced in buffer b
  alignas(64) std::atomic<uint64_t> consumed;    ///< last round this rank finished reading from peers
  alignas(64) int32_t pid;  ///< in the owner's PID namespace: for messages, and liveness only within that namespace
  uint32_t holdsLock;       ///< non-zero once the owner holds its liveness lock (ShmSegment::holdLock)
  uint64_t pidNamespace;    ///< inode of the owner's PID namespace (/proc/self/ns/pid), 0 if unknown
  /// Bytes the communicator lays out for its own control plane between
  /// the ranks of the host (core::HostControl: announcements, call-check
  /// slots, failure flags). Zero when the segment is made; the transport
  /// never reads them.
  static constexpr size_t kControlBytes = 2048;
  alignas(64) unsigned char control[kControlBytes];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory flags must be lock-free");

class ShmSegment;

/// Memory shared by the ranks of one host.
class ShmGroup {
 public:
  static constexpr size_t kBlockBytes = 4096;

  /// `base` holds size * stride() bytes; the group does not own it.
  ShmGroup(std::vector<int> ranks, int localRank, size_t bufferBytes, char* base, std::shared_ptr<void> owner);

  /// Bytes of segment one rank needs for a buffer size.
  static size_t strideFor(size_t bufferBytes);

  int localRank() const { return localRank_; }
  int localSize() const { return static_cast<int>(ranks_.size()); }
  /// Communicator ranks of the local group, ascending.
  const std::vector<int>& ranks() const { return ranks_; }
  size_t bufferBytes() const { return bufferBytes_; }
  ShmRankBlock& block(int local) const;
  static constexpr size_t kControlBytes = ShmRankBlock::kControlBytes;
  /// Local rank `local`'s control area (ShmRankBlock::control).
  void* control(int local) const { return block(local).control; }
  char* buffer(int local, int which) const;
  /// False once the process of local rank `local` no longer exists. Holds
  /// across PID namespaces (containers sharing IPC but not process ids):
  /// the peer's liveness lock on the segment says, else its process id
  /// where it shares this rank's PID namespace; else it counts as alive.
  bool alive(int local) const;
  /// Registers this rank in its control block: process id, PID namespace,
  /// and the liveness lock on `segment` (null: none, as for memory that is
  /// no segment).
  void registerSelf(const std::shared_ptr<ShmSegment>& segment);
  /// Index of communicator rank `rank` in this group, or -1.
  int localIndexOf(int rank) const;
  /// Publishes round `rid` (its data staged) in this rank's mailbox `b`:
  /// the call's fingerprint and the last round this rank finished reading.
  void publish(int b, uint64_t rid, uint32_t fingerprint);
  /// Whether local rank `q` finished reading round `rid` (its `consumed`
  /// reached it). Looks first at q's mailbox of round rid + 1, which this
  /// rank read in that round: when it has not changed since, the answer
  /// costs no cache line from q's core (its `consumed` line would).
  bool finishedReading(int q, uint64_t rid) const;
  /// Buffer reuse in the host: round `rid` writes the buffer round rid - 2
  /// used, so every local peer must have finished reading that one. The
  /// first peer that has not, or -1 (always -1 for the first two rounds).
  int peerStillReading(uint64_t rid) const;
  /// Next round number (private to this rank; every rank counts alike).
  uint64_t takeRound() { return ++*round_; }
  /// The same memory and the same round counter with the ranks renumbered:
  /// for a group whose ranks on this host are all of this group's, in the
  /// same order (`ranks`: the group's rank of each local rank). Operations
  /// of either then advance one sequence of rounds, which works because
  /// every rank of the host runs them in one order.
  std::unique_ptr<ShmGroup> renumbered(std::vector<int> ranks) const;

 private:
  std::vector<int> ranks_;
  int localRank_;
  size_t bufferBytes_;
  size_t stride_;
  char* base_;
  std::shared_ptr<void> owner_;  // keeps the mapping alive
  std::shared_ptr<ShmSegment> segment_;  // its locks tell which peers live (registerSelf)
  std::shared_ptr<uint64_t> round_ = std::make_shared<uint64_t>(0);  ///< shared with renumbered() views
};

/// A mapped POSIX shared-memory segment (RAII). It keeps its descriptor
/// open: each process holds an open-file-description lock on one byte of
/// it (its slot) for as long as it lives, which the kernel drops when the
/// process dies, and which any process that opened the segment sees,
/// whatever its PID namespace.
class ShmSegment {
 public:
  /// Creates a fresh segment of `bytes` with a unique name, its memory
  /// reserved (posix_fallocate): where /dev/shm cannot hold it, a
  /// TransportError saying so, never a SIGBUS on first touch. The creator
  /// holds slot 0's lock from the start.
  static std::shared_ptr<ShmSegment> create(size_t bytes);
  /// Maps an existing segment by name.
  static std::shared_ptr<ShmSegment> open(const std::string& name, size_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  char* data() const { return data_; }
  const std::string& name() const { return name_; }
  /// Removes the name (the mapping stays valid). Idempotent.
  void unlink();
  /// Takes the liveness lock of `slot` for this process; false where the
  /// kernel has no open-file-description locks.
  bool holdLock(int slot);
  /// Whether another open of the segment holds `slot`'s lock.
  bool lockHeld(int slot) const;
  /// Removes segments left by gradcomm processes that no longer exist:
  /// those whose creator's lock (slot 0) nobody holds, a second or more
  /// after they were made (a creator takes its lock just after creating).
  static void removeStale();

 private:
  ShmSegment() = default;
  std::string name_;
  int fd_ = -1;
  char* data_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;
  bool linked_ = false;
};

}  // namespace gradcomm::transport
