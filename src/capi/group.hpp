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
#include <string>
#include <vector>

#include "capi/comm.hpp"
#include "capi/cuda_probe.hpp"
#include "capi/errors.hpp"

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

/// A send or receive (of bytes), run when the group runs.
struct HostTransfer {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  Communicator::Transfer transfer;
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

/// A host collective outside a group, at once: submit, wait, done. The
/// same as a group of one, without the group's bookkeeping (which costs a
/// third of a small call's time).
template <typename Start>
ncclResult_t runNow(ncclComm_t comm, cudaStream_t stream, const char* function, Start&& start) {
  if (stream) {
    const std::string err = waitForStream(stream);
    if (!err.empty()) return fail(ncclUnhandledCudaError, std::string(function) + ": " + err);
  }
  CommUse use(comm);
  if (!use.entered()) return abortedCall(function);
  try {
    start().wait();  // bounded: the engine fails an operation stalled for GRADCOMM_TIMEOUT
    return ncclSuccess;
  } catch (const Error& e) {
    if (comm->isClosing()) return abortedCall(function);
    const ncclResult_t r = resultOf(e.code());
    const std::string message = std::string(function) + ": " + e.what();
    comm->setFailed(r, message);
    return fail(r, message);
  }
}

}  // namespace gradcomm::capi
