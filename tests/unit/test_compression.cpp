// Compression: Spec parsing, the residual buffer, the fp16/bf16 casts and
// fused error-feedback cast at every ISA level against an independent
// reference, top-k (exact against brute force, approximate within 10% of k
// on several distributions), error feedback conserving the gradient, and
// scatter-add.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compression/compression.hpp"
#include "compression/cpu/cast.hpp"
#include "compression/cpu/isa.hpp"
#include "compression/cpu/topk.hpp"
#include "compression/cuda/radix_select.hpp"
#include "compression/sparse_tensor.hpp"
#include "gradcomm/error.hpp"
#include "support/compression_reference.hpp"

using namespace gradcomm;
using namespace gradcomm::compression;
using gradcomm::testing::bitsOf;
using gradcomm::testing::floatOf;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string describe(Isa isa, DataType type, float scale) {
  return std::string(toString(isa)) + " " + toString(type) + " scale=" + std::to_string(scale);
}

std::vector<uint64_t> indicesOf(const SparseTensor& s) {
  std::vector<uint64_t> out(s.nnz());
  for (size_t i = 0; i < s.nnz(); ++i) out[i] = s.index(i);
  return out;
}

}  // namespace

// ---- Spec -------------------------------------------------------------------------

TEST(CompressionSpec, ParsesEveryKindWithItsDefaults) {
  Spec none = Spec::parse("none");
  EXPECT_EQ(none.kind, Kind::kNone);
  EXPECT_FALSE(none.errorFeedback);

  Spec fp16 = Spec::parse("fp16");
  EXPECT_EQ(fp16.kind, Kind::kFp16);
  EXPECT_FALSE(fp16.errorFeedback);  // off by default for casts
  EXPECT_FALSE(fp16.prescale);
  EXPECT_FALSE(fp16.approximate);
  EXPECT_EQ(Spec::parse("bf16").kind, Kind::kBf16);

  Spec ratio = Spec::parse("topk:0.01");
  EXPECT_EQ(ratio.kind, Kind::kTopK);
  EXPECT_DOUBLE_EQ(ratio.ratio, 0.01);
  EXPECT_EQ(ratio.count, 0u);
  EXPECT_TRUE(ratio.errorFeedback);  // on by default for top-k
  EXPECT_TRUE(ratio.approximate);

  Spec count = Spec::parse("topk:1000");
  EXPECT_EQ(count.count, 1000u);
  EXPECT_EQ(count.ratio, 0.0);
  EXPECT_EQ(Spec::parse("topk:1").count, 1u);       // a plain integer is a count
  EXPECT_EQ(Spec::parse("topk:1.0").ratio, 1.0);    // a '.' makes it a fraction
  EXPECT_EQ(Spec::parse("topk:1e-3").ratio, 1e-3);
}

TEST(CompressionSpec, ParsesSuffixesInAnyOrderAndCase) {
  Spec s = Spec::parse("topk:0.05:ef=0:exact:prescale");
  EXPECT_FALSE(s.errorFeedback);
  EXPECT_FALSE(s.approximate);
  EXPECT_TRUE(s.prescale);
  Spec t = Spec::parse("  TopK:500:Prescale:EF=1 ");
  EXPECT_EQ(t.count, 500u);
  EXPECT_TRUE(t.prescale);
  EXPECT_TRUE(t.errorFeedback);
  EXPECT_TRUE(t.approximate);
  Spec h = Spec::parse("fp16:ef=1:prescale");
  EXPECT_TRUE(h.errorFeedback);
  EXPECT_TRUE(h.prescale);
  EXPECT_TRUE(Spec::parse("bf16:prescale").prescale);
}

TEST(CompressionSpec, RejectsMalformedTextSayingWhatIsValid) {
  for (const char* bad : {"", "fp32", "topk", "topk:", "topk:0", "topk:0.0", "topk:1.5", "topk:-0.1", "topk:abc",
                          "topk:nan", "topk:inf", "topk:0x10", "topk:1e", "fp16:exact", "none:ef=1", "none:prescale",
                          "topk:0.1:ef=2", "topk:0.1:ef=1:ef=0", "topk:0.1:exact:exact", "topk:0.1:bogus", "fp16:",
                          "fp16::prescale", "topk:99999999999999999999999", ":fp16"}) {
    try {
      Spec::parse(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("expected none | fp16 | bf16 | topk:"), std::string::npos) << msg;
    }
  }
}

