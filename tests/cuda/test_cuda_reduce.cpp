// CUDA reduction kernels against the CPU kernels, every type and op.
// Skipped (reported as such) when no usable GPU exists.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/reduce.hpp"
#include "kernels/reduce_cuda.hpp"
#include "require_gpu.hpp"
#include "support/reference.hpp"

using namespace gradcomm;

namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

}  // namespace

TEST(CudaReduce, MatchesTheCpuKernelsForEveryTypeAndOp) {
  REQUIRE_GPU();
  for (DataType t : gradcomm::testing::allTypes()) {
    for (ReduceOp op : gradcomm::testing::allOps()) {
      if (!gradcomm::testing::supported(t, op) || op == ReduceOp::kAvg) continue;
      for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
        auto a = gradcomm::testing::makeInput(t, op, n, 5, 0), b = gradcomm::testing::makeInput(t, op, n, 5, 1);
        std::vector<unsigned char> want(a.size()), got(a.size(), 0xCD);
        kernels::reduceFunction(t, op, kernels::SimdLevel::kScalar)(want.data(), a.data(), b.data(), n);
        void *da = nullptr, *db = nullptr, *dd = nullptr;
        CUDA_OK(cudaMalloc(&da, a.size()));
        CUDA_OK(cudaMalloc(&db, a.size()));
        CUDA_OK(cudaMalloc(&dd, a.size()));
        CUDA_OK(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice));
        kernels::cuda::reduce(dd, da, db, n, t, op, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), dd, got.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(gradcomm::testing::firstDifference(t, got.data(), want.data(), n), -1)
            << toString(t) << " " << toString(op) << " n=" << n;
        cudaFree(da);
        cudaFree(db);
        cudaFree(dd);
      }
    }
  }
}

TEST(CudaReduce, DeviceCountNeverThrowsWithoutAGpu) {
  std::string why;
  int n = kernels::cuda::deviceCount(&why);
  EXPECT_GE(n, 0);
  if (n == 0) EXPECT_FALSE(why.empty());
}
