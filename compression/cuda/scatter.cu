// Scatter-add of a sparse payload into a dense device buffer.
#include <cuda_runtime.h>

#include <string>

#include "compression/cuda/compression_cuda.hpp"
#include "compression/cuda/cuda_check.cuh"
#include "gradcomm/error.hpp"

namespace gradcomm::compression::cuda {
namespace {

constexpr unsigned kThreads = 256;

/// One slot: its count is read on the device, so the host never waits for it.
template <typename IndexT>
__global__ void scatterAddSlotKernel(float* __restrict__ dense, size_t denseCount, const uint64_t* __restrict__ count,
                                     const IndexT* __restrict__ indices, const float* __restrict__ values,
                                     size_t capacity, unsigned long long* status) {
  const uint64_t nnz = *count;
  if (nnz > capacity) {
    if (blockIdx.x == 0 && threadIdx.x == 0) status[0] = nnz;
    return;
  }
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < nnz;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const unsigned long long index = indices[i];
    if (index < denseCount) atomicAdd(dense + index, values[i]);
    else atomicAdd(status + 1, 1ull);
  }
}

}  // namespace

void scatterAddSlots(float* dense, size_t denseCount, const char* payloads, size_t slotBytes, int slots,
                     const SlotLayout& layout, unsigned long long* statusDevice, void* stream) {
  if (slots <= 0) return;
  if ((!dense && denseCount) || !payloads || !statusDevice) {
    throw InvalidArgument("cuda::scatterAddSlots: null buffer for " + std::to_string(slots) + " payloads");
  }
  auto s = static_cast<cudaStream_t>(stream);
  detail::check(cudaMemsetAsync(statusDevice, 0, 2 * static_cast<size_t>(slots) * sizeof(unsigned long long), s),
                "cuda::scatterAddSlots: clearing the status");
  const unsigned grid = detail::gridFor(layout.capacity, kThreads);
  // Slot after slot on one stream: the float sums follow the rank order,
  // as on the host (one index appears at most once in a slot).
  for (int q = 0; q < slots; ++q) {
    const char* slot = payloads + static_cast<size_t>(q) * slotBytes;
    const auto* count = reinterpret_cast<const uint64_t*>(slot);
    const auto* values = reinterpret_cast<const float*>(slot + layout.valuesOffset);
    unsigned long long* status = statusDevice + 2 * static_cast<size_t>(q);
    if (layout.wideIndices) {
      scatterAddSlotKernel<uint64_t><<<grid, kThreads, 0, s>>>(
          dense, denseCount, count, reinterpret_cast<const uint64_t*>(slot + layout.indicesOffset), values,
          layout.capacity, status);
    } else {
      scatterAddSlotKernel<uint32_t><<<grid, kThreads, 0, s>>>(
          dense, denseCount, count, reinterpret_cast<const uint32_t*>(slot + layout.indicesOffset), values,
          layout.capacity, status);
    }
    detail::check(cudaGetLastError(), "cuda::scatterAddSlots kernel launch");
  }
}

}  // namespace gradcomm::compression::cuda
