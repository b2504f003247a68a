// CUDA reduction kernels: one grid-stride elementwise kernel per (type, op),
// vectorised by the compiler; float16/bfloat16 compute in float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gradcomm/error.hpp"
#include "kernels/reduce.hpp"
#include "kernels/reduce_cuda.hpp"

namespace gradcomm::kernels::cuda {
namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw DeviceError(std::string(what) + ": " + cudaGetErrorString(rc));
}

// Sums and products of signed integers wrap: computed unsigned (signed
// overflow is undefined). Comparisons need the signed values (Compare).
template <typename T> struct Compute { using type = T; };
template <> struct Compute<__half> { using type = float; };
template <> struct Compute<__nv_bfloat16> { using type = float; };
template <> struct Compute<int8_t> { using type = uint8_t; };
template <> struct Compute<int32_t> { using type = uint32_t; };
template <> struct Compute<int64_t> { using type = uint64_t; };
template <typename T> struct Compare { using type = T; };
template <> struct Compare<__half> { using type = float; };
template <> struct Compare<__nv_bfloat16> { using type = float; };

template <typename T> __device__ inline typename Compute<T>::type load(T v) { return static_cast<typename Compute<T>::type>(v); }
template <> __device__ inline float load<__half>(__half v) { return __half2float(v); }
template <> __device__ inline float load<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T, typename C> __device__ inline T store(C v) { return static_cast<T>(v); }
template <> __device__ inline __half store<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 store<__nv_bfloat16, float>(float v) { return __float2bfloat16_rn(v); }

template <typename C> __device__ inline bool isNan(C v) { return v != v; }

template <typename T, int Op>
__global__ void reduceKernel(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (Op <= 1) {
      const auto x = load(a[i]);
      const auto y = load(b[i]);
      dst[i] = store<T>(Op == 0 ? x + y : x * y);
    } else {
      using C = typename Compare<T>::type;
      const C x = static_cast<C>(load(a[i]));
      const C y = static_cast<C>(load(b[i]));
      if constexpr (Op == 2) dst[i] = store<T>((x < y || isNan(x)) ? x : y);
      else dst[i] = store<T>((x > y || isNan(x)) ? x : y);
    }
  }
}

// data[i] / value, or data[i] * value.
template <bool Divide>
__global__ void scaleKernelF32(float* data, size_t n, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    data[i] = Divide ? data[i] / value : data[i] * value;
  }
}

unsigned blocksFor(size_t n) {
  size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks > 65535 ? 65535 : (blocks == 0 ? 1 : blocks));
}

template <typename T>
void launch(void* dst, const void* a, const void* b, size_t n, int op, cudaStream_t s) {
  auto d = static_cast<T*>(dst);
  auto x = static_cast<const T*>(a);
  auto y = static_cast<const T*>(b);
  switch (op) {
    case 0: reduceKernel<T, 0><<<blocksFor(n), 256, 0, s>>>(d, x, y, n); break;
    case 1: reduceKernel<T, 1><<<blocksFor(n), 256, 0, s>>>(d, x, y, n); break;
    case 2: reduceKernel<T, 2><<<blocksFor(n), 256, 0, s>>>(d, x, y, n); break;
    default: reduceKernel<T, 3><<<blocksFor(n), 256, 0, s>>>(d, x, y, n); break;
  }
}

}  // namespace

int deviceCount(std::string* why) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA device";
  return count;
}

void reduce(void* dst, const void* a, const void* b, size_t n, DataType type, ReduceOp op, void* stream) {
  checkSupported(type, op);
  if (n == 0) return;
  const int o = opIndex(op);
  auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case DataType::kFloat32: launch<float>(dst, a, b, n, o, s); break;
    case DataType::kFloat64: launch<double>(dst, a, b, n, o, s); break;
    case DataType::kFloat16: launch<__half>(dst, a, b, n, o, s); break;
    case DataType::kBFloat16: launch<__nv_bfloat16>(dst, a, b, n, o, s); break;
    case DataType::kInt8: launch<int8_t>(dst, a, b, n, o, s); break;
    case DataType::kUInt8: launch<uint8_t>(dst, a, b, n, o, s); break;
    case DataType::kInt32: launch<int32_t>(dst, a, b, n, o, s); break;
    case DataType::kInt64: launch<int64_t>(dst, a, b, n, o, s); break;
  }
  check(cudaGetLastError(), "reduction kernel launch");
}

void divide(float* data, size_t n, float divisor, void* stream) {
  if (n == 0) return;
  scaleKernelF32<true><<<blocksFor(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(data, n, divisor);
  check(cudaGetLastError(), "division kernel launch");
}

void multiply(float* data, size_t n, float factor, void* stream) {
  if (n == 0) return;
  scaleKernelF32<false><<<blocksFor(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(data, n, factor);
  check(cudaGetLastError(), "multiplication kernel launch");
}

}  // namespace gradcomm::kernels::cuda
