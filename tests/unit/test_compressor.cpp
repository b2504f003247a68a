// The Compressor interface (compression/compressor.hpp) on the CPU: what the
// factory builds and rejects, payload sizes, round trips against the cast
// and top-k kernels, and error feedback conserving the gradient exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "compression/compressor.hpp"
#include "compression/cpu/cast.hpp"
#include "compression/sparse_format.hpp"
#include "gradcomm/error.hpp"
#include "kernels/reduce.hpp"
#include "support/compression_reference.hpp"

#if GRADCOMM_HAVE_CUDA
#include "kernels/reduce_cuda.hpp"
#endif

using namespace gradcomm;
using namespace gradcomm::compression;

namespace {

std::vector<float> randomGradient(size_t n, uint64_t seed, float spread = 4.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::string what(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- factory ------------------------------------------------------------------------

TEST(CompressorFactory, BuildsAHostCompressorOfEachKindThatSaysHowItsPayloadsCombine) {
  const auto fp16 = makeCompressor(Spec::parse("fp16"), MemoryKind::kHost);
  EXPECT_EQ(fp16->kind(), Kind::kFp16);
  EXPECT_EQ(fp16->memory(), MemoryKind::kHost);
  EXPECT_TRUE(fp16->summable());
  EXPECT_EQ(fp16->payloadType(), DataType::kFloat16);

  const auto bf16 = makeCompressor(Spec::parse("bf16"), MemoryKind::kHost);
  EXPECT_EQ(bf16->kind(), Kind::kBf16);
  EXPECT_TRUE(bf16->summable());
  EXPECT_EQ(bf16->payloadType(), DataType::kBFloat16);

  const auto topk = makeCompressor(Spec::parse("topk:0.01"), MemoryKind::kHost);
  EXPECT_EQ(topk->kind(), Kind::kTopK);
  EXPECT_EQ(topk->memory(), MemoryKind::kHost);
  EXPECT_FALSE(topk->summable());
  EXPECT_EQ(topk->payloadType(), DataType::kUInt8);
}

TEST(CompressorFactory, RejectsNoCompressionSayingWhatToAskFor) {
  const std::string msg = what([] { makeCompressor(Spec::parse("none"), MemoryKind::kHost); });
  EXPECT_NE(msg.find("fp16, bf16 or topk"), std::string::npos) << msg;
  EXPECT_THROW(makeCompressor(Spec::parse("none"), MemoryKind::kHost), InvalidArgument);
  EXPECT_THROW(makeCompressor(Spec::parse("none"), MemoryKind::kDevice), InvalidArgument);
}

TEST(CompressorFactory, RejectsDeviceMemoryWhereNoGpuCanRunIt) {
  for (const char* text : {"fp16", "bf16", "topk:0.01"}) {
    const Spec spec = Spec::parse(text);
#if GRADCOMM_HAVE_CUDA
    std::string why;
    if (kernels::cuda::deviceCount(&why) > 0) {
      const auto c = makeCompressor(spec, MemoryKind::kDevice);
      EXPECT_EQ(c->memory(), MemoryKind::kDevice) << text;
      EXPECT_EQ(c->kind(), spec.kind) << text;
      continue;
    }
    const char* expected = "needs a usable GPU";
#else
    const char* expected = "built without it";
#endif
    EXPECT_THROW(makeCompressor(spec, MemoryKind::kDevice), UnsupportedError) << text;
    const std::string msg = what([&] { makeCompressor(spec, MemoryKind::kDevice); });
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  }
}

TEST(CompressorFactory, CompressionAndReductionKernelsShareOneCpuDetection) {
  EXPECT_EQ(detectIsa(), kernels::detectSimd());
  EXPECT_EQ(kernels::resolveSimd("scalar"), kernels::SimdLevel::kScalar);
  EXPECT_LE(static_cast<int>(kernels::resolveSimd("avx512bf16")), static_cast<int>(kernels::detectSimd()));
  EXPECT_THROW(kernels::resolveSimd("sse9"), ConfigError);
  // The reduction kernels have no BF16 level of their own: they run AVX-512.
  EXPECT_EQ(&kernels::reduceTable(kernels::SimdLevel::kAvx512Bf16), &kernels::reduceTable(kernels::SimdLevel::kAvx512));
  std::printf("[   info   ] CPU kernel level: %s\n", kernels::toString(kernels::detectSimd()));
}

// ---- casts --------------------------------------------------------------------------

TEST(CpuCastCompressor, PayloadIsTwoBytesPerElement) {
  for (const char* text : {"fp16", "bf16"}) {
    const auto c = makeCompressor(Spec::parse(text), MemoryKind::kHost);
    EXPECT_EQ(c->payloadBytes(0), 0u);
    EXPECT_EQ(c->payloadBytes(1), 2u);
    EXPECT_EQ(c->payloadBytes(2500), 5000u);
  }
}

TEST(CpuCastCompressor, RoundTripMatchesTheCastKernelsAtEveryLevel) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CpuCastCompressor.RoundTrip");
  const size_t n = 2500;  // not a multiple of decompressAdd's block
  const auto in = randomGradient(n, seed);
  const auto base = randomGradient(n, seed + 1);
  for (const char* text : {"fp16", "bf16"}) {
    const Spec spec = Spec::parse(text);
    const DataType half = spec.kind == Kind::kFp16 ? DataType::kFloat16 : DataType::kBFloat16;
    for (Isa isa : kernels::supportedSimdLevels()) {
      SCOPED_TRACE(std::string(text) + " " + toString(isa));
      const auto c = makeCompressor(spec, MemoryKind::kHost, isa);
      std::vector<uint16_t> payload(n), want(n);
      c->compress(in.data(), nullptr, n, payload.data(), {0.5f, 0});
      castToHalf(in.data(), want.data(), n, half, 0.5f, Isa::kScalar);
      ASSERT_EQ(payload, want);

      std::vector<float> decoded(n), wantDecoded(n);
      c->decompress(payload.data(), decoded.data(), n);
      decodeHalf(want.data(), wantDecoded.data(), n, half, Isa::kScalar);
      ASSERT_EQ(0, std::memcmp(decoded.data(), wantDecoded.data(), n * sizeof(float)));

      std::vector<float> acc = base;
      c->decompressAdd(payload.data(), acc.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], base[i] + wantDecoded[i]) << "at " << i;
    }
  }
}

TEST(CpuCastCompressor, ErrorFeedbackKeepsExactlyWhatWasNotSent) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CpuCastCompressor.ErrorFeedback");
  const size_t n = 4099;
  const auto in = randomGradient(n, seed);
  const auto r0 = randomGradient(n, seed + 7, 0.01f);
  for (const char* text : {"fp16", "bf16"}) {
    // Power-of-two scales keep every step exact, so conservation is exact.
    for (float scale : {1.0f, 0.25f}) {
      SCOPED_TRACE(std::string(text) + " scale=" + std::to_string(scale));
      const auto c = makeCompressor(Spec::parse(text), MemoryKind::kHost);
      std::vector<float> residual = r0;
      std::vector<uint16_t> payload(n);
      c->compress(in.data(), residual.data(), n, payload.data(), {scale, 0});
      std::vector<float> sent(n);
      c->decompress(payload.data(), sent.data(), n);
      size_t carried = 0;
      for (size_t i = 0; i < n; ++i) {
        const float t = in[i] + r0[i];
        ASSERT_EQ(sent[i] / scale + residual[i], t) << "at " << i;
        carried += residual[i] != 0.0f;
      }
      EXPECT_GT(carried, n / 2);  // rounding left something behind almost everywhere
    }
  }
}

