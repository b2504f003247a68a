#include "capi/cuda_probe.hpp"

#include <atomic>

namespace gradcomm::capi {

bool cudaUsable() {
  // -1 unknown, 0 no, 1 yes. Racing first calls compute the same answer.
  static std::atomic<int> state{-1};
  int s = state.load(std::memory_order_acquire);
  if (s < 0) {
    int n = 0;
    s = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 1 : 0;
    if (!s) cudaGetLastError();  // clear the error the probe left behind
    state.store(s, std::memory_order_release);
  }
  return s == 1;
}

bool isDeviceMemory(const void* p) {
  if (!p || !cudaUsable()) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on old runtimes: not an error for us
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

std::string waitForStream(cudaStream_t stream) {
  if (!cudaUsable()) return {};
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) return {};
  cudaGetLastError();
  return std::string("cudaStreamSynchronize failed: ") + cudaGetErrorString(err);
}

}  // namespace gradcomm::capi