TEST(CompressionSpec, ToStringRoundTrips) {
  for (const char* text : {"none", "fp16", "bf16", "fp16:ef=1", "bf16:prescale", "topk:0.01", "topk:1000",
                           "topk:1.0", "topk:0.3:ef=0", "topk:7:exact:prescale", "topk:1e-07", "topk:0.123456789"}) {
    const Spec spec = Spec::parse(text);
    EXPECT_EQ(Spec::parse(spec.toString()), spec) << text << " -> " << spec.toString();
  }
  EXPECT_EQ(Spec::parse("topk:0.01").toString(), "topk:0.01");
  EXPECT_EQ(Spec::parse("topk:1.0").toString(), "topk:1.0");
  EXPECT_EQ(Spec::parse("topk:5:exact:ef=0").toString(), "topk:5:ef=0:exact");
}

TEST(CompressionSpec, TopkCountIsAtLeastOneAndAtMostN) {
  EXPECT_EQ(Spec::parse("topk:0.01").topkCount(1000), 10u);
  EXPECT_EQ(Spec::parse("topk:0.01").topkCount(1001), 11u);  // rounds up
  EXPECT_EQ(Spec::parse("topk:0.01").topkCount(1), 1u);
  EXPECT_EQ(Spec::parse("topk:1e-9").topkCount(100), 1u);
  EXPECT_EQ(Spec::parse("topk:0.01").topkCount(0), 0u);
  EXPECT_EQ(Spec::parse("topk:1.0").topkCount(12345), 12345u);
  EXPECT_EQ(Spec::parse("topk:1000").topkCount(10), 10u);
  EXPECT_EQ(Spec::parse("topk:1000").topkCount(5000), 1000u);
  EXPECT_EQ(Spec::parse("topk:0.5").topkCount(size_t{1} << 40), size_t{1} << 39);
  EXPECT_THROW(Spec::parse("fp16").topkCount(10), InvalidUsage);
}

// ---- Residual ---------------------------------------------------------------------

TEST(CompressionResidual, IsZeroOnFirstUseAndKeepsItsSize) {
  Residual r;
  EXPECT_TRUE(r.empty());
  float* p = r.data(100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(r.size(), 100u);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(p[i], 0.0f);
  p[3] = 2.5f;
  EXPECT_EQ(r.data(100)[3], 2.5f);
  EXPECT_THROW(r.data(99), InvalidArgument);
  r.clear();
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.data(7)[3], 0.0f);
  EXPECT_EQ(r.size(), 7u);
}

TEST(CompressionResidual, LivesWhereItsFirstUsePutsItUntilCleared) {
  // A stand-in for device memory: the allocator is all the residual sees.
  int allocations = 0;
  const Residual::DeviceAllocator allocate = [&](size_t bytes) {
    ++allocations;
    auto block = std::make_shared<std::vector<float>>(bytes / sizeof(float), 0.0f);
    return std::shared_ptr<void>(block, block->data());
  };
  Residual r;
  EXPECT_EQ(r.device(), -1);
  float* d = r.deviceData(50, 1, allocate);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(r.device(), 1);
  EXPECT_EQ(r.size(), 50u);
  EXPECT_EQ(r.data(), d);
  EXPECT_EQ(r.deviceData(50, 1, allocate), d);
  EXPECT_EQ(allocations, 1);
  EXPECT_THROW(r.deviceData(49, 1, allocate), InvalidArgument);
  try {
    r.data(50);
    ADD_FAILURE() << "a device residual served a host call";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lives in device memory (device 1)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.deviceData(50, 0, allocate), InvalidArgument);
  EXPECT_THROW(r.checkPlace(-1), InvalidArgument);
  EXPECT_NO_THROW(r.checkPlace(1));
  r.clear();
  EXPECT_EQ(r.device(), -1);
  EXPECT_NO_THROW(r.checkPlace(-1));
  r.data(10);
  EXPECT_THROW(r.deviceData(10, 0, allocate), InvalidArgument);
  EXPECT_THROW(r.checkPlace(0), InvalidArgument);
  EXPECT_EQ(allocations, 1);
}

// ---- casts --------------------------------------------------------------------------

TEST(CompressionIsa, DetectsAndResolvesLevels) {
  const auto isas = kernels::supportedSimdLevels();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  EXPECT_EQ(isas.back(), detectIsa());
  EXPECT_EQ(kernels::resolveSimd("scalar"), Isa::kScalar);
  EXPECT_EQ(kernels::resolveSimd("auto"), detectIsa());
  EXPECT_EQ(kernels::resolveSimd("avx512bf16"), detectIsa() >= Isa::kAvx512Bf16 ? Isa::kAvx512Bf16 : detectIsa());
  EXPECT_THROW(kernels::resolveSimd("sse9"), ConfigError);
  std::printf("[   info   ] compression ISA: %s\n", toString(detectIsa()));
}

