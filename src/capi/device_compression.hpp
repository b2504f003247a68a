#pragma once
// GRADCOMM_COMPRESSION=fp16|bf16 in front of the real NCCL: a float32
// device allreduce (sum or avg) becomes cast, half-precision allreduce,
// cast back, all on the caller's stream.
#include <nccl.h>

namespace gradcomm::capi {

/// Runs the compressed allreduce, or returns ncclNumResults when
/// compression is off (the caller then forwards the call unchanged).
ncclResult_t compressedDeviceAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclRedOp_t op,
                                       ncclComm_t comm, cudaStream_t stream);

}  // namespace gradcomm::capi
