// What gradcomm prints: GRADCOMM_LOG_LEVEL=info tells what NCCL_DEBUG=INFO
// would (build, transport and topology, algorithm choices, Reducer buckets)
// and warn (the default) none of it; GRADCOMM_STATS prints every N steps on
// rank 0; tiny Reducer partitions draw a warning.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/log.hpp"
#include "gradcomm/reducer.hpp"
#include "support/inproc.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

size_t countOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Two ranks: an allreduce (count makes its size class unique to the test, as
// info lines print once per process), then a Reducer's three steps.
std::string runAndCapture(Options options, size_t count, int steps = 1) {
  options.set("TIMEOUT", "30s");
  ::testing::internal::CaptureStderr();
  runRanks(2, [&](RankContext& ctx) {
    std::vector<float> x(count, 1.0f);
    ctx.comm.allreduce(x.data(), x.data(), count, DataType::kFloat32, ReduceOp::kSum).wait();
    std::vector<std::vector<float>> grads = {std::vector<float>(100, 1.0f), std::vector<float>(300, 2.0f)};
    std::vector<GradientSpec> specs;
    for (auto& g : grads) specs.push_back(GradientSpec{g.size(), DataType::kFloat32, g.data()});
    Reducer red(ctx.comm, specs);
    for (int s = 0; s < steps; ++s) {
      red.markReady(1);
      red.markReady(0);
      red.finalize();
    }
  }, options);
  std::string err = ::testing::internal::GetCapturedStderr();
  core::setLogLevel(core::LogLevel::kWarn);  // for the tests that follow in this process
  return err;
}

}  // namespace

TEST(Logging, InfoTellsBuildTopologyAlgorithmsAndBuckets) {
  Options o;
  o.set("LOG_LEVEL", "info");
  const std::string err = runAndCapture(o, 777);
  EXPECT_NE(err.find("gradcomm[rank 0] info: build: gradcomm "), std::string::npos) << err;
  EXPECT_NE(err.find("info: communicator: 2 ranks, transport "), std::string::npos) << err;
  EXPECT_NE(err.find("info: topology: host "), std::string::npos) << err;
  EXPECT_NE(err.find("shared memory: "), std::string::npos) << err;
  // 777 floats = 3108 bytes: the 2K-4K class, chosen once by the cost
  // model, with the runners-up and their predicted times.
  EXPECT_EQ(countOf(err, "info: algorithm: allreduce float32 sum of 2K-4K bytes: "), 1u) << err;
  EXPECT_NE(err.find("(cost model (static): "), std::string::npos) << err;
  EXPECT_NE(err.find("info: topology: 2 rank(s) on 1 host(s) (1x2)"), std::string::npos) << err;
  EXPECT_NE(err.find("info: cost model: same-host "), std::string::npos) << err;
  EXPECT_NE(err.find("info: waiting: "), std::string::npos) << err;
  EXPECT_NE(err.find("info: Reducer: 2 gradients, "), std::string::npos) << err;
  EXPECT_NE(err.find("bucket 0: 2 gradients"), std::string::npos) << err;
  // Algorithm and bucket lines come from rank 0 only: every rank chooses alike.
  EXPECT_EQ(err.find("gradcomm[rank 1] info: algorithm"), std::string::npos) << err;
  EXPECT_EQ(err.find("gradcomm[rank 1] info: Reducer"), std::string::npos) << err;
}

TEST(Logging, DebugAddsALinePerOperation) {
  Options o;
  o.set("LOG_LEVEL", "debug");
  const std::string err = runAndCapture(o, 779);
  EXPECT_NE(err.find("gradcomm[rank 0] debug: operation "), std::string::npos) << err;
  EXPECT_NE(err.find("gradcomm[rank 1] debug: operation "), std::string::npos) << err;
  EXPECT_NE(err.find(": allreduce float32 sum of 3116 bytes: "), std::string::npos) << err;
}

TEST(Logging, WarnByDefaultPrintsNoneOfIt) {
  const std::string err = runAndCapture(Options{}, 5000);
  EXPECT_EQ(err.find("info:"), std::string::npos) << err;
  EXPECT_EQ(err.find("debug:"), std::string::npos) << err;
  EXPECT_EQ(err.find("step "), std::string::npos) << err;
}

TEST(Logging, StatsPrintEveryNthStepOnRankZero) {
  Options o;
  o.set("STATS", "2");
  const std::string err = runAndCapture(o, 10, 5);
  // Steps 0, 2 and 4 of 5, on rank 0 only.
  EXPECT_EQ(countOf(err, "gradcomm[rank 0] step "), 3u) << err;
  EXPECT_NE(err.find("gradcomm[rank 0] step 4:"), std::string::npos) << err;
  EXPECT_EQ(err.find("gradcomm[rank 0] step 1:"), std::string::npos) << err;
  EXPECT_EQ(err.find("gradcomm[rank 1] step"), std::string::npos) << err;
}

TEST(Logging, StatsOnEveryRankWhenAsked) {
  Options o;
  o.set("STATS", "1");
  o.set("STATS_ALL_RANKS", "1");
  const std::string err = runAndCapture(o, 10, 2);
  EXPECT_EQ(countOf(err, "gradcomm[rank 0] step "), 2u) << err;
  EXPECT_EQ(countOf(err, "gradcomm[rank 1] step "), 2u) << err;
}

TEST(Logging, TinyPartitionsDrawAWarningThatSaysWhatIsSensible) {
  Options o;
  o.set("PARTITION_SIZE", "1");
  const std::string err = runAndCapture(o, 10);
  EXPECT_NE(err.find("gradcomm[rank 0] warn: Reducer: partitions of 1 bytes (GRADCOMM_PARTITION_SIZE) make one "
                     "allreduce per few bytes"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("use 1M to 8M"), std::string::npos) << err;
}