TEST(CompressionCast, EveryLevelMatchesTheReferenceOnSpecialAndRandomValues) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionCast");
  std::vector<float> in = gradcomm::testing::specialFloats();
  const std::vector<float> mixed = gradcomm::testing::mixedFloats(20000, seed);
  in.insert(in.end(), mixed.begin(), mixed.end());
  for (Isa isa : kernels::supportedSimdLevels()) {
    for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
      const bool fp16 = type == DataType::kFloat16;
      for (float scale : {1.0f, 0.25f, 1.0f / 3.0f, 3.0f}) {
        // Every start offset and a length that is no multiple of a vector.
        for (size_t offset : {size_t{0}, size_t{1}, size_t{7}, size_t{15}}) {
          const size_t n = in.size() - offset - 3;
          std::vector<uint16_t> out(n + 1, 0xABCD);
          castToHalf(in.data() + offset, out.data(), n, type, scale, isa);
          for (size_t i = 0; i < n; ++i) {
            const float y = in[offset + i] * scale;
            ASSERT_EQ(out[i], gradcomm::testing::refEncode(fp16, y))
                << describe(isa, type, scale) << " input bits 0x" << std::hex << bitsOf(in[offset + i]) << " at "
                << std::dec << i;
          }
          EXPECT_EQ(out[n], 0xABCD) << "wrote past the end";
        }
      }
    }
  }
}

TEST(CompressionCast, Fp16SaturatesFiniteOverflowButKeepsInfinityAndNan) {
  for (Isa isa : kernels::supportedSimdLevels()) {
    std::vector<float> in = {65504.0f, 65519.0f, 65520.0f, 1e5f, -1e30f, std::numeric_limits<float>::max(), kInf,
                             -kInf, std::nanf("")};
    in.resize(40, 1.0f);  // long enough for the vector paths
    std::vector<uint16_t> out(in.size());
    castToHalf(in.data(), out.data(), in.size(), DataType::kFloat16, 1.0f, isa);
    EXPECT_EQ(out[0], 0x7BFF) << toString(isa);
    EXPECT_EQ(out[1], 0x7BFF) << toString(isa);
    EXPECT_EQ(out[2], 0x7BFF) << toString(isa);  // IEEE would give inf
    EXPECT_EQ(out[3], 0x7BFF) << toString(isa);
    EXPECT_EQ(out[4], 0xFBFF) << toString(isa);
    EXPECT_EQ(out[5], 0x7BFF) << toString(isa);
    EXPECT_EQ(out[6], 0x7C00) << toString(isa);
    EXPECT_EQ(out[7], 0xFC00) << toString(isa);
    EXPECT_EQ(out[8] & 0x7C00, 0x7C00) << toString(isa);
    EXPECT_NE(out[8] & 0x03FF, 0) << toString(isa);
    // Pre-scaling happens before saturation: 1e5 * 0.5 fits.
    castToHalf(in.data(), out.data(), in.size(), DataType::kFloat16, 0.5f, isa);
    EXPECT_EQ(out[3], gradcomm::testing::refHalf(5e4f)) << toString(isa);
  }
}

TEST(CompressionCast, Bf16KeepsIeeeOverflowAndSubnormalsInEveryVectorLane) {
  for (Isa isa : kernels::supportedSimdLevels()) {
    // One subnormal in an otherwise normal vector, at every lane of a 32-wide
    // block: the AVX-512 BF16 instruction would flush it to zero.
    for (size_t lane = 0; lane < 32; ++lane) {
      std::vector<float> in(64, 1.5f);
      in[lane] = floatOf(0x00012345);
      in[lane + 32] = -std::numeric_limits<float>::denorm_min();
      std::vector<uint16_t> out(in.size());
      castToHalf(in.data(), out.data(), in.size(), DataType::kBFloat16, 1.0f, isa);
      EXPECT_EQ(out[lane], 0x0001) << toString(isa) << " lane " << lane;
      EXPECT_EQ(out[lane + 32], 0x8000) << toString(isa) << " lane " << lane;  // rounds to -0
      EXPECT_EQ(out[(lane + 1) % 32], 0x3FC0) << toString(isa);
    }
    std::vector<float> big(32, std::numeric_limits<float>::max());
    std::vector<uint16_t> out(32);
    castToHalf(big.data(), out.data(), big.size(), DataType::kBFloat16, 1.0f, isa);
    EXPECT_EQ(out[31], 0x7F80) << toString(isa);  // IEEE: FLT_MAX rounds up to inf in bf16
  }
}

