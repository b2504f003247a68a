// fp16/bf16 compression casts on device, bit-identical with the CPU kernels
// (compression/cpu/kernels_impl.hpp): NaNs are built by hand because the
// hardware conversions return a canonical NaN, and the arithmetic is the
// CPU's (cpu_arithmetic.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "compression/cast_args.hpp"
#include "compression/cuda/compression_cuda.hpp"
#include "compression/cuda/cpu_arithmetic.cuh"
#include "compression/cuda/cuda_check.cuh"
#include "gradcomm/error.hpp"

namespace gradcomm::compression::cuda {
namespace {

constexpr unsigned kThreads = 256;

struct Fp16 {
  static __device__ uint16_t encode(float y) {
    const uint32_t x = __float_as_uint(y);
    const uint32_t mag = x & 0x7FFFFFFFu;
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    if (mag > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((mag >> 13) & 0x3FFu));
    if (mag > 0x477FE000u && mag < 0x7F800000u) return static_cast<uint16_t>(sign | 0x7BFFu);  // saturate
    return __half_as_ushort(__float2half_rn(y));
  }
  static __device__ float decode(uint16_t h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu)) {
      return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7FC00000u |
                             (static_cast<uint32_t>(h & 0x03FFu) << 13));
    }
    return __half2float(__ushort_as_half(h));
  }
};

struct Bf16 {
  static __device__ uint16_t encode(float y) {
    const uint32_t x = __float_as_uint(y);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);  // round to nearest even
  }
  static __device__ float decode(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
};

__device__ inline float finiteOrZero(float r) { return (__float_as_uint(r) & 0x7F800000u) == 0x7F800000u ? 0.0f : r; }

template <class F>
__global__ void castKernel(const float* __restrict__ in, uint16_t* __restrict__ out, size_t n, float scale,
                           bool scaled) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = F::encode(scaled ? mulLikeCpu(in[i], scale) : in[i]);
  }
}

// out[i] = float(in[i]), or out[i] += float(in[i]) with the CPU's bits.
template <class F, bool kAdd>
__global__ void decodeKernel(const uint16_t* __restrict__ in, float* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = kAdd ? addLikeCpu(out[i], F::decode(in[i])) : F::decode(in[i]);
  }
}

template <bool kAdd>
void launchDecode(const uint16_t* in, float* out, size_t n, DataType type, void* stream, const char* what) {
  const bool fp16 = compression::detail::castTargetIsFp16(type, what);
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = detail::gridFor(n, kThreads);
  if (fp16) decodeKernel<Fp16, kAdd><<<grid, kThreads, 0, s>>>(in, out, n);
  else decodeKernel<Bf16, kAdd><<<grid, kThreads, 0, s>>>(in, out, n);
  detail::check(cudaGetLastError(), what);
}

template <class F>
__global__ void residualKernel(const float* __restrict__ in, float* __restrict__ res, uint16_t* __restrict__ out,
                               size_t n, float scale, bool scaled) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float t = addLikeCpu(in[i], res[i]);
    const uint16_t q = F::encode(scaled ? mulLikeCpu(t, scale) : t);
    out[i] = q;
    const float d = F::decode(q);
    const float r = scaled ? __fdiv_rn(__fmaf_rn(t, scale, -d), scale) : __fsub_rn(t, d);
    res[i] = finiteOrZero(r);
  }
}

}  // namespace

void castToHalf(const float* in, uint16_t* out, size_t n, DataType type, float scale, void* stream) {
  const bool fp16 = compression::detail::castTargetIsFp16(type, "cuda::castToHalf");
  compression::detail::checkCastScale(scale, "cuda::castToHalf");
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = detail::gridFor(n, kThreads);
  if (fp16) castKernel<Fp16><<<grid, kThreads, 0, s>>>(in, out, n, scale, scale != 1.0f);
  else castKernel<Bf16><<<grid, kThreads, 0, s>>>(in, out, n, scale, scale != 1.0f);
  detail::check(cudaGetLastError(), "compression cast kernel launch");
}

void decodeHalf(const uint16_t* in, float* out, size_t n, DataType type, void* stream) {
  launchDecode<false>(in, out, n, type, stream, "cuda::decodeHalf");
}

void decodeAddHalf(const uint16_t* in, float* out, size_t n, DataType type, void* stream) {
  launchDecode<true>(in, out, n, type, stream, "cuda::decodeAddHalf");
}

void castWithResidual(const float* in, float* residual, uint16_t* out, size_t n, DataType type, float scale,
                      void* stream) {
  const bool fp16 = compression::detail::castTargetIsFp16(type, "cuda::castWithResidual");
  compression::detail::checkCastScale(scale, "cuda::castWithResidual");
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = detail::gridFor(n, kThreads);
  if (fp16) residualKernel<Fp16><<<grid, kThreads, 0, s>>>(in, residual, out, n, scale, scale != 1.0f);
  else residualKernel<Bf16><<<grid, kThreads, 0, s>>>(in, residual, out, n, scale, scale != 1.0f);
  detail::check(cudaGetLastError(), "compression residual kernel launch");
}

}  // namespace gradcomm::compression::cuda
