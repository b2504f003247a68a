#pragma once
// Skips the calling test where no GPU can be used (this machine has CUDA
// but no device: cudaGetDeviceCount fails). GTEST_SKIP must run in the test
// body itself, hence a macro.
#include <gtest/gtest.h>

#include <string>

#include "kernels/reduce_cuda.hpp"

#define REQUIRE_GPU()                                                                      \
  do {                                                                                     \
    std::string why_;                                                                      \
    if (gradcomm::kernels::cuda::deviceCount(&why_) == 0) GTEST_SKIP() << "no usable GPU: " << why_; \
  } while (0)