TEST(CompressionCast, DecodeIsExactForEveryEncoding) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : kernels::supportedSimdLevels()) {
    for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
      const bool fp16 = type == DataType::kFloat16;
      std::vector<float> out(all.size() + 1, 7.0f);
      decodeHalf(all.data() + 1, out.data(), all.size() - 1, type, isa);
      for (size_t i = 1; i < all.size(); ++i) {
        ASSERT_EQ(bitsOf(out[i - 1]), bitsOf(gradcomm::testing::refDecode(fp16, all[i])))
            << toString(isa) << " " << toString(type) << " bits " << i;
      }
      EXPECT_EQ(out[all.size() - 1], 7.0f);
      // And every finite encoding survives decode -> encode unchanged.
      std::vector<uint16_t> back(all.size());
      decodeHalf(all.data(), out.data(), all.size(), type, isa);
      castToHalf(out.data(), back.data(), all.size(), type, 1.0f, isa);
      for (size_t i = 0; i < all.size(); ++i) {
        if (std::isnan(out[i])) continue;
        ASSERT_EQ(back[i], all[i]) << toString(isa) << " " << toString(type) << " " << i;
      }
    }
  }
}

TEST(CompressionCast, RejectsBadArguments) {
  float in[4] = {};
  uint16_t out[4];
  EXPECT_THROW(castToHalf(in, out, 4, DataType::kFloat32), InvalidArgument);
  EXPECT_THROW(castToHalf(in, out, 4, DataType::kFloat16, 0.0f), InvalidArgument);
  EXPECT_THROW(castToHalf(in, out, 4, DataType::kFloat16, -1.0f), InvalidArgument);
  EXPECT_THROW(castToHalf(in, out, 4, DataType::kFloat16, kInf), InvalidArgument);
  EXPECT_THROW(castToHalf(nullptr, out, 4, DataType::kFloat16), InvalidArgument);
  EXPECT_NO_THROW(castToHalf(nullptr, nullptr, 0, DataType::kFloat16));
  EXPECT_THROW(castWithResidual(in, nullptr, out, 4, DataType::kBFloat16), InvalidArgument);
  EXPECT_THROW(decodeHalf(out, in, 4, DataType::kInt8), InvalidArgument);
}

// ---- fused residual + cast ----------------------------------------------------------

TEST(CompressionResidualCast, EveryLevelMatchesTheDocumentedFormulaBitForBit) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionResidualCast");
  std::vector<float> in = gradcomm::testing::specialFloats();
  const std::vector<float> mixed = gradcomm::testing::mixedFloats(5000, seed);
  in.insert(in.end(), mixed.begin(), mixed.end());
  const std::vector<float> startResidual = gradcomm::testing::mixedFloats(in.size(), seed + 1);
  for (Isa isa : kernels::supportedSimdLevels()) {
    for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
      const bool fp16 = type == DataType::kFloat16;
      for (float scale : {1.0f, 0.5f, 1.0f / 3.0f, 1.0f / 7.0f}) {
        std::vector<float> residual = startResidual;
        for (float& r : residual) r = std::isfinite(r) ? r * 1e-3f : 0.0f;
        const std::vector<float> before = residual;
        std::vector<uint16_t> out(in.size());
        castWithResidual(in.data(), residual.data(), out.data(), in.size(), type, scale, isa);
        for (size_t i = 0; i < in.size(); ++i) {
          const float t = in[i] + before[i];
          const uint16_t q = gradcomm::testing::refEncode(fp16, t * scale);
          ASSERT_EQ(out[i], q) << describe(isa, type, scale) << " at " << i << " t=" << t;
          const float r = gradcomm::testing::refResidual(t, scale, gradcomm::testing::refDecode(fp16, q));
          ASSERT_EQ(bitsOf(residual[i]), bitsOf(r)) << describe(isa, type, scale) << " at " << i << " t=" << t;
        }
      }
    }
  }
}

TEST(CompressionResidualCast, CarriesTheSaturatedExcessAndDropsNonFiniteError) {
  for (Isa isa : kernels::supportedSimdLevels()) {
    std::vector<float> in(33, 0.0f), residual(33, 0.0f);
    std::vector<uint16_t> out(33);
    in[0] = 1e5f;
    in[1] = kInf;
    in[2] = std::nanf("");
    castWithResidual(in.data(), residual.data(), out.data(), in.size(), DataType::kFloat16, 1.0f, isa);
    EXPECT_EQ(out[0], 0x7BFF);
    EXPECT_EQ(residual[0], 1e5f - 65504.0f) << toString(isa);
    EXPECT_EQ(out[1], 0x7C00);
    EXPECT_EQ(residual[1], 0.0f) << toString(isa);  // inf - inf would be NaN forever
    EXPECT_EQ(residual[2], 0.0f) << toString(isa);
    // Next step, with no new gradient, sends the excess.
    std::fill(in.begin(), in.end(), 0.0f);
    castWithResidual(in.data(), residual.data(), out.data(), in.size(), DataType::kFloat16, 1.0f, isa);
    EXPECT_EQ(gradcomm::testing::refHalfValue(out[0]), 34496.0f) << toString(isa);
    EXPECT_EQ(residual[0], 0.0f) << toString(isa);
  }
}

