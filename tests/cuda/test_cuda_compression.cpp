// CUDA compression kernels against the CPU kernels: casts and the fused
// residual cast bit for bit, exact top-k the same selection, approximate
// top-k a top-c set within 10% of k, scatter-add. Every test that needs a
// device reports itself skipped when no usable GPU exists; argument checks
// run everywhere (they throw before anything is launched).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/cpu/cast.hpp"
#include "compression/cpu/topk.hpp"
#include "compression/cuda/compression_cuda.hpp"
#include "compression/sparse_tensor.hpp"
#include "gradcomm/error.hpp"
#include "kernels/reduce_cuda.hpp"
#include "require_gpu.hpp"
#include "support/compression_reference.hpp"

using namespace gradcomm;
namespace cc = gradcomm::compression;

namespace {

void cudaOk(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

/// Device memory for n elements of T, freed on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : size_(n) {
    if (n > 0) cudaOk(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }

  T* get() const { return ptr_; }
  void upload(const std::vector<T>& host) {
    if (!host.empty()) cudaOk(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download(size_t n) const {
    cudaOk(cudaDeviceSynchronize(), "kernel");
    std::vector<T> host(n);
    if (n > 0) cudaOk(cudaMemcpy(host.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  std::vector<T> download() const { return download(size_); }

 private:
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

std::vector<float> testInput(size_t n, uint64_t seed) {
  std::vector<float> in = gradcomm::testing::specialFloats();
  const std::vector<float> mixed = gradcomm::testing::mixedFloats(n, seed);
  in.insert(in.end(), mixed.begin(), mixed.end());
  return in;
}

std::vector<float> topkInput(const std::string& kind, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    if (kind == "normal") v[i] = normal(rng);
    else if (kind == "ties") v[i] = static_cast<float>(static_cast<int>(rng() % 5) - 2);
    else if (kind == "zeros") v[i] = 0.0f;
    else v[i] = normal(rng) * static_cast<float>(1u << (i % 13));  // "scales"
  }
  if (n > 10 && kind == "normal") {
    v[3] = std::nanf("");
    v[n / 2] = -INFINITY;
  }
  return v;
}

}  // namespace

TEST(CudaCompression, CastsAndDecodeMatchTheCpuBitForBit) {
  REQUIRE_GPU();
  const std::vector<float> in = testInput(100003, gradcomm::testing::compressionSeed("CudaCompression.Casts"));
  DeviceBuffer<float> dIn(in);
  DeviceBuffer<uint16_t> dOut(in.size());
  for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
    for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
      std::vector<uint16_t> want(in.size());
      cc::castToHalf(in.data(), want.data(), in.size(), type, scale, cc::Isa::kScalar);
      cc::cuda::castToHalf(dIn.get(), dOut.get(), in.size(), type, scale, nullptr);
      const std::vector<uint16_t> got = dOut.download();
      for (size_t i = 0; i < in.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << toString(type) << " scale " << scale << " input bits 0x" << std::hex
                                   << gradcomm::testing::bitsOf(in[i]);
      }
    }
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    DeviceBuffer<uint16_t> dAll(all);
    DeviceBuffer<float> dDecoded(all.size());
    std::vector<float> want(all.size());
    cc::decodeHalf(all.data(), want.data(), all.size(), type, cc::Isa::kScalar);
    cc::cuda::decodeHalf(dAll.get(), dDecoded.get(), all.size(), type, nullptr);
    const std::vector<float> got = dDecoded.download();
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(gradcomm::testing::bitsOf(got[i]), gradcomm::testing::bitsOf(want[i])) << toString(type) << " " << i;
    }
  }
}

TEST(CudaCompression, ResidualCastMatchesTheCpuBitForBit) {
  REQUIRE_GPU();
  const uint64_t seed = gradcomm::testing::compressionSeed("CudaCompression.ResidualCast");
  const std::vector<float> in = testInput(50000, seed);
  std::vector<float> start = gradcomm::testing::mixedFloats(in.size(), seed + 1);
  for (float& r : start) r = std::isfinite(r) ? r * 1e-3f : 0.0f;
  DeviceBuffer<float> dIn(in);
  DeviceBuffer<uint16_t> dOut(in.size());
  for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
    for (float scale : {1.0f, 0.5f, 1.0f / 7.0f}) {
      std::vector<float> residual = start;
      std::vector<uint16_t> want(in.size());
      cc::castWithResidual(in.data(), residual.data(), want.data(), in.size(), type, scale, cc::Isa::kScalar);
      DeviceBuffer<float> dResidual(start);
      cc::cuda::castWithResidual(dIn.get(), dResidual.get(), dOut.get(), in.size(), type, scale, nullptr);
      const std::vector<uint16_t> got = dOut.download();
      const std::vector<float> gotResidual = dResidual.download();
      for (size_t i = 0; i < in.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << toString(type) << " scale " << scale << " at " << i;
        ASSERT_EQ(gradcomm::testing::bitsOf(gotResidual[i]), gradcomm::testing::bitsOf(residual[i]))
            << toString(type) << " scale " << scale << " at " << i;
      }
    }
  }
}

namespace {

struct DeviceTopK {
  std::vector<uint64_t> indices;
  std::vector<float> values;
  std::vector<float> residual;
};

DeviceTopK runDeviceTopK(const std::vector<float>& in, const std::vector<float>* residual, size_t k,
                         bool approximate) {
  const size_t n = in.size();  // always below 2^32 here: 32-bit indices
  const size_t capacity = cc::cuda::topkCapacity(n, k, approximate);
  DeviceBuffer<float> dIn(in);
  DeviceBuffer<float> dResidual(residual ? residual->size() : 0);
  if (residual) dResidual.upload(*residual);
  DeviceBuffer<uint32_t> dIdx(capacity);
  DeviceBuffer<float> dVal(capacity);
  DeviceBuffer<uint64_t> dCount(1);
  DeviceBuffer<unsigned char> dWork(cc::cuda::topkWorkspaceBytes(n));
  cc::cuda::topk(dIn.get(), residual ? dResidual.get() : nullptr, n, k, approximate, dIdx.get(), false, dVal.get(),
                 capacity, dCount.get(), dWork.get(), cc::cuda::topkWorkspaceBytes(n), nullptr);
  const size_t count = static_cast<size_t>(dCount.download()[0]);
  if (count > capacity) throw std::runtime_error("device top-k count exceeds its capacity");
  DeviceTopK out;
  for (uint32_t i : dIdx.download(count)) out.indices.push_back(i);
  out.values = dVal.download(count);
  if (residual) out.residual = dResidual.download();
  return out;
}

}  // namespace

TEST(CudaCompression, ExactTopKSelectsWhatTheCpuSelects) {
  REQUIRE_GPU();
  const uint64_t seed = gradcomm::testing::compressionSeed("CudaCompression.ExactTopK");
  for (const char* kind : {"normal", "ties", "zeros", "scales"}) {
    for (size_t n : {size_t{1}, size_t{1000}, size_t{4097}, (size_t{1} << 20) + 3}) {
      const std::vector<float> in = topkInput(kind, n, seed);
      for (size_t k : {size_t{1}, n / 100 + 1, n / 3 + 1, n}) {
        for (bool withResidual : {false, true}) {
          std::vector<float> residual = topkInput("normal", n, seed + 7);
          for (float& r : residual) r = std::isfinite(r) ? r * 0.1f : 0.0f;
          const std::vector<float> startResidual = residual;
          cc::TopKOptions o;
          o.k = k;
          o.approximate = false;
          cc::SparseTensor want;
          cc::topk(in.data(), withResidual ? residual.data() : nullptr, n, o, want);
          const DeviceTopK got = runDeviceTopK(in, withResidual ? &startResidual : nullptr, k, false);
          const std::string where = std::string(kind) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                    (withResidual ? " with residual" : "");
          ASSERT_EQ(got.indices.size(), want.nnz()) << where;
          for (size_t i = 0; i < want.nnz(); ++i) {
            ASSERT_EQ(got.indices[i], want.index(i)) << where << " entry " << i;
            ASSERT_EQ(gradcomm::testing::bitsOf(got.values[i]), gradcomm::testing::bitsOf(want.values[i])) << where;
          }
          if (withResidual) {
            for (size_t i = 0; i < n; ++i) {
              ASSERT_EQ(gradcomm::testing::bitsOf(got.residual[i]), gradcomm::testing::bitsOf(residual[i])) << where;
            }
          }
        }
      }
    }
  }
}

TEST(CudaCompression, ApproximateTopKIsATopSetWithinTenPercentOfK) {
  REQUIRE_GPU();
  const uint64_t seed = gradcomm::testing::compressionSeed("CudaCompression.ApproximateTopK");
  const size_t n = size_t{1} << 22;
  for (const char* kind : {"normal", "ties", "zeros", "scales"}) {
    const std::vector<float> in = topkInput(kind, n, seed);
    for (size_t k : {size_t{10}, n / 1000, n / 100, n / 10}) {
      const DeviceTopK got = runDeviceTopK(in, nullptr, k, true);
      const std::string where = std::string(kind) + " k=" + std::to_string(k);
      EXPECT_GE(got.indices.size(), k - k / 10) << where;
      EXPECT_LE(got.indices.size(), k + k / 10) << where;
      EXPECT_EQ(gradcomm::testing::topSetViolation(in, got.indices), "") << where;
    }
  }
}

/// One top-k slot in host memory: the count, `capacity` uint32 indices, as
/// many floats, each part 8-byte aligned.
static std::vector<char> hostSlot(const std::vector<uint32_t>& idx, const std::vector<float>& val, size_t capacity,
                           uint64_t count, cc::cuda::SlotLayout* layout) {
  layout->capacity = capacity;
  layout->indicesOffset = 8;
  layout->valuesOffset = 8 + (capacity * sizeof(uint32_t) + 7) / 8 * 8;
  layout->wideIndices = false;
  std::vector<char> slot(layout->valuesOffset + (capacity * sizeof(float) + 7) / 8 * 8);
  std::memcpy(slot.data(), &count, sizeof count);
  std::memcpy(slot.data() + layout->indicesOffset, idx.data(), idx.size() * sizeof(uint32_t));
  std::memcpy(slot.data() + layout->valuesOffset, val.data(), val.size() * sizeof(float));
  return slot;
}

TEST(CudaCompression, ScatterAddSlotsMatchesTheCpuAndCountsBadIndicesAndCounts) {
  REQUIRE_GPU();
  const size_t n = 100000;
  std::vector<uint32_t> idx;
  std::vector<float> val;
  for (uint32_t i = 0; i < n; i += 37) {
    idx.push_back(i);
    val.push_back(static_cast<float>(i % 11) - 5.0f);
  }
  std::vector<float> want(n, 1.0f);
  gradcomm::testing::scatterAddReference(want.data(), idx.data(), val.data(), idx.size());
  idx.push_back(static_cast<uint32_t>(n));  // out of range: skipped and counted
  val.push_back(1e9f);
  const size_t capacity = idx.size() + 3;
  cc::cuda::SlotLayout layout;
  std::vector<char> slots = hostSlot(idx, val, capacity, idx.size(), &layout);
  const size_t slotBytes = slots.size();
  // A second slot that claims more entries than its capacity: it adds nothing.
  const std::vector<char> liar = hostSlot(idx, val, capacity, capacity + 1, &layout);
  slots.insert(slots.end(), liar.begin(), liar.end());
  DeviceBuffer<float> dDense(std::vector<float>(n, 1.0f));
  DeviceBuffer<char> dSlots(slots);
  DeviceBuffer<unsigned long long> dStatus(std::vector<unsigned long long>(4, 99));  // cleared by the call
  cc::cuda::scatterAddSlots(dDense.get(), n, dSlots.get(), slotBytes, 2, layout, dStatus.get(), nullptr);
  EXPECT_EQ(dDense.download(), want);
  EXPECT_EQ(dStatus.download(), (std::vector<unsigned long long>{0, 1, capacity + 1, 0}));
}

TEST(CudaCompression, RejectsBadArgumentsBeforeLaunching) {
  // No device memory is touched: these throw on the host, GPU or not.
  auto* fakeF = reinterpret_cast<float*>(uintptr_t{256});
  auto* fakeH = reinterpret_cast<uint16_t*>(uintptr_t{512});
  auto* fakeCount = reinterpret_cast<uint64_t*>(uintptr_t{1024});
  EXPECT_THROW(cc::cuda::castToHalf(fakeF, fakeH, 10, DataType::kInt8, 1.0f, nullptr), InvalidArgument);
  EXPECT_THROW(cc::cuda::castToHalf(fakeF, fakeH, 10, DataType::kFloat16, 0.0f, nullptr), InvalidArgument);
  EXPECT_THROW(cc::cuda::castWithResidual(fakeF, fakeF, fakeH, 10, DataType::kFloat32, 1.0f, nullptr),
               InvalidArgument);
  const size_t n = 1000, work = cc::cuda::topkWorkspaceBytes(n);
  EXPECT_THROW(cc::cuda::topk(fakeF, nullptr, n, 0, false, fakeH, false, fakeF, 10, fakeCount, fakeF, work, nullptr),
               InvalidArgument);  // k = 0
  EXPECT_THROW(cc::cuda::topk(fakeF, nullptr, n, 10, false, fakeH, false, fakeF, 9, fakeCount, fakeF, work, nullptr),
               InvalidArgument);  // capacity < k
  EXPECT_THROW(cc::cuda::topk(fakeF, nullptr, n, 10, true, fakeH, false, fakeF, 10, fakeCount, fakeF, work, nullptr),
               InvalidArgument);  // approximate needs k + k/10
  EXPECT_THROW(cc::cuda::topk(fakeF, nullptr, n, 10, false, fakeH, true, fakeF, 10, fakeCount, fakeF, work, nullptr),
               InvalidArgument);  // 64-bit indices for 1000 elements
  EXPECT_THROW(cc::cuda::topk(fakeF, nullptr, n, 10, false, fakeH, false, fakeF, 10, fakeCount, fakeF, work - 1,
                              nullptr),
               InvalidArgument);  // workspace too small
  EXPECT_THROW(cc::cuda::topk(fakeF, fakeF + 10, n, 10, false, fakeH, false, fakeF, 10, fakeCount, fakeF, work,
                              nullptr),
               InvalidArgument);  // residual overlaps the input
  EXPECT_THROW(cc::cuda::scatterAddSlots(nullptr, 10, reinterpret_cast<const char*>(fakeH), 64, 1,
                                         cc::cuda::SlotLayout{}, nullptr, nullptr),
               InvalidArgument);
  EXPECT_EQ(cc::cuda::topkCapacity(1000, 100, true), 110u);
  EXPECT_EQ(cc::cuda::topkCapacity(1000, 100, false), 100u);
  EXPECT_EQ(cc::cuda::topkCapacity(50, 100, true), 50u);
}
