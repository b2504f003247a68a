#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/mpi_env.hpp"
#include "transport/shm_group.hpp"
#include "transport/transport.hpp"

namespace gradcomm::transport {

/// How a Tag's fields are packed into an MPI tag (whose upper bound is at
/// least 2^23 - 1 by Open MPI's UCX layer and 2^31 - 1 by ob1).
struct MpiTagLayout {
  int seqBits = 0;
  int fingerprintBits = 0;
  int messageBits = 0;
  static MpiTagLayout forUpperBound(long long tagUpperBound);
  int encode(const Tag& tag) const;
  uint64_t seqOf(int mpiTag) const;
  uint32_t fingerprintOf(int mpiTag) const;
  uint64_t seqMask() const { return (1ull << seqBits) - 1; }
  uint32_t fingerprintMask() const { return (1u << fingerprintBits) - 1; }
};

class Graveyard;
class MpiProgress;

/// Point-to-point over MPI on a private duplicate of the caller's
/// communicator, plus a second duplicate that carries abort notices.
class MpiTransport : public Transport, public NativeProvider {
 public:
  /// Collective over `comm`: duplicates it twice. With shmChunkBytes > 0
  /// and several ranks on this host, also maps a shared-memory segment with
  /// buffers of shmChunkBytes per local rank.
  MpiTransport(MPI_Comm comm, std::shared_ptr<MpiEnvironment> env, size_t shmChunkBytes = 0);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  RequestPtr isend(int peer, const void* data, size_t bytes, const Tag& tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, const Tag& tag) override;
  bool probeMismatch(int peer, const Tag& expected) override;
  RequestPtr irecvAny(void* data, size_t capacity, const Tag& tag) override;
  bool abandonedTransfersPending() override;
  /// A light transport for the group: an MPI communicator of the members
  /// (MPI_Comm_create_group, and one duplicate for its call checks), the
  /// hosts and tag layout of this one, this one's shared memory renumbered
  /// where the members fill whole hosts (sharedMemoryForGroup), and this
  /// one's progress pass.
  std::unique_ptr<Transport> subgroup(const std::vector<int>& members) override;
  NativeCollectives& native() override { return *native_; }
  ShmGroup* sharedMemory() override { return shm_.get(); }
  size_t sharedMemoryChunkBytes() const override { return shmChunkBytes_; }
  /// The hosts as the shared-memory split and an allgather found them.
  HostLayout hostLayout() const { return {size(), hosts_, hostName_}; }


 private:
  /// The group of `members` of `parent` over `data` (owned).
  MpiTransport(MpiTransport& parent, MPI_Comm data, const std::vector<int>& members);
  /// The group constructor's work; it frees the communicators if this throws.
  void setUpGroup(MpiTransport& parent, const std::vector<int>& members);
  /// Posts a receive (or a send) in parts of at most kMaxPartBytes.
  RequestPtr post(bool recv, int peer, void* data, size_t bytes, const Tag& tag);
  void checkGroup(const Tag& tag) const;

  std::shared_ptr<MpiEnvironment> env_;
  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm control_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  MpiTagLayout layout_;
  std::vector<int> localRanks_;
  std::vector<std::vector<int>> hosts_;
  std::string hostName_;
  std::shared_ptr<Graveyard> graveyard_;  // requests abandoned in flight (see mpi_transport.cpp)
  std::shared_ptr<MpiProgress> progress_;    // one MPI_Testsome per look at the open transfers (ditto)
  std::unique_ptr<NativeCollectives> native_;
  std::unique_ptr<ShmGroup> shm_;
  size_t shmChunkBytes_ = 0;
};

/// The MPI datatype that carries `type` (float16/bfloat16 travel as MPI_UINT16_T).
MPI_Datatype mpiDatatype(DataType type);

}  // namespace gradcomm::transport