// Over many steps, what was sent (in gradient units, d/scale) plus the final
// residual equals the sum of the inputs: error feedback loses nothing beyond
// float32 rounding, while plain casting loses a half-precision ulp a step.
TEST(CompressionResidualCast, ErrorFeedbackLosesNothingOverManySteps) {
  const uint64_t seed = gradcomm::testing::compressionSeed("ErrorFeedbackLosesNothingOverManySteps");
  constexpr size_t kN = 4099, kSteps = 200;
  for (Isa isa : kernels::supportedSimdLevels()) {
    for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
      const bool fp16 = type == DataType::kFloat16;
      for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> residual(kN, 0.0f), in(kN);
        std::vector<uint16_t> out(kN);
        std::vector<double> sumIn(kN, 0.0), sumSent(kN, 0.0), sumSentPlain(kN, 0.0);
        for (size_t step = 0; step < kSteps; ++step) {
          for (size_t i = 0; i < kN; ++i) {
            in[i] = normal(rng) * (i % 7 == 0 ? 1e-4f : 1.0f);  // some tiny gradients that plain casts lose
            if (fp16 && i == 5 && step % 50 == 0) in[i] = 2e5f;  // spikes that saturate
            sumIn[i] += in[i];
            sumSentPlain[i] += gradcomm::testing::refDecode(fp16, gradcomm::testing::refEncode(fp16, in[i] * scale)) /
                               static_cast<double>(scale);
          }
          castWithResidual(in.data(), residual.data(), out.data(), kN, type, scale, isa);
          for (size_t i = 0; i < kN; ++i) {
            sumSent[i] += static_cast<double>(gradcomm::testing::refDecode(fp16, out[i])) / static_cast<double>(scale);
          }
        }
        double worst = 0, worstPlain = 0;
        for (size_t i = 0; i < kN; ++i) {
          const double tolerance = kSteps * std::ldexp(std::max(1.0, std::fabs(sumIn[i])), -22) + (i == 5 ? 1e-2 : 0.0);
          const double lost = std::fabs(sumSent[i] + residual[i] - sumIn[i]);
          ASSERT_LE(lost, tolerance) << describe(isa, type, scale) << " element " << i;
          worst = std::max(worst, lost);
          worstPlain = std::max(worstPlain, std::fabs(sumSentPlain[i] - sumIn[i]));
        }
        EXPECT_LT(worst * 100, worstPlain) << describe(isa, type, scale);
      }
    }
  }
}

// ---- top-k ---------------------------------------------------------------------------

namespace {

std::vector<float> distribution(const std::string& name, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  if (name == "uniform") {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float& x : v) x = d(rng);
  } else if (name == "normal") {
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : v) x = d(rng);
  } else if (name == "heavy-tailed") {
    std::cauchy_distribution<float> d(0.0f, 1.0f);
    for (float& x : v) x = d(rng);
  } else if (name == "many-equal") {
    // 60% exactly +-0.5, the rest spread below and above: ties straddle k.
    std::uniform_real_distribution<float> d(0.0f, 1.0f);
    for (float& x : v) {
      const float u = d(rng);
      x = u < 0.6f ? (rng() & 1 ? 0.5f : -0.5f) : d(rng) * (u < 0.995f ? 0.5f : 2.0f);
    }
  } else if (name == "few-values") {
    for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
  } else if (name == "all-zeros") {
    std::fill(v.begin(), v.end(), 0.0f);
  } else if (name == "ascending") {
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * (i % 2 ? 1.0f : -1.0f);
  } else if (name == "layers") {
    // Blocks of very different scale, as in a bucket of several layers.
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) v[i] = d(rng) * std::pow(10.0f, static_cast<float>((i / 4096) % 7) - 3.0f);
  }
  return v;
}

const char* const kDistributions[] = {"uniform", "normal", "heavy-tailed", "many-equal",
                                      "few-values", "all-zeros", "ascending", "layers"};

}  // namespace

