#pragma once
// Skips the calling test where no GPU can be used (this machine has CUDA
// but no device: cudaGetDeviceCount fails), or fails it with
// GRADCOMM_REQUIRE_CUDA=1 (scripts/gpu-check: on the GPU machine a skip
// would pass unseen). GTEST_SKIP must run in the test body itself, hence a
// macro.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/reduce_cuda.hpp"

#define REQUIRE_GPU()                                                                      \
  do {                                                                                     \
    std::string why_;                                                                      \
    if (gradcomm::kernels::cuda::deviceCount(&why_) == 0) {                               \
      const char* require_ = std::getenv("GRADCOMM_REQUIRE_CUDA");                         \
      if (require_ && std::string(require_) == "1") FAIL() << "GRADCOMM_REQUIRE_CUDA=1 but no usable GPU: " << why_; \
      GTEST_SKIP() << "no usable GPU: " << why_;                                           \
    }                                                                                      \
  } while (0)
