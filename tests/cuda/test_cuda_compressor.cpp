// The device Compressors (compression/cuda/compressors.cu) against the CPU
// Compressors through the interface: cast payloads, decodes and residuals
// bit for bit, exact top-k the same dense result, decompress-accumulate, and
// a malformed payload count rejected. Each test reports itself skipped when
// no usable GPU exists.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "compression/compressor.hpp"
#include "compression/cuda/compression_cuda.hpp"
#include "gradcomm/device.hpp"
#include "gradcomm/error.hpp"
#include "require_gpu.hpp"
#include "support/compression_reference.hpp"

using namespace gradcomm;
namespace cc = gradcomm::compression;

namespace {

void cudaOk(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

/// Device bytes, freed on scope exit.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    if (bytes) cudaOk(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  template <typename T>
  explicit DeviceBytes(const std::vector<T>& host) : DeviceBytes(host.size() * sizeof(T)) {
    if (bytes_) cudaOk(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), "upload");
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(ptr_); }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  std::vector<T> download(size_t n) const {
    cudaOk(cudaDeviceSynchronize(), "kernel");
    std::vector<T> host(n);
    if (n) cudaOk(cudaMemcpy(host.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Finite values only, where sums must agree bit for bit (NaN payloads of a
/// sum are not specified alike on both sides).
std::vector<float> finiteFloats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(CudaCompressor, CastPayloadsDecodesAndResidualsMatchTheCpuCompressorBitForBit) {
  REQUIRE_GPU();
  const uint64_t seed = gradcomm::testing::compressionSeed("CudaCompressor.Cast");
  const size_t n = 100003;
  const std::vector<float> in = gradcomm::testing::mixedFloats(n, seed);
  const std::vector<float> r0 = gradcomm::testing::mixedFloats(n, seed + 1);
  for (const char* text : {"fp16", "bf16"}) {
    for (bool withResidual : {false, true}) {
      SCOPED_TRACE(std::string(text) + (withResidual ? " with residual" : ""));
      const cc::Spec spec = cc::Spec::parse(text);
      const auto cpu = cc::makeCompressor(spec, cc::MemoryKind::kHost);
      const auto gpu = cc::makeCompressor(spec, cc::MemoryKind::kDevice);
      ASSERT_EQ(gpu->memory(), cc::MemoryKind::kDevice);
      ASSERT_TRUE(gpu->summable());
      ASSERT_EQ(gpu->payloadBytes(n), cpu->payloadBytes(n));

      std::vector<float> residual = r0;
      std::vector<uint16_t> want(n);
      cpu->compress(in.data(), withResidual ? residual.data() : nullptr, n, want.data(), {0.25f, 0});
      DeviceBytes dIn(in), dResidual(r0), dPayload(gpu->payloadBytes(n));
      gpu->compress(dIn.get<float>(), withResidual ? dResidual.get<float>() : nullptr, n, dPayload.get(), {0.25f, 0});
      ASSERT_EQ(dPayload.download<uint16_t>(n), want);
      if (withResidual) {
        ASSERT_TRUE(sameBits(dResidual.download<float>(n), residual));
      }

      std::vector<float> decoded(n);
      cpu->decompress(want.data(), decoded.data(), n);
      DeviceBytes dOut(n * sizeof(float));
      gpu->decompress(dPayload.get(), dOut.get<float>(), n);
      ASSERT_TRUE(sameBits(dOut.download<float>(n), decoded));

      const std::vector<float> base = finiteFloats(n, seed + 2);
      std::vector<float> acc = base;
      cpu->decompressAdd(want.data(), acc.data(), n);
      DeviceBytes dAcc(base);
      gpu->decompressAdd(dPayload.get(), dAcc.get<float>(), n);
      ASSERT_TRUE(sameBits(dAcc.download<float>(n), acc));
    }
  }
}

TEST(CudaCompressor, ThePublicCastsGiveTheCpuCastsBits) {
  REQUIRE_GPU();
  const uint64_t seed = gradcomm::testing::compressionSeed("CudaCompressor.PublicCasts");
  const size_t n = 65537;
  const std::vector<float> in = gradcomm::testing::mixedFloats(n, seed);
  for (const char* text : {"fp16", "bf16"}) {
    SCOPED_TRACE(text);
    const auto cpu = cc::makeCompressor(cc::Spec::parse(text), cc::MemoryKind::kHost);
    std::vector<uint16_t> want(n);
    cpu->compress(in.data(), nullptr, n, want.data(), {1.0f, 0});
    std::vector<float> back(n);
    cpu->decompress(want.data(), back.data(), n);
    const DataType half = std::string(text) == "fp16" ? DataType::kFloat16 : DataType::kBFloat16;
    DeviceBytes dIn(in), dHalf(n * 2), dOut(n * sizeof(float));
    castToHalfOnDevice(dIn.get<float>(), dHalf.get(), n, half, nullptr);
    ASSERT_EQ(dHalf.download<uint16_t>(n), want);
    castFromHalfOnDevice(dHalf.get(), dOut.get<float>(), n, half, nullptr);
    ASSERT_TRUE(sameBits(dOut.download<float>(n), back));
  }
}

TEST(CudaCompressor, ExactTopKDecompressesToTheCpuCompressorsResult) {
  REQUIRE_GPU();
  const uint64_t seed = gradcomm::testing::compressionSeed("CudaCompressor.TopK");
  const size_t n = 200000;
  const std::vector<float> in = finiteFloats(n, seed);
  const std::vector<float> r0 = finiteFloats(n, seed + 1);
  const cc::Spec spec = cc::Spec::parse("topk:0.01:exact");
  const auto cpu = cc::makeCompressor(spec, cc::MemoryKind::kHost);
  const auto gpu = cc::makeCompressor(spec, cc::MemoryKind::kDevice);
  ASSERT_FALSE(gpu->summable());

  std::vector<float> residual = r0;
  std::vector<char> payload(cpu->payloadBytes(n));
  cpu->compress(in.data(), residual.data(), n, payload.data(), {1.0f, 0});
  std::vector<float> want(n);
  cpu->decompress(payload.data(), want.data(), n);

  DeviceBytes dIn(in), dResidual(r0), dPayload(gpu->payloadBytes(n)), dOut(n * sizeof(float));
  gpu->compress(dIn.get<float>(), dResidual.get<float>(), n, dPayload.get(), {1.0f, 0});
  gpu->decompress(dPayload.get(), dOut.get<float>(), n);
  EXPECT_TRUE(sameBits(dOut.download<float>(n), want));
  EXPECT_TRUE(sameBits(dResidual.download<float>(n), residual));

  // Accumulating the same payload again doubles every sent value exactly.
  gpu->decompressAdd(dPayload.get(), dOut.get<float>(), n);
  std::vector<float> twice = want;
  for (float& x : twice) x += x;
  EXPECT_TRUE(sameBits(dOut.download<float>(n), twice));
}

TEST(CudaCompressor, TopKRejectsAPayloadCountBeyondItsSlotAndPreScaling) {
  REQUIRE_GPU();
  const size_t n = 10000;
  const auto gpu = cc::makeCompressor(cc::Spec::parse("topk:100:exact"), cc::MemoryKind::kDevice);
  const std::vector<float> in = finiteFloats(n, 5);
  DeviceBytes dIn(in), dPayload(gpu->payloadBytes(n)), dOut(n * sizeof(float));
  EXPECT_THROW(gpu->compress(dIn.get<float>(), nullptr, n, dPayload.get(), {0.5f, 0}), InvalidArgument);
  gpu->compress(dIn.get<float>(), nullptr, n, dPayload.get(), {1.0f, 0});
  const uint64_t lie = 101;  // the slot holds exactly 100 entries (exact mode)
  cudaOk(cudaMemcpy(dPayload.get(), &lie, sizeof(lie), cudaMemcpyHostToDevice), "upload");
  EXPECT_THROW(gpu->decompressAdd(dPayload.get(), dOut.get<float>(), n), TransportError);
}

// decompressAll() on the device adds the slots in rank order, as the CPU
// does (the same float sums, bit for bit), and names the rank of a slot
// whose count exceeds its capacity or whose index lies past the tensor.
TEST(CudaCompressor, TopKDecompressAllSumsTheSlotsInRankOrderAndNamesAMalformedOne) {
  REQUIRE_GPU();
  const uint64_t seed = gradcomm::testing::compressionSeed("CudaCompressor.TopKAll");
  const size_t n = 50000;
  const int ranks = 4;
  const cc::Spec spec = cc::Spec::parse("topk:0.02:exact");
  const auto cpu = cc::makeCompressor(spec, cc::MemoryKind::kHost);
  const auto gpu = cc::makeCompressor(spec, cc::MemoryKind::kDevice);
  // The two sides lay out their payloads differently; exact top-k selects
  // the same entries, so the sums agree. Every rank selects the same 1,000
  // positions (every 50th, far above the noise), scaled 1e8, 1, -1e8, 3:
  // their float sum depends on the order of the ranks (in rank order
  // 1e8 b + b loses b), so any other order of the slots differs.
  const float scales[ranks] = {1e8f, 1.0f, -1e8f, 3.0f};
  const size_t cpuSlot = cpu->payloadBytes(n), slot = gpu->payloadBytes(n);
  std::vector<char> cpuPayloads(cpuSlot * ranks);
  DeviceBytes dPayloads(slot * ranks);
  for (int q = 0; q < ranks; ++q) {
    std::vector<float> in = finiteFloats(n, seed + static_cast<uint64_t>(q));
    for (float& x : in) x *= 0.01f;
    for (size_t i = 0; i < n; i += 50) in[i] = scales[q] * (100.0f + static_cast<float>(i % 7));
    cpu->compress(in.data(), nullptr, n, cpuPayloads.data() + cpuSlot * static_cast<size_t>(q), {1.0f, 0});
    DeviceBytes dIn(in);
    gpu->compress(dIn.get<float>(), nullptr, n, dPayloads.get<char>() + slot * static_cast<size_t>(q), {1.0f, 0});
    cudaOk(cudaDeviceSynchronize(), "compress");
  }
  std::vector<float> want(n);
  cpu->decompressAll(cpuPayloads.data(), cpuSlot, ranks, want.data(), n);

  DeviceBytes dOut(finiteFloats(n, seed + 9));  // decompressAll overwrites it
  gpu->decompressAll(dPayloads.get<char>(), slot, ranks, dOut.get<float>(), n);
  EXPECT_TRUE(sameBits(dOut.download<float>(n), want));
  // The check above can tell the orders apart: rank order leaves 3 b (or
  // 3 b plus a rounding step of 1e10) where summing the big pair first
  // would leave 4 b.
  EXPECT_NE(want[0], 400.0f);

  const uint64_t lie = uint64_t{1} << 40;
  cudaOk(cudaMemcpy(dPayloads.get<char>() + 2 * slot, &lie, sizeof(lie), cudaMemcpyHostToDevice), "upload");
  try {
    gpu->decompressAll(dPayloads.get<char>(), slot, ranks, dOut.get<float>(), n);
    ADD_FAILURE() << "a count beyond the slot was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("payload of rank 2: top-k payload claims 1099511627776 entries"),
              std::string::npos)
        << e.what();
  }
  // Rank 1's first index (uint32, after the 8-byte count) points past the
  // tensor; slot 2 is well formed again.
  const uint64_t count = spec.topkCount(n);
  cudaOk(cudaMemcpy(dPayloads.get<char>() + 2 * slot, &count, sizeof(count), cudaMemcpyHostToDevice), "upload");
  const uint32_t past = static_cast<uint32_t>(n) + 7;
  cudaOk(cudaMemcpy(dPayloads.get<char>() + slot + 8, &past, sizeof(past), cudaMemcpyHostToDevice), "upload");
  try {
    gpu->decompressAll(dPayloads.get<char>(), slot, ranks, dOut.get<float>(), n);
    ADD_FAILURE() << "an index past the tensor was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("payload of rank 1: top-k payload holds 1 indices past"), std::string::npos)
        << e.what();
  }
}

// decompressAllQueued() queues what decompressAll() does without waiting:
// the same sums, and a check, run after the stream, that names a
// malformed slot's rank; the caller's pinned memory holds the check.
TEST(CudaCompressor, TopKDecompressAllQueuedLeavesTheCheckForAfterTheStream) {
  REQUIRE_GPU();
  const size_t n = 20000;
  const int ranks = 3;
  const auto gpu = cc::makeCompressor(cc::Spec::parse("topk:100:exact"), cc::MemoryKind::kDevice);
  const size_t slot = gpu->payloadBytes(n);
  DeviceBytes dPayloads(slot * ranks);
  for (int q = 0; q < ranks; ++q) {
    DeviceBytes dIn(finiteFloats(n, 40 + static_cast<uint64_t>(q)));
    gpu->compress(dIn.get<float>(), nullptr, n, dPayloads.get<char>() + slot * static_cast<size_t>(q), {1.0f, 0});
  }
  cudaOk(cudaDeviceSynchronize(), "compress");
  DeviceBytes want(n * sizeof(float)), got(n * sizeof(float));
  gpu->decompressAll(dPayloads.get<char>(), slot, ranks, want.get<float>(), n);
  void* pinned = nullptr;
  cudaOk(cudaMallocHost(&pinned, gpu->queuedCheckBytes(ranks)), "cudaMallocHost");
  auto check = gpu->decompressAllQueued(dPayloads.get<char>(), slot, ranks, got.get<float>(), n, pinned);
  cudaOk(cudaDeviceSynchronize(), "decompress");
  EXPECT_NO_THROW(check());
  EXPECT_TRUE(sameBits(got.download<float>(n), want.download<float>(n)));
  const uint64_t lie = 101;  // the slot holds exactly 100 entries
  cudaOk(cudaMemcpy(dPayloads.get<char>() + 2 * slot, &lie, sizeof(lie), cudaMemcpyHostToDevice), "upload");
  check = gpu->decompressAllQueued(dPayloads.get<char>(), slot, ranks, got.get<float>(), n, pinned);
  cudaOk(cudaDeviceSynchronize(), "decompress");
  try {
    check();
    ADD_FAILURE() << "the queued check accepted a count beyond the slot";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("payload of rank 2: top-k payload claims 101 entries"), std::string::npos)
        << e.what();
  }
  cudaFreeHost(pinned);
}
