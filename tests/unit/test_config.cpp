// Units, the parameter registry and its error messages.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "base/log.hpp"
#include "base/params.hpp"
#include "base/units.hpp"
#include "gradcomm/config.hpp"
#include "gradcomm/device.hpp"
#include "gradcomm/error.hpp"
#include "gradcomm/types.hpp"

using namespace gradcomm;
using namespace gradcomm::core;

namespace {
// Sets an environment variable for one test and restores it after.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (had_) setenv(name_, old_.c_str(), 1); else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

template <typename F> std::string errorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(Units, ParsesByteSizesWithBinarySuffixes) {
  EXPECT_EQ(parseBytes("4096", "X"), 4096u);
  EXPECT_EQ(parseBytes("64K", "X"), 65536u);
  EXPECT_EQ(parseBytes("25M", "X"), 25u << 20);
  EXPECT_EQ(parseBytes("1G", "X"), 1u << 30);
  EXPECT_EQ(parseBytes("2GiB", "X"), size_t{2} << 30);
  EXPECT_EQ(parseBytes("512kb", "X"), 512u << 10);
  EXPECT_EQ(parseBytes(" 1.5K ", "X"), 1536u);
  EXPECT_EQ(parseBytes("0", "X"), 0u);
}

TEST(Units, RejectsMalformedSizesNamingTheParameter) {
  for (const char* bad : {"", "abc", "25Q", "-1", "1.3", "K", "nan", "1e3"}) {
    std::string msg = errorOf([&] { parseBytes(bad, "GRADCOMM_SHM_CHUNK"); });
    EXPECT_NE(msg.find("GRADCOMM_SHM_CHUNK='"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("malformed"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(Units, ParsesLinkRatesInTcsUnits) {
  EXPECT_DOUBLE_EQ(parseBitRate("1gbit", "X"), 1e9);
  EXPECT_DOUBLE_EQ(parseBitRate("25Gbit", "X"), 25e9);
  EXPECT_DOUBLE_EQ(parseBitRate("400mbit", "X"), 400e6);
  EXPECT_DOUBLE_EQ(parseBitRate("100kbit", "X"), 100e3);
  EXPECT_DOUBLE_EQ(parseBitRate("2500000bit", "X"), 2.5e6);
  EXPECT_DOUBLE_EQ(parseBitRate("0", "X"), 0.0);
}

TEST(Units, RejectsMalformedRatesNamingTheParameter) {
  for (const char* bad : {"", "fast", "1gb", "1 gbps", "-1gbit", "gbit", "2000tbit", "1e9"}) {
    std::string msg = errorOf([&] { parseBitRate(bad, "GRADCOMM_NET_RATE"); });
    EXPECT_NE(msg.find("GRADCOMM_NET_RATE='"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("malformed"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_EQ(formatBitRate(1e9), "1gbit");
  EXPECT_EQ(formatBitRate(2.5e10), "25gbit");
  EXPECT_EQ(formatBitRate(0), "0");
}

TEST(Units, ParsesDurations) {
  using namespace std::chrono;
  EXPECT_EQ(parseDuration("300s", "X"), seconds(300));
  EXPECT_EQ(parseDuration("1.5s", "X"), milliseconds(1500));
  EXPECT_EQ(parseDuration("20ms", "X"), milliseconds(20));
  EXPECT_EQ(parseDuration("500us", "X"), microseconds(500));
  EXPECT_EQ(parseDuration("2m", "X"), minutes(2));
  EXPECT_EQ(parseDuration("1h", "X"), hours(1));
  EXPECT_EQ(parseDuration("7", "X"), seconds(7));
  EXPECT_THROW(parseDuration("3 parsecs", "X"), ConfigError);
  EXPECT_THROW(parseDuration("-1s", "X"), ConfigError);
}

TEST(Units, FormatsExactly) {
  EXPECT_EQ(formatBytes(25u << 20), "25M");
  EXPECT_EQ(formatBytes(1000), "1000");
  EXPECT_EQ(formatBytes(0), "0");
  EXPECT_EQ(formatDuration(std::chrono::seconds(300)), "300s");
  EXPECT_EQ(formatDuration(std::chrono::microseconds(200)), "200us");
}

TEST(Parameters, DefaultsComeFromTheRegistry) {
  Config c = Config::resolve();
  EXPECT_EQ(c.timeout, std::chrono::seconds(300));
  EXPECT_EQ(c.shmChunkBytes, 128u << 10);
  EXPECT_EQ(c.algo, "auto");
  EXPECT_EQ(c.origins.at("GRADCOMM_TIMEOUT"), ParamOrigin::kDefault);
}

TEST(Parameters, EnvironmentBeatsDefaultAndExplicitBeatsEnvironment) {
  EnvGuard g("GRADCOMM_TIMEOUT", "12s");
  Config env = Config::resolve();
  EXPECT_EQ(env.timeout, std::chrono::seconds(12));
  EXPECT_EQ(env.origins.at("GRADCOMM_TIMEOUT"), ParamOrigin::kEnvironment);
  Options o;
  o.set("TIMEOUT", "3s");
  Config exp = Config::resolve(o);
  EXPECT_EQ(exp.timeout, std::chrono::seconds(3));
  EXPECT_EQ(exp.origins.at("GRADCOMM_TIMEOUT"), ParamOrigin::kExplicit);
}

TEST(Parameters, MalformedEnvironmentValueIsAConfigError) {
  EnvGuard g("GRADCOMM_SEGMENT_SIZE", "lots");
  std::string msg = errorOf([] { Config::resolve(); });
  EXPECT_NE(msg.find("GRADCOMM_SEGMENT_SIZE='lots' is malformed"), std::string::npos) << msg;
}

TEST(Parameters, OutOfRangeValuesAreRejected) {
  Options o;
  o.set("GRADCOMM_PIPELINE_DEPTH", "0");
  std::string msg = errorOf([&] { Config::resolve(o); });
  EXPECT_NE(msg.find("an integer from 1 to 64"), std::string::npos) << msg;
  Options s;
  s.set("SEGMENT_SIZE", "8");
  msg = errorOf([&] { Config::resolve(s); });
  EXPECT_NE(msg.find("too small"), std::string::npos) << msg;
  Options ns;
  ns.set("NET_SEGMENT_SIZE", "8");
  msg = errorOf([&] { Config::resolve(ns); });
  EXPECT_NE(msg.find("GRADCOMM_NET_SEGMENT_SIZE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("too small"), std::string::npos) << msg;
  for (const char* bad : {"lots", "-1", "16Q"}) {
    Options h;
    h.set("HIER_RD_SIZE", bad);
    msg = errorOf([&] { Config::resolve(h); });
    EXPECT_NE(msg.find("GRADCOMM_HIER_RD_SIZE"), std::string::npos) << bad << ": " << msg;
  }
  Options h0;
  h0.set("HIER_RD_SIZE", "0");  // always rings
  EXPECT_EQ(Config::resolve(h0).hierRdSliceBytes, 0u);
  EXPECT_EQ(Config::resolve(Options{}).hierRdSliceBytes, 16u * 1024);
  Options l;
  l.set("LOG_LEVEL", "chatty");
  EXPECT_THROW(Config::resolve(l), ConfigError);
  Options b;
  b.set("SHM", "maybe");
  EXPECT_THROW(Config::resolve(b), ConfigError);
}

TEST(Parameters, WaitModeIsOneOfAutoSpinYield) {
  Options o;
  o.set("WAIT", "Yield");
  EXPECT_EQ(Config::resolve(o).wait, "yield");
  Options bad;
  bad.set("GRADCOMM_WAIT", "sleep");
  std::string msg = errorOf([&] { Config::resolve(bad); });
  EXPECT_NE(msg.find("GRADCOMM_WAIT='sleep' is not valid: expected one of auto|spin|yield"), std::string::npos) << msg;
}

TEST(Parameters, UnknownOptionNameListsKnownParameters) {
  Options o;
  std::string msg = errorOf([&] { o.set("GRADCOMM_TIMEOUTS", "1s"); });
  EXPECT_NE(msg.find("unknown parameter 'GRADCOMM_TIMEOUTS'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("GRADCOMM_TIMEOUT,"), std::string::npos) << msg;
}

TEST(Parameters, DescribeListsEveryParameterWithOrigin) {
  EnvGuard g("GRADCOMM_SHM_CHUNK", "64K");
  auto all = describeParameters();
  ASSERT_GE(all.size(), 12u);
  bool found = false;
  for (const auto& p : all) {
    EXPECT_EQ(p.name.rfind("GRADCOMM_", 0), 0u);
    EXPECT_FALSE(p.doc.empty()) << p.name;
    EXPECT_FALSE(p.units.empty()) << p.name;
    if (p.name == "GRADCOMM_SHM_CHUNK") {
      found = true;
      EXPECT_EQ(p.value, "64K");
      EXPECT_EQ(p.origin, ParamOrigin::kEnvironment);
      EXPECT_EQ(p.defaultValue, "128K");
    }
  }
  EXPECT_TRUE(found);
}

TEST(Types, NamesRoundTripAndUnknownNamesListValidOnes) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    auto t = static_cast<DataType>(i);
    EXPECT_EQ(parseDataType(toString(t)), t);
  }
  EXPECT_EQ(parseDataType("bf16"), DataType::kBFloat16);
  EXPECT_EQ(parseReduceOp("mean"), ReduceOp::kAvg);
  std::string msg = errorOf([] { parseDataType("float8"); });
  EXPECT_NE(msg.find("valid: float32, float64"), std::string::npos) << msg;
}

TEST(Parameters, TheReadmeDocumentsEveryParameter) {
  std::ifstream f(std::string(GRADCOMM_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(f.good()) << "README.md not found";
  std::stringstream text;
  text << f.rdbuf();
  for (const auto& p : describeParameters()) {
    EXPECT_NE(text.str().find("| `" + p.name + "` | `" + p.defaultValue + "` |"), std::string::npos)
        << p.name << " (default " << p.defaultValue << ") is missing from the README's parameter table";
  }
}

TEST(Parameters, AnUnknownEnvironmentVariableWarnsOnceNamingTheClosestParameter) {
  EnvGuard typo("GRADCOMM_TIMEOUTT", "10s");
  ::testing::internal::CaptureStderr();
  Config::resolve();
  Config::resolve();
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string want = "GRADCOMM_TIMEOUTT, which is not a gradcomm parameter and is ignored; did you mean "
                           "GRADCOMM_TIMEOUT?";
  ASSERT_NE(err.find(want), std::string::npos) << err;
  EXPECT_EQ(err.find(want), err.rfind(want)) << "warned twice: " << err;
}

TEST(Parameters, UnknownEnvironmentWarningSuggestsOnlyPlausibleNames) {
  EXPECT_NE(unknownEnvironmentWarning("GRADCOMM_PARTITON_SIZE").find("did you mean GRADCOMM_PARTITION_SIZE?"),
            std::string::npos);
  EXPECT_NE(unknownEnvironmentWarning("GRADCOMM_LOGLEVEL").find("did you mean GRADCOMM_LOG_LEVEL?"),
            std::string::npos);
  const std::string far = unknownEnvironmentWarning("GRADCOMM_ZEBRA_CROSSING");
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  EXPECT_NE(far.find("gradcomm-info lists every parameter"), std::string::npos) << far;
}

TEST(Parameters, VariablesReadElsewhereNeverWarn) {
  for (const char* name : {"GRADCOMM_RANK", "GRADCOMM_WORLD_SIZE", "GRADCOMM_RENDEZVOUS", "GRADCOMM_LOCAL_RANK",
                           "GRADCOMM_NCCL_LIB", "GRADCOMM_NCCL_ID_ADDR", "GRADCOMM_TEST_SEED", "GRADCOMM_NETNS_PPN",
                           "GRADCOMM_TIMEOUT", "GRADCOMM_STATS_ALL_RANKS", "OMPI_COMM_WORLD_RANK",
                           // the project's scripts' and build's own variables
                           "GRADCOMM_SKIP_SANITIZERS", "GRADCOMM_REQUIRE_CUDA", "GRADCOMM_VENV",
                           "GRADCOMM_BASE_PYTHON", "GRADCOMM_MPIRUN_ARGS", "GRADCOMM_UCX_WHEEL", "GRADCOMM_WITH_CUDA",
                           "GRADCOMM_WITH_NCCL"}) {
    EXPECT_EQ(unknownEnvironmentWarning(name), "") << name;
  }
  EnvGuard rank("GRADCOMM_RANK", "0");
  EnvGuard nccl("GRADCOMM_NCCL_TUNER_FILE", "x");
  ::testing::internal::CaptureStderr();
  Config::resolve();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("GRADCOMM_RANK"), std::string::npos) << err;
  EXPECT_EQ(err.find("GRADCOMM_NCCL"), std::string::npos) << err;
}

TEST(Parameters, StatsTakeAnIntervalAndTheOldBooleans) {
  EXPECT_EQ(Config::resolve().statsEvery, 0);
  EXPECT_FALSE(Config::resolve().statsAllRanks);
  for (auto [text, every] : std::vector<std::pair<const char*, int>>{{"1", 1}, {"100", 100}, {"0", 0}, {"on", 1},
                                                                      {"true", 1}, {"off", 0}}) {
    Options o;
    o.set("STATS", text);
    EXPECT_EQ(Config::resolve(o).statsEvery, every) << text;
  }
  Options bad;
  bad.set("STATS", "-1");
  EXPECT_THROW(Config::resolve(bad), ConfigError);
  Options all;
  all.set("STATS_ALL_RANKS", "1");
  EXPECT_TRUE(Config::resolve(all).statsAllRanks);
}

TEST(Parameters, AMalformedAlgoRuleFailsAtResolveWithTheCommunicatorsMessage) {
  EnvGuard g("GRADCOMM_ALGO", "bogus");
  const std::string msg = errorOf([] { Config::resolve(); });
  EXPECT_NE(msg.find("GRADCOMM_ALGO entry 'bogus': unknown algorithm 'bogus'; valid: "), std::string::npos) << msg;
  EnvGuard ok("GRADCOMM_ALGO", "allreduce:0-64K:rd,allreduce:ring");
  EXPECT_EQ(Config::resolve().algo, "allreduce:0-64K:rd,allreduce:ring");
}

TEST(Parameters, OneValueAndTheTimeoutAreReadAsACommunicatorReadsThem) {
  EnvGuard compression("GRADCOMM_COMPRESSION", "bf16");
  EnvGuard timeout("GRADCOMM_TIMEOUT", "90s");
  EXPECT_EQ(parameterValue("GRADCOMM_COMPRESSION"), "bf16");
  EXPECT_EQ(parameterValue("COMPRESSION", Options().set("COMPRESSION", "fp16")), "fp16");
  EXPECT_EQ(operationTimeout(), std::chrono::seconds(90));
  EXPECT_EQ(operationTimeout(Options().set("GRADCOMM_TIMEOUT", "0")), std::chrono::nanoseconds(0));
  EXPECT_NE(errorOf([] { parameterValue("GRADCOMM_COMPRESION"); }).find("unknown parameter 'GRADCOMM_COMPRESION'"),
            std::string::npos);
  EnvGuard bad("GRADCOMM_TIMEOUT", "soon");
  EXPECT_THROW(operationTimeout(), ConfigError);
}

TEST(Logging, AMessageIsWrittenWhenItsLevelIsOnAndOnceMeansOnce) {
  setLogLevel(LogLevel::kInfo);
  ::testing::internal::CaptureStderr();
  logMessage(LogLevel::kInfo, 3, "shim said something", true);
  logMessage(LogLevel::kInfo, 3, "shim said something", true);
  logMessage(LogLevel::kDebug, 3, "too detailed");
  logMessage(LogLevel::kWarn, -1, "before any communicator");
  const std::string err = ::testing::internal::GetCapturedStderr();
  setLogLevel(LogLevel::kWarn);
  EXPECT_EQ(err, "gradcomm[rank 3] info: shim said something\ngradcomm warn: before any communicator\n");
}

TEST(DeviceCasts, BadArgumentsAreRefusedBeforeAnyDeviceIsAsked) {
  float in = 1.0f;
  uint16_t out = 0;
  EXPECT_NE(errorOf([&] { castToHalfOnDevice(&in, &out, 1, DataType::kInt32, nullptr); })
                .find("castToHalfOnDevice: the half type must be float16 or bfloat16, not int32"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { castFromHalfOnDevice(nullptr, &in, 4, DataType::kFloat16, nullptr); })
                .find("castFromHalfOnDevice: a buffer is null with count > 0"),
            std::string::npos);
  EXPECT_THROW(castToHalfOnDevice(&in, nullptr, 1, DataType::kFloat64, nullptr), InvalidArgument);
  // Nothing to cast: no kernel, no error, whatever the machine.
#if GRADCOMM_HAVE_CUDA
  EXPECT_NO_THROW(castToHalfOnDevice(nullptr, nullptr, 0, DataType::kBFloat16, nullptr));
#else
  EXPECT_THROW(castToHalfOnDevice(nullptr, nullptr, 0, DataType::kBFloat16, nullptr), UnsupportedError);
#endif
}