// ---- top-k --------------------------------------------------------------------------

TEST(CpuTopKCompressor, PayloadSlotIsFixedPaddedAndHoldsTheLargestSelection) {
  for (const char* text : {"topk:0.01", "topk:0.01:exact", "topk:3", "topk:1.0"}) {
    const Spec spec = Spec::parse(text);
    const auto c = makeCompressor(spec, MemoryKind::kHost);
    for (size_t n : {size_t{0}, size_t{1}, size_t{10}, size_t{1000}, size_t{100000}}) {
      SCOPED_TRACE(std::string(text) + " n=" + std::to_string(n));
      const size_t bytes = c->payloadBytes(n);
      EXPECT_EQ(bytes % 8, 0u);
      const size_t k = n ? spec.topkCount(n) : 0;
      const size_t kmax = spec.approximate ? std::min(n, k + k / 10 + 1) : k;
      EXPECT_GE(bytes, 8 + encodedBytes(n, kmax));
      EXPECT_LT(bytes, 8 + encodedBytes(n, kmax) + 8);
    }
  }
}

TEST(CpuTopKCompressor, RoundTripCarriesExactlyTheLargestMagnitudes) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CpuTopKCompressor.RoundTrip");
  const size_t n = 50000;
  const auto in = randomGradient(n, seed);
  const Spec spec = Spec::parse("topk:0.01:exact");
  const size_t k = spec.topkCount(n);
  std::vector<float> sorted(n);
  std::transform(in.begin(), in.end(), sorted.begin(), [](float x) { return std::fabs(x); });
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k - 1), sorted.end(),
                   std::greater<float>());
  const float kth = sorted[k - 1];
  for (Isa isa : kernels::supportedSimdLevels()) {
    SCOPED_TRACE(toString(isa));
    const auto c = makeCompressor(spec, MemoryKind::kHost, isa);
    std::vector<char> payload(c->payloadBytes(n));
    c->compress(in.data(), nullptr, n, payload.data(), {1.0f, 42});
    std::vector<float> out(n, 123.0f);  // decompress overwrites everything
    c->decompress(payload.data(), out.data(), n);
    size_t sent = 0;
    for (size_t i = 0; i < n; ++i) {
      if (out[i] == 0.0f) {
        ASSERT_LE(std::fabs(in[i]), kth) << "unsent larger element at " << i;
        continue;
      }
      ASSERT_EQ(out[i], in[i]) << "at " << i;
      ASSERT_GE(std::fabs(in[i]), kth) << "sent smaller element at " << i;
      ++sent;
    }
    EXPECT_EQ(sent, k);
  }
}

