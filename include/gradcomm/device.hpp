#pragma once
/// Device (CUDA) services of the library that a frontend builds on: the
/// half-precision casts of compressed allreduce, and NVIDIA's NCCL as the
/// library opens it at run time. The NCCL-ABI library (libgradcomm_nccl.so)
/// uses these as any program could.
#include <cstddef>
#include <string>

#include "gradcomm/export.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm {

/// out[i] = half(in[i]) for `count` float32 values in device memory, queued
/// on `stream` (a cudaStream_t; null: the legacy default stream). `half` is
/// kFloat16 (round to nearest even, saturating to the largest finite value)
/// or kBFloat16 (round to nearest even); the same bits as the CPU kernels.
/// Throws InvalidArgument for another type or a null buffer with count > 0,
/// UnsupportedError in a build without CUDA, and DeviceError when the
/// launch fails.
GRADCOMM_API void castToHalfOnDevice(const float* in, void* out, size_t count, DataType half, void* stream);

/// out[i] = float(in[i]) (exact) for `count` half values of type `half` in
/// device memory, queued on `stream`; the errors of castToHalfOnDevice.
GRADCOMM_API void castFromHalfOnDevice(const void* in, float* out, size_t count, DataType half, void* stream);

/// NVIDIA's NCCL, opened with dlopen on first use (never linked):
/// GRADCOMM_NCCL_LIB, else libnccl.so.2 on the loader's path. A library that
/// is gradcomm's own NCCL-ABI library (installed or linked as libnccl.so.2)
/// is refused, so device calls never come back round through gradcomm.
namespace nccl {
/// True when a real NCCL was found and opened.
GRADCOMM_API bool available();
/// Why none is available ("" when one is), naming the path tried.
GRADCOMM_API std::string unavailableReason();
/// Where it was opened from (the name tried, when none was).
GRADCOMM_API std::string path();
/// Its function `name`, or null when it is unavailable or lacks it.
GRADCOMM_API void* symbol(const char* name);
}  // namespace nccl

}  // namespace gradcomm