TEST(CompressionTopK, ExactMatchesBruteForceAtEveryLevel) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionTopK.Exact");
  for (Isa isa : kernels::supportedSimdLevels()) {
    for (const char* dist : kDistributions) {
      for (size_t n : {size_t{1}, size_t{2}, size_t{17}, size_t{1000}, size_t{40009}}) {
        const std::vector<float> t = distribution(dist, n, seed + n);
        for (size_t k : {size_t{1}, size_t{3}, n / 100 + 1, n / 2 + 1, n - 1, n}) {
          if (k == 0 || k > n) continue;
          // Both paths: the histogram path (sampling off) and the sampled one.
          for (size_t sampleSize : {size_t{0}, size_t{512}}) {
            TopKOptions o;
            o.k = k;
            o.approximate = false;
            o.sampleSize = sampleSize;
            o.seed = seed;
            o.isa = isa;
            SparseTensor out;
            TopKStats stats;
            topk(t.data(), nullptr, n, o, out, &stats);
            ASSERT_EQ(out.denseCount, n);
            ASSERT_EQ(indicesOf(out), gradcomm::testing::bruteForceTopK(t, k))
                << toString(isa) << " " << dist << " n=" << n << " k=" << k << " sample=" << sampleSize;
            for (size_t i = 0; i < out.nnz(); ++i) ASSERT_EQ(bitsOf(out.values[i]), bitsOf(t[out.index(i)]));
            if (sampleSize > 0 && n == 40009 && k < n) {
              EXPECT_TRUE(stats.sampled);
            }
          }
        }
      }
    }
  }
}

TEST(CompressionTopK, SpecialValuesRankNanFirstThenInfinity) {
  std::vector<float> t(1000, 1.0f);
  t[10] = -kInf;
  t[500] = std::nanf("");
  t[700] = kInf;
  t[900] = -0.0f;
  for (Isa isa : kernels::supportedSimdLevels()) {
    TopKOptions o;
    o.approximate = false;
    o.isa = isa;
    o.k = 1;
    SparseTensor out;
    topk(t.data(), nullptr, t.size(), o, out);
    EXPECT_EQ(indicesOf(out), std::vector<uint64_t>({500})) << toString(isa);
    o.k = 3;
    topk(t.data(), nullptr, t.size(), o, out);
    EXPECT_EQ(indicesOf(out), std::vector<uint64_t>({10, 500, 700})) << toString(isa);
    o.k = 5;  // ties of 1.0 go to the lowest indices
    topk(t.data(), nullptr, t.size(), o, out);
    EXPECT_EQ(indicesOf(out), std::vector<uint64_t>({0, 1, 10, 500, 700})) << toString(isa);
  }
}

TEST(CompressionTopK, WideIndicesGiveTheSameSelection) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionTopK.WideIndices");
  const std::vector<float> t = distribution("normal", 300007, seed);
  for (Isa isa : kernels::supportedSimdLevels()) {
    for (bool approximate : {false, true}) {
      TopKOptions o;
      o.k = 3001;
      o.approximate = approximate;
      o.sampleSize = 4096;
      o.seed = seed;
      o.isa = isa;
      const size_t cap = topkScratchCapacity(t.size(), o.k);
      std::vector<uint32_t> idx32(cap);
      std::vector<uint64_t> idx64(cap);
      std::vector<float> v32(cap), v64(cap);
      const size_t c32 = selectTopK(t.data(), nullptr, t.size(), o, idx32.data(), v32.data(), cap);
      const size_t c64 = selectTopK(t.data(), nullptr, t.size(), o, idx64.data(), v64.data(), cap);
      ASSERT_EQ(c32, c64);
      for (size_t i = 0; i < c32; ++i) {
        ASSERT_EQ(idx32[i], idx64[i]);
        ASSERT_EQ(v32[i], v64[i]);
      }
    }
  }
}

TEST(CompressionTopK, ApproximateStaysWithinTenPercentOfKOnEveryDistribution) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionTopK.Approximate");
  constexpr size_t kN = size_t{1} << 20;
  size_t runs = 0, fallbacks = 0, cuts = 0;
  for (const char* dist : kDistributions) {
    const std::vector<float> t = distribution(dist, kN, seed);
    for (size_t k : {size_t{10}, kN / 1000, kN / 100, kN / 10}) {
      for (uint64_t round = 0; round < 3; ++round) {
        const Isa isa = kernels::supportedSimdLevels()[round % kernels::supportedSimdLevels().size()];
        TopKOptions o;
        o.k = k;
        o.approximate = true;
        o.sampleSize = 16384;
        o.seed = seed * 31 + round;
        o.isa = isa;
        SparseTensor out;
        TopKStats stats;
        topk(t.data(), nullptr, kN, o, out, &stats);
        const std::string where = std::string(dist) + " k=" + std::to_string(k) + " seed=" + std::to_string(o.seed) +
                                  " " + toString(isa);
        EXPECT_TRUE(stats.sampled) << where;
        EXPECT_LE(out.nnz(), k + k / 10) << where;
        EXPECT_GE(out.nnz(), k - k / 10) << where;
        EXPECT_EQ(gradcomm::testing::topSetViolation(t, indicesOf(out)), "") << where;
        EXPECT_LE(stats.dataPasses, 3u) << where;
        ++runs;
        fallbacks += stats.fellBack ? 1 : 0;
        cuts += stats.candidates > k + k / 10 ? 1 : 0;
      }
    }
  }
  std::printf("[   info   ] approximate top-k: %zu runs, %zu fell back to the exact path, %zu cut to k\n", runs,
              fallbacks, cuts);
  EXPECT_LE(fallbacks, runs / 10);
}