TEST(CpuTopKCompressor, DecompressAddSumsThePayloadsOfSeveralRanks) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CpuTopKCompressor.DecompressAdd");
  const size_t n = 3000;
  const auto c = makeCompressor(Spec::parse("topk:100"), MemoryKind::kHost);
  std::vector<float> want(n, 0.0f), out(n, 0.0f);
  for (uint64_t rank = 0; rank < 3; ++rank) {
    const auto in = randomGradient(n, seed + rank);
    std::vector<char> payload(c->payloadBytes(n));
    c->compress(in.data(), nullptr, n, payload.data(), {1.0f, rank});
    std::vector<float> mine(n);
    c->decompress(payload.data(), mine.data(), n);
    for (size_t i = 0; i < n; ++i) want[i] += mine[i];
    c->decompressAdd(payload.data(), out.data(), n);
  }
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), n * sizeof(float)));
  EXPECT_GT(std::count_if(out.begin(), out.end(), [](float x) { return x != 0.0f; }), 100);
}

TEST(CpuTopKCompressor, ErrorFeedbackKeepsExactlyWhatWasNotSent) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CpuTopKCompressor.ErrorFeedback");
  const size_t n = 70000;  // large enough for the sampled threshold
  const auto in = randomGradient(n, seed);
  const auto r0 = randomGradient(n, seed + 3, 1.0f);
  for (const char* text : {"topk:0.01", "topk:0.01:exact"}) {
    SCOPED_TRACE(text);
    const auto c = makeCompressor(Spec::parse(text), MemoryKind::kHost);
    std::vector<float> residual = r0;
    std::vector<char> payload(c->payloadBytes(n));
    c->compress(in.data(), residual.data(), n, payload.data(), {1.0f, seed});
    std::vector<float> sent(n);
    c->decompress(payload.data(), sent.data(), n);
    size_t sentCount = 0;
    for (size_t i = 0; i < n; ++i) {
      const float t = in[i] + r0[i];
      // Each position is either sent whole (residual zeroed) or kept whole.
      ASSERT_TRUE((sent[i] == t && residual[i] == 0.0f) || (sent[i] == 0.0f && residual[i] == t)) << "at " << i;
      sentCount += sent[i] != 0.0f;
    }
    EXPECT_GE(sentCount, 630u);
    EXPECT_LE(sentCount, 771u);
  }
}

TEST(CpuTopKCompressor, RejectsPreScalingAndOversizedPayloads) {
  const size_t n = 1000;
  const auto c = makeCompressor(Spec::parse("topk:10"), MemoryKind::kHost);
  const auto in = randomGradient(n, 1);
  std::vector<char> payload(c->payloadBytes(n));
  EXPECT_THROW(c->compress(in.data(), nullptr, n, payload.data(), {0.5f, 0}), InvalidArgument);

  c->compress(in.data(), nullptr, n, payload.data(), {1.0f, 0});
  const uint64_t lie = payload.size();  // more than the slot minus its 8-byte length
  std::memcpy(payload.data(), &lie, sizeof(lie));
  std::vector<float> out(n, 0.0f);
  EXPECT_THROW(c->decompressAdd(payload.data(), out.data(), n), TransportError);
  const std::string msg = what([&] { c->decompress(payload.data(), out.data(), n); });
  EXPECT_NE(msg.find("more than its slot"), std::string::npos) << msg;
}
