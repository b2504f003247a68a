#pragma once
// Float arithmetic on device that gives the CPU kernels' bits, NaNs
// included: x86 passes a NaN operand through quieted, with its payload (the
// first operand's where both are NaN), while NVIDIA GPUs return 0x7FFFFFFF
// for any NaN result, which encodes to another fp16/bf16 NaN than the CPU's.
// The _rn intrinsics keep nvcc from contracting a product and a sum into an
// FMA the CPU does not compute.
#include <cstdint>

namespace gradcomm::compression::cuda {

__device__ inline bool isNaN(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) > 0x7F800000u; }
__device__ inline float quietNaN(float v) { return __uint_as_float(__float_as_uint(v) | 0x00400000u); }
__device__ inline float mulLikeCpu(float a, float s) { return isNaN(a) ? quietNaN(a) : __fmul_rn(a, s); }
__device__ inline float addLikeCpu(float a, float b) {
  return isNaN(a) ? quietNaN(a) : isNaN(b) ? quietNaN(b) : __fadd_rn(a, b);
}

}  // namespace gradcomm::compression::cuda