TEST(CompressionTopK, ApproximateOnSmallInputsIsExact) {
  const std::vector<float> t = distribution("normal", 5000, 3);
  TopKOptions o;
  o.k = 50;
  SparseTensor out;
  TopKStats stats;
  topk(t.data(), nullptr, t.size(), o, out, &stats);
  EXPECT_FALSE(stats.sampled);
  EXPECT_EQ(indicesOf(out), gradcomm::testing::bruteForceTopK(t, 50));
}

TEST(CompressionTopK, CandidateBufferStaysBoundedOnAdversarialOrders) {
  // Ascending magnitudes with a tiny k make every element a new maximum, so
  // the buffer fills and is compacted again and again; the result stays exact.
  const std::vector<float> t = distribution("ascending", 200000, 0);
  for (Isa isa : kernels::supportedSimdLevels()) {
    TopKOptions o;
    o.k = 7;
    o.approximate = true;
    o.sampleSize = 1;  // a useless sample: the threshold starts at the largest sampled key
    o.isa = isa;
    SparseTensor out;
    TopKStats stats;
    topk(t.data(), nullptr, t.size(), o, out, &stats);
    EXPECT_EQ(indicesOf(out), gradcomm::testing::bruteForceTopK(t, 7)) << toString(isa);
    o.approximate = false;
    const std::vector<float> zeros(200000, 0.0f);
    topk(zeros.data(), nullptr, zeros.size(), o, out, &stats);
    EXPECT_EQ(indicesOf(out), std::vector<uint64_t>({0, 1, 2, 3, 4, 5, 6})) << toString(isa);
    EXPECT_GE(stats.compactions, 1u) << toString(isa);
  }
}

TEST(CompressionTopK, ErrorFeedbackSendsEverythingEventually) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionTopK.ErrorFeedback");
  constexpr size_t kN = 100003, kSteps = 40;
  for (bool approximate : {false, true}) {
    for (Isa isa : kernels::supportedSimdLevels()) {
      std::mt19937_64 rng(seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> in(kN), residual(kN, 0.0f);
      std::vector<double> sumIn(kN, 0.0), sumSent(kN, 0.0);
      TopKOptions o;
      o.k = kN / 100;
      o.approximate = approximate;
      o.sampleSize = 4096;
      o.isa = isa;
      SparseTensor out;
      for (size_t step = 0; step < kSteps; ++step) {
        for (size_t i = 0; i < kN; ++i) {
          in[i] = normal(rng);
          sumIn[i] += in[i];
        }
        const std::vector<float> before = residual;
        o.seed = seed + step;
        topk(in.data(), residual.data(), kN, o, out);
        std::vector<char> sent(kN, 0);
        for (size_t j = 0; j < out.nnz(); ++j) {
          const uint64_t i = out.index(j);
          sent[i] = 1;
          sumSent[i] += out.values[j];
          ASSERT_EQ(bitsOf(out.values[j]), bitsOf(in[i] + before[i]));
        }
        for (size_t i = 0; i < kN; ++i) {
          ASSERT_EQ(bitsOf(residual[i]), bitsOf(sent[i] ? 0.0f : in[i] + before[i])) << i;
        }
      }
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_NEAR(sumSent[i] + residual[i], sumIn[i], kSteps * std::ldexp(std::max(1.0, std::fabs(sumIn[i])), -22))
            << (approximate ? "approximate " : "exact ") << toString(isa) << " element " << i;
      }
    }
  }
}

TEST(CompressionTopK, RejectsBadArgumentsBeforeReadingAnything) {
  std::vector<float> t(100, 1.0f);
  TopKOptions o;
  SparseTensor out;
  o.k = 0;
  EXPECT_THROW(topk(t.data(), nullptr, t.size(), o, out), InvalidArgument);
  o.k = 5;
  EXPECT_THROW(topk(t.data(), t.data() + 25, 50, o, out), InvalidArgument);  // overlapping residual
  uint32_t idx[8];
  float val[8];
  EXPECT_THROW(selectTopK(t.data(), nullptr, t.size(), o, idx, val, 8), InvalidArgument);  // too small
  // 2^32 elements do not fit 32-bit indices; rejected without touching memory.
  const float* fake = reinterpret_cast<const float*>(alignof(float));
  EXPECT_THROW(selectTopK(fake, nullptr, size_t{1} << 32, o, idx, val, 8), InvalidArgument);
  o.k = 200;  // more than n: everything is sent
  topk(t.data(), nullptr, t.size(), o, out);
  EXPECT_EQ(out.nnz(), 100u);
}

