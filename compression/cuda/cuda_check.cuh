#pragma once
// Launch helpers shared by the compression .cu files.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::compression::cuda::detail {

inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw DeviceError(std::string(what) + ": " + cudaGetErrorString(rc));
}

/// Blocks of `threads` for a grid-stride loop over n elements.
inline unsigned gridFor(size_t n, unsigned threads, unsigned maxBlocks = 65535) {
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks > maxBlocks ? maxBlocks : blocks));
}

}  // namespace gradcomm::compression::cuda::detail
