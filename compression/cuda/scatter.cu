// Scatter-add of a sparse payload into a dense device buffer.
#include <cuda_runtime.h>

#include <string>

#include "compression/cuda/compression_cuda.hpp"
#include "compression/cuda/cuda_check.cuh"
#include "gradcomm/error.hpp"

namespace gradcomm::compression::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename IndexT>
__global__ void scatterAddKernel(float* __restrict__ dense, size_t denseCount, const IndexT* __restrict__ indices,
                                 const float* __restrict__ values, size_t nnz, unsigned long long* bad) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < nnz;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const unsigned long long index = indices[i];
    if (index < denseCount) atomicAdd(dense + index, values[i]);
    else if (bad) atomicAdd(bad, 1ull);
  }
}

}  // namespace

void scatterAdd(float* dense, size_t denseCount, const void* indices, bool wideIndices, const float* values,
                size_t nnz, unsigned long long* badDevice, void* stream) {
  if (nnz == 0) return;
  if (!dense || !indices || !values) {
    throw InvalidArgument("cuda::scatterAdd: null buffer for " + std::to_string(nnz) + " sparse elements");
  }
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = detail::gridFor(nnz, kThreads);
  if (wideIndices) {
    scatterAddKernel<uint64_t><<<grid, kThreads, 0, s>>>(dense, denseCount, static_cast<const uint64_t*>(indices),
                                                         values, nnz, badDevice);
  } else {
    scatterAddKernel<uint32_t><<<grid, kThreads, 0, s>>>(dense, denseCount, static_cast<const uint32_t*>(indices),
                                                         values, nnz, badDevice);
  }
  detail::check(cudaGetLastError(), "cuda::scatterAdd kernel launch");
}

}  // namespace gradcomm::compression::cuda
