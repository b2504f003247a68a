#pragma once
// What the NCCL-ABI library needs to know from CUDA: whether a GPU works,
// whether a buffer is device memory, and how to wait for a stream.
#include <cuda_runtime_api.h>

#include <string>

namespace gradcomm::capi {

/// True when the CUDA runtime sees at least one working device (checked once).
bool cudaUsable();
/// True for device or managed memory; false for host memory (pageable,
/// pinned or registered) and wherever CUDA does not work.
bool isDeviceMemory(const void* p);
/// Waits for the work already queued on `stream` (it may still be writing
/// the caller's host buffers); nullptr is the legacy default stream.
/// Nothing to wait for where CUDA does not work. Returns "" or why it failed.
std::string waitForStream(cudaStream_t stream);

}  // namespace gradcomm::capi