// ---- the device top-k's selection logic, simulated on the host -------------------------

namespace {

// The device pipeline with the CPU doing the histograms: the same decision
// code as the kernel (radix_select.hpp) and the same final rule as the
// compaction. Returns the selected indices; *passes gets the histogram
// passes run.
std::vector<uint64_t> simulateDeviceTopK(const std::vector<float>& t, size_t k, bool approximate, int* passes) {
  namespace rs = gradcomm::compression::cuda::detail;
  const size_t n = t.size();
  k = std::min(k, n);
  rs::SelectState s;
  rs::initSelect(s, k, k == n);
  const unsigned long long low = k - k / 10, high = k + k / 10;
  *passes = 0;
  for (int pass = 0; pass < 3 && !s.done; ++pass) {
    const rs::Digit d = rs::radixDigit(pass);
    std::vector<unsigned long long> hist(rs::kRadixBuckets, 0);
    for (float x : t) {
      const uint32_t key = gradcomm::testing::magnitudeKey(x);
      if (rs::inPrefix(s, key)) ++hist[(key >> d.shift) & ((1u << d.bits) - 1u)];
    }
    rs::selectStep(s, hist.data(), d, pass == 2, approximate, low, high);
    ++*passes;
  }
  EXPECT_EQ(s.done, 1u);
  std::vector<uint64_t> out;
  unsigned long long tie = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t key = gradcomm::testing::magnitudeKey(t[i]);
    if (key > s.threshold || (key == s.threshold && tie++ < s.ties)) out.push_back(i);
  }
  EXPECT_EQ(out.size(), s.total);
  return out;
}

}  // namespace

TEST(CompressionDeviceSelect, ExactRadixSelectMatchesBruteForce) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionDeviceSelect.Exact");
  for (const char* dist : kDistributions) {
    for (size_t n : {size_t{1}, size_t{5}, size_t{1000}, size_t{65537}}) {
      const std::vector<float> t = distribution(dist, n, seed + n);
      for (size_t k : {size_t{1}, size_t{2}, n / 100 + 1, n / 2, n - 1, n}) {
        if (k == 0) continue;
        int passes = 0;
        ASSERT_EQ(simulateDeviceTopK(t, k, false, &passes), gradcomm::testing::bruteForceTopK(t, k))
            << dist << " n=" << n << " k=" << k;
      }
    }
  }
  std::vector<float> special(100, 1.0f);
  special[7] = std::nanf("");
  special[9] = -kInf;
  int passes = 0;
  EXPECT_EQ(simulateDeviceTopK(special, 3, false, &passes), std::vector<uint64_t>({0, 7, 9}));
}

TEST(CompressionDeviceSelect, ApproximateRadixSelectStaysWithinTenPercent) {
  const uint64_t seed = gradcomm::testing::compressionSeed("CompressionDeviceSelect.Approximate");
  size_t runs = 0, onePass = 0;
  for (const char* dist : kDistributions) {
    const std::vector<float> t = distribution(dist, size_t{1} << 18, seed);
    for (size_t k : {size_t{10}, t.size() / 1000, t.size() / 100, t.size() / 10}) {
      int passes = 0;
      const std::vector<uint64_t> got = simulateDeviceTopK(t, k, true, &passes);
      EXPECT_GE(got.size(), k - k / 10) << dist << " k=" << k;
      EXPECT_LE(got.size(), k + k / 10) << dist << " k=" << k;
      EXPECT_EQ(gradcomm::testing::topSetViolation(t, got), "") << dist << " k=" << k;
      ++runs;
      onePass += passes == 1 ? 1 : 0;
    }
  }
  std::printf("[   info   ] device approximate select: %zu of %zu runs settled after one pass\n", onePass, runs);
}

// ---- scatter-add ---------------------------------------------------------------------

TEST(CompressionScatterAdd, RoundTripsATopKSelection) {
  const std::vector<float> t = distribution("normal", 100000, 11);
  TopKOptions o;
  o.k = 1000;
  SparseTensor out;
  topk(t.data(), nullptr, t.size(), o, out);
  std::vector<float> dense(t.size(), 0.0f);
  gradcomm::testing::scatterAddReference(dense.data(), out);
  size_t nonzero = 0;
  for (size_t i = 0; i < dense.size(); ++i) {
    if (dense[i] != 0.0f) {
      ++nonzero;
      EXPECT_EQ(dense[i], t[i]);
    }
  }
  EXPECT_EQ(nonzero, out.nnz());
}
