#pragma once
// A device collective library (NCCL) as the Communicator's NCCL engine sees
// it: a communicator formed from an id that one rank makes and the others
// receive through gradcomm's own control plane, and collectives queued on a
// caller's stream. The NCCL implementation (collective_library.cpp) opens
// NCCL at run time; tests install their own (tests/support/fake_nccl.hpp)
// to run the engine's choice and calls on the test device runtime.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/runtime.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm::device {

/// One group of ranks of the library. Every call throws DeviceError with
/// the library's reason when it refuses or fails.
class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  /// Queues the collective on `stream` (counts are elements; broadcast and
  /// reduce name a root). Ops include kAvg.
  virtual void allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, Stream stream) = 0;
  virtual void broadcast(const void* in, void* out, size_t count, DataType type, int root, Stream stream) = 0;
  virtual void reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root,
                      Stream stream) = 0;
  virtual void allgather(const void* in, void* out, size_t count, DataType type, Stream stream) = 0;
  virtual void reduceScatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                             Stream stream) = 0;
  /// An error the library found after a call returned (a peer that failed,
  /// a network error), or "" (never blocks).
  virtual std::string asyncError() = 0;
  /// Stops whatever the group's kernels wait for, so that they end; the
  /// group is unusable afterwards. Called when the communicator fails.
  virtual void abort() = 0;
};

class CollectiveLibrary {
 public:
  virtual ~CollectiveLibrary() = default;
  /// "nccl 2.28.9".
  virtual std::string name() = 0;
  /// Why the library cannot serve this process, or "" when it can.
  virtual std::string unavailable() = 0;
  /// A new group id (on one rank; the others receive it).
  virtual std::vector<char> newId() = 0;
  /// Joins the group `id` as `rank` of `size`, on `device`. Blocks until
  /// every rank joined, or until `cancelled()` says to give up (then throws
  /// DeviceError); called on every rank at once. The group keeps asking
  /// `cancelled()` while a collective waits to be queued (a first call
  /// connects to the peers), and aborts itself when it says so.
  virtual std::unique_ptr<DeviceComm> join(const std::vector<char>& id, int size, int rank, int device,
                                           const std::function<bool()>& cancelled) = 0;
};

/// The process's library: NCCL where this build has NCCL's header (it may
/// still be unavailable at run time), else null.
std::shared_ptr<CollectiveLibrary> collectiveLibrary();
/// Replaces it until the returned one is put back (tests).
std::shared_ptr<CollectiveLibrary> installCollectiveLibrary(std::shared_ptr<CollectiveLibrary> library);

}  // namespace gradcomm::device
