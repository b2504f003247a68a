#pragma once
// NCCL group semantics on host memory. Between ncclGroupStart and
// ncclGroupEnd nothing runs: calls are recorded (per thread, as in NCCL)
// and ncclGroupEnd forms pending communicators, waits for the callers'
// streams, submits every collective in call order, then one point-to-point
// operation per communicator holding all its sends and receives (so they
// cannot wait for each other), and waits for everything. A call outside a
// group is a group of one: it has completed when it returns.
#include <nccl.h>

#include <functional>
#include <vector>

#include "capi/comm.hpp"
#include "capi/p2p_schedule.hpp"

namespace gradcomm::capi {

/// A host collective: `start` submits it on comm->host, `finish` runs
/// after it completed (may be empty).
struct HostCall {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::function<Work()> start;
  std::function<void()> finish;
  size_t bytes = 0;
};

/// A send or receive; its message number is assigned when the group runs.
struct HostTransfer {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  P2pTransfer transfer;
};

/// Forms a communicator recorded by ncclCommInitRank* inside a group.
struct PendingInit {
  ncclComm_t comm = nullptr;
  std::function<void()> form;  ///< throws on failure
};

bool inGroup();
ncclResult_t groupStart();
ncclResult_t groupEnd(const char* function);
/// Ends the group without running it; the estimated time in microseconds.
ncclResult_t groupSimulateEnd(float* estimatedUs);

/// Adds to the current group, or runs at once as a group of one.
ncclResult_t enqueue(HostCall call, const char* function);
ncclResult_t enqueue(HostTransfer transfer, const char* function);
ncclResult_t enqueue(std::vector<HostTransfer> transfers, const char* function);
void enqueue(PendingInit init);

}  // namespace gradcomm::capi
