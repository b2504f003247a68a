#include "capi/device_compression.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "capi/api_common.hpp"
#include "capi/forward.hpp"
#include "gradcomm/device.hpp"

namespace gradcomm::capi {
namespace {

/// The half type GRADCOMM_COMPRESSION asks for (read once); *on is false
/// when it asks for none that applies to device buffers.
DataType halfType(bool* on, int rank) {
  static const int kind = [rank] {
    std::string spec;
    try {
      spec = parameterValue("GRADCOMM_COMPRESSION");
    } catch (const Error&) {
      return 0;  // the host communicator reports the malformed value
    }
    const std::string base = spec.substr(0, spec.find(':'));
    if (base == "fp16") return 1;
    if (base == "bf16") return 2;
    if (!spec.empty() && spec != "none") {
      noteOnce(rank, "NCCL shim: GRADCOMM_COMPRESSION=" + spec + " is not applied to device buffers (only fp16 and bf16 are)");
    }
    return 0;
  }();
  *on = kind != 0;
  return kind == 2 ? DataType::kBFloat16 : DataType::kFloat16;
}

}  // namespace

ncclResult_t compressedDeviceAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclRedOp_t op,
                                       ncclComm_t comm, cudaStream_t stream) {
  bool on = false;
  const DataType half = halfType(&on, comm->rank);
  if (!on) return ncclNumResults;
  static const char* fn = "ncclAllReduce";
  auto allReduce = GRADCOMM_REAL(ncclAllReduce);
  if (!allReduce) return realMissing(fn);
  noteOnce(comm->rank, std::string("NCCL shim: float32 device allreduce compressed to ") +
                           (half == DataType::kFloat16 ? "fp16" : "bf16") + " around the real NCCL");
  if (count == 0) return fromReal(fn, allReduce(sendbuff, recvbuff, 0, ncclFloat32, op, comm->real, stream));
  // Stream-ordered scratch: it lives exactly as long as the stream needs it.
  void* scratch = nullptr;
  cudaError_t err = cudaMallocAsync(&scratch, count * 2, stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(ncclUnhandledCudaError, std::string(fn) + ": cudaMallocAsync of the fp16 buffer failed: " +
                                            cudaGetErrorString(err));
  }
  ncclResult_t result = ncclSuccess;
  try {
    castToHalfOnDevice(static_cast<const float*>(sendbuff), scratch, count, half, stream);
    result = fromReal(fn, allReduce(scratch, scratch, count, half == DataType::kFloat16 ? ncclFloat16 : ncclBfloat16,
                                    op, comm->real, stream));
    if (result == ncclSuccess) castFromHalfOnDevice(scratch, static_cast<float*>(recvbuff), count, half, stream);
  } catch (const Error& e) {
    result = fail(ncclUnhandledCudaError, std::string(fn) + ": " + e.what());
  }
  cudaFreeAsync(scratch, stream);
  return result;
}

}  // namespace gradcomm::capi
