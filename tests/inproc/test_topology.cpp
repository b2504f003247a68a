// Creation-time calibration and tuning files with ranks as threads: every
// rank must end with rank 0's numbers and choose alike, or collectives
// would deadlock.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

#include "algorithms/selector.hpp"
#include "gradcomm/error.hpp"
#include "support/forwarding_transport.hpp"
#include "support/inproc.hpp"
#include "topology/calibration.hpp"
#include "transport/shm_group.hpp"

using namespace gradcomm;
using gradcomm::testing::RankContext;
using gradcomm::testing::runRanks;

namespace {

transport::InProcWorld::Settings hostsOf(int ranksPerHost) {
  transport::InProcWorld::Settings s;
  s.ranksPerHost = ranksPerHost;
  return s;
}

/// Rank `r` of `world` creating its communicator over `t` with calibration
/// on (what the calibration tests that wrap a rank's transport share).
std::shared_ptr<detail::CommunicatorImpl> createCalibratedRank(transport::InProcWorld& world, int r,
                                                               std::unique_ptr<transport::Transport> t,
                                                               const char* timeout = "20s") {
  Options o;
  o.set("CALIBRATE", "1");
  o.set("TIMEOUT", timeout);
  return std::make_shared<detail::CommunicatorImpl>(std::move(t), world.hostLayout(r), core::Config::resolve(o));
}

std::string tempPath(const std::string& name) {
  return ::testing::TempDir() + "gradcomm_" + name + "_" + std::to_string(getpid());
}

struct Seen {
  std::mutex mu;
  std::vector<topology::MachineCosts> costs = std::vector<topology::MachineCosts>(4);
  std::vector<std::vector<std::string>> choices = std::vector<std::vector<std::string>>(4);
};

/// Records each rank's costs and its choice for allreduces of 8 B to 64 MiB,
/// and runs one allreduce to show the communicator works.
void record(RankContext& c, Seen& seen) {
  auto* impl = c.comm.impl().get();
  const auto* model = impl->selector().model();
  ASSERT_NE(model, nullptr);
  std::vector<std::string> names;
  for (size_t bytes = 8; bytes <= (64u << 20); bytes *= 4) {
    algorithms::CollectiveCall call;
    call.count = bytes / 4;
    names.push_back(impl->selector().select(call, {impl->transport(), impl->topology()}, "").algorithm->name());
  }
  std::vector<float> v(1000, static_cast<float>(c.rank + 1));
  c.comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).wait();
  EXPECT_EQ(v[999], 10.0f);
  std::lock_guard<std::mutex> lock(seen.mu);
  seen.costs[static_cast<size_t>(c.rank)] = model->costs();
  seen.choices[static_cast<size_t>(c.rank)] = names;
}

void expectAllAlike(const Seen& seen) {
  for (int r = 1; r < 4; ++r) {
    const auto& a = seen.costs[0];
    const auto& b = seen.costs[static_cast<size_t>(r)];
    EXPECT_EQ(a.sameHost.alphaSeconds, b.sameHost.alphaSeconds) << "rank " << r;
    EXPECT_EQ(a.sameHost.betaSecondsPerByte, b.sameHost.betaSecondsPerByte) << "rank " << r;
    EXPECT_EQ(a.interHost.alphaSeconds, b.interHost.alphaSeconds) << "rank " << r;
    EXPECT_EQ(a.interHost.betaSecondsPerByte, b.interHost.betaSecondsPerByte) << "rank " << r;
    EXPECT_EQ(a.sameHost.roundFloorSeconds, b.sameHost.roundFloorSeconds) << "rank " << r;
    EXPECT_EQ(a.interHost.roundFloorSeconds, b.interHost.roundFloorSeconds) << "rank " << r;
    EXPECT_EQ(a.reduceSecondsPerByte, b.reduceSecondsPerByte) << "rank " << r;
    EXPECT_EQ(a.copySecondsPerByte, b.copySecondsPerByte) << "rank " << r;
    EXPECT_EQ(a.shmSyncSeconds, b.shmSyncSeconds) << "rank " << r;
    EXPECT_EQ(a.shmByteFactor, b.shmByteFactor) << "rank " << r;
    EXPECT_EQ(a.source, b.source) << "rank " << r;
    EXPECT_EQ(seen.choices[0], seen.choices[static_cast<size_t>(r)]) << "rank " << r;
  }
}

}  // namespace

TEST(Calibration, EveryRankHoldsRankZerosNumbersAndChoosesAlike) {
  for (int perHost : {1, 2, 4}) {
    SCOPED_TRACE("ranks per host " + std::to_string(perHost));
    Seen seen;
    Options o;
    o.set("CALIBRATE", "1");
    runRanks(4, [&](RankContext& c) { record(c, seen); }, o, hostsOf(perHost));
    expectAllAlike(seen);
    EXPECT_EQ(seen.costs[0].source, "calibrated");
    const auto defaults = topology::MachineCosts::defaults();
    // The probed classes were measured, not left at their defaults.
    if (perHost > 1) EXPECT_NE(seen.costs[0].sameHost.alphaSeconds, defaults.sameHost.alphaSeconds);
    if (perHost < 4) EXPECT_NE(seen.costs[0].interHost.alphaSeconds, defaults.interHost.alphaSeconds);

    // Hosts with shared memory between ranks measured its hand-off with
    // every rank of the host at once; single-rank hosts have none to measure.
    // So did its data rounds (a fitted factor, within its bounds).
    if (perHost > 1) {
      EXPECT_NE(seen.costs[0].shmSyncSeconds, defaults.shmSyncSeconds);
      EXPECT_GT(seen.costs[0].shmSyncSeconds, 0.0);
      EXPECT_NE(seen.costs[0].shmByteFactor, defaults.shmByteFactor);
      EXPECT_GE(seen.costs[0].shmByteFactor, topology::kShmByteFactorMin);
      EXPECT_LE(seen.costs[0].shmByteFactor, topology::kShmByteFactorMax);
    } else {
      EXPECT_EQ(seen.costs[0].shmSyncSeconds, defaults.shmSyncSeconds);
      EXPECT_EQ(seen.costs[0].shmByteFactor, defaults.shmByteFactor);
    }
  }
}

namespace {

/// Holds back one send of the calibration's loaded ring (its middle round,
/// the first message with that index before any collective) for `delay`.
class OneSlowRingRound : public gradcomm::testing::ForwardingTransport {
 public:
  OneSlowRingRound(std::unique_ptr<transport::Transport> inner, std::chrono::milliseconds delay)
      : ForwardingTransport(std::move(inner)), delay_(delay) {}
  transport::RequestPtr isend(int peer, const void* data, size_t bytes, const transport::Tag& tag) override {
    if (!delayed_ && tag.seq == 0 && tag.message == kMiddleRound) {
      delayed_ = true;
      std::this_thread::sleep_for(delay_);
    }
    return inner().isend(peer, data, bytes, tag);
  }
  bool delayed() const { return delayed_; }

 private:
  static constexpr uint32_t kMiddleRound = topology::kLoadedRingMessageBase + topology::kLoadedRingRounds / 2;
  std::chrono::milliseconds delay_;
  std::atomic<bool> delayed_{false};
};

}  // namespace

// A rank that loses its core for one round of the loaded ring (common where
// emulated hosts share cores) must not set the alpha of every message: the
// round's typical time does. With a mean over the rounds, a 100 ms stall
// in one of 16 added over 6 ms to the inter-host alpha.
TEST(Calibration, OneStalledRoundOfTheLoadedRingDoesNotSetTheRoundFloor) {
  auto world = transport::InProcWorld::create(4, hostsOf(1));
  std::vector<topology::MachineCosts> costs(4);
  std::atomic<bool> stalled{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<transport::Transport> t = world->transport(r);
      OneSlowRingRound* slow = nullptr;
      if (r == 1) {
        auto s = std::make_unique<OneSlowRingRound>(std::move(t), std::chrono::milliseconds(100));
        slow = s.get();
        t = std::move(s);
      }
      auto impl = createCalibratedRank(*world, r, std::move(t));
      Communicator comm(impl);
      costs[static_cast<size_t>(r)] = impl->selector().model()->costs();
      if (slow && slow->delayed()) stalled = true;
      comm.barrier().wait();
    });
  }
  for (auto& th : threads) th.join();
  std::printf("inter-host round floor with one round stalled 100 ms: %.1f us\n",
              costs[0].interHost.roundFloorSeconds * 1e6);
  ASSERT_TRUE(stalled.load()) << "no message of the loaded ring was held back";
  EXPECT_EQ(costs[0].source, "calibrated");
  EXPECT_LT(costs[0].interHost.roundFloorSeconds, 3e-3);
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(costs[static_cast<size_t>(r)].interHost.roundFloorSeconds, costs[0].interHost.roundFloorSeconds);
    EXPECT_EQ(costs[static_cast<size_t>(r)].interHost.alphaSeconds, costs[0].interHost.alphaSeconds);
  }
}

namespace {

/// Holds back each send of the calibration's link-gap rounds, the across
/// rounds' 10 ms and the leaders' 2 ms (as a host link serves several
/// messages more slowly than one), and counts them. Far apart: a rank
/// that loses its core for a few milliseconds on a loaded machine (3 and
/// 2 ms once measured no gap under a full test suite) must not close it.
class SlowAcrossRounds : public gradcomm::testing::ForwardingTransport {
 public:
  explicit SlowAcrossRounds(std::unique_ptr<transport::Transport> inner) : ForwardingTransport(std::move(inner)) {}
  transport::RequestPtr isend(int peer, const void* data, size_t bytes, const transport::Tag& tag) override {
    if (tag.seq == 0 && tag.message >= topology::kAcrossMessageBase &&
        tag.message < topology::kAcrossMessageBase + topology::kAcrossRounds) {
      ++sent_;
      const bool across = (tag.message - topology::kAcrossMessageBase) % 2 == 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(across ? 10 : 2));
    }
    return inner().isend(peer, data, bytes, tag);
  }
  int sent() const { return sent_; }

 private:
  std::atomic<int> sent_{0};
};

}  // namespace

// The link gap: where every host has at least two ranks, rounds in which
// local rank i of each host sends across to local rank i of the next, for
// every i below the smallest host's count, alternate with rounds in which
// only each host's first rank does; rank 0 prices each further message on
// a host's link at what the former took more, at most a round of the
// latter. Here their sends are held back 10 and 2 ms: the gap is the cap,
// about 2 ms. Four hosts of one rank, one host, and a host of one
// rank beside another of three have no such rounds: none runs, the gap
// stays 0.
TEST(Calibration, LinkGapRoundsRunWhereEveryHostHasSeveralRanks) {
  struct Case {
    std::vector<int> hostSizes;
    int senders;  ///< ranks that send in the across rounds (the first senders / hosts of each host)
  };
  for (const Case& k : {Case{{2, 2}, 4}, Case{{2, 2, 2}, 6}, Case{{2, 3}, 4}, Case{{1, 1, 1, 1}, 0}, Case{{4}, 0},
                        Case{{1, 3}, 0}}) {
    std::string name;
    for (int n : k.hostSizes) name += (name.empty() ? "" : "+") + std::to_string(n);
    SCOPED_TRACE("hosts " + name);
    transport::InProcWorld::Settings settings;
    settings.hostSizes = k.hostSizes;
    int p = 0;
    for (int n : k.hostSizes) p += n;
    auto world = transport::InProcWorld::create(p, settings);
    std::vector<topology::MachineCosts> costs(static_cast<size_t>(p));
    std::vector<int> sent(static_cast<size_t>(p), -1);
    std::vector<std::thread> threads;
    for (int r = 0; r < p; ++r) {
      threads.emplace_back([&, r] {
        auto slow = std::make_unique<SlowAcrossRounds>(world->transport(r));
        SlowAcrossRounds* seen = slow.get();
        auto impl = createCalibratedRank(*world, r, std::move(slow));
        Communicator comm(impl);
        costs[static_cast<size_t>(r)] = impl->selector().model()->costs();
        sent[static_cast<size_t>(r)] = seen->sent();
        comm.barrier().wait();
      });
    }
    for (auto& th : threads) th.join();
    std::printf("hosts %s: link gap %.2f us\n", name.c_str(), costs[0].interHost.gapSeconds * 1e6);
    // The first rank of each host sends in every round, the next ones up
    // to the smallest host's count in the across rounds (every other one).
    const int perHost = k.senders / static_cast<int>(k.hostSizes.size());
    int first = 0;
    for (int n : k.hostSizes) {
      for (int i = 0; i < n; ++i) {
        const int want = i >= perHost ? 0 : i == 0 ? topology::kAcrossRounds : (topology::kAcrossRounds + 1) / 2;
        EXPECT_EQ(sent[static_cast<size_t>(first + i)], want) << "rank " << first + i;
      }
      first += n;
    }
    EXPECT_EQ(costs[0].source, "calibrated");
    if (k.senders > 0) {
      // 10 ms against 2 ms, two messages per host link: 8 ms more, capped
      // at the leaders' round (2 ms, more where a round lost its core).
      EXPECT_GE(costs[0].interHost.gapSeconds, 1.5e-3);
      EXPECT_LE(costs[0].interHost.gapSeconds, 8e-3);
    } else {
      EXPECT_EQ(costs[0].interHost.gapSeconds, 0.0);
    }
    for (int r = 1; r < p; ++r) {
      EXPECT_EQ(costs[static_cast<size_t>(r)].interHost.gapSeconds, costs[0].interHost.gapSeconds) << "rank " << r;
    }
  }
}

namespace {

/// Creates every rank's communicator of `world` at once with calibration
/// on, rank `without` (-1: none) behind a transport that hides its shared
/// memory, and runs `seen` on each rank once created. Returns each rank's
/// error text ("" where creation succeeded).
std::vector<std::string> createCalibrated(transport::InProcWorld& world, int without,
                                          const std::function<void(int, detail::CommunicatorImpl&)>& seen) {
  const int p = world.size();
  std::vector<std::string> failed(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<transport::Transport> t = world.transport(r);
        if (r == without) t = std::make_unique<gradcomm::testing::ForwardingTransport>(std::move(t));
        auto impl = createCalibratedRank(world, r, std::move(t), "10s");
        seen(r, *impl);
      } catch (const Error& e) {
        failed[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  return failed;
}

}  // namespace

// The loaded shared-memory phase needs every rank of rank 0's host: when
// one of them sees no shared memory (here a forwarding transport hides it),
// the phase is skipped on every rank instead of leaving the others waiting
// for its hand-offs, and creation succeeds.
TEST(Calibration, ARankOfTheHostWithoutSharedMemorySkipsTheSharedMemoryPhaseEverywhere) {
  for (int without : {0, 2}) {
    SCOPED_TRACE("rank without shared memory: " + std::to_string(without));
    auto world = transport::InProcWorld::create(3, hostsOf(3));
    std::vector<topology::MachineCosts> costs(3);
    const auto failed = createCalibrated(*world, without, [&](int r, detail::CommunicatorImpl& impl) {
      costs[static_cast<size_t>(r)] = impl.selector().model()->costs();
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(failed[static_cast<size_t>(r)], "") << "rank " << r;
      EXPECT_EQ(costs[static_cast<size_t>(r)].source, "calibrated") << "rank " << r;
      EXPECT_EQ(costs[static_cast<size_t>(r)].shmSyncSeconds, topology::MachineCosts::defaults().shmSyncSeconds)
          << "rank " << r;
    }
  }
}

// Every host runs the shared-memory phase at the same time (a hierarchical
// call hands off on every host at once, and where emulated hosts share
// cores only that load prices it), each host deciding alone: a host one of
// whose ranks sees no shared memory skips it, the others still run it, and
// creation succeeds everywhere. Hosts of 2 and 3 ranks.
TEST(Calibration, EveryHostRunsTheSharedMemoryPhaseAtOnceAndAHostWithoutSharedMemorySkipsIt) {
  for (int without : {-1, 3}) {
    SCOPED_TRACE("rank without shared memory: " + std::to_string(without));
    transport::InProcWorld::Settings settings;
    settings.hostSizes = {2, 3};
    auto world = transport::InProcWorld::create(5, settings);
    std::vector<uint64_t> nextRound(5, 0);
    const auto failed = createCalibrated(*world, without, [&](int r, detail::CommunicatorImpl& impl) {
      // The rounds this rank's group took before any collective: the
      // calibration's hand-offs (without data, then three per data round),
      // or none.
      if (auto* g = impl.engine().transport().sharedMemory()) nextRound[static_cast<size_t>(r)] = g->takeRound();
    });
    const uint64_t ran = topology::kShmHandOffRounds + 3 * topology::kShmDataRounds + 1, skipped = 1;
    for (int r = 0; r < 5; ++r) {
      EXPECT_EQ(failed[static_cast<size_t>(r)], "") << "rank " << r;
      const bool secondHost = r >= 2;
      const uint64_t expected = r == without ? 0 : (secondHost && without >= 2) ? skipped : ran;
      EXPECT_EQ(nextRound[static_cast<size_t>(r)], expected) << "rank " << r;
    }
  }
}

TEST(StaticModel, ByDefaultEveryRankHoldsRankZerosHardwareConstantsWithoutMeasuring) {
  for (int perHost : {1, 2, 4}) {
    SCOPED_TRACE("ranks per host " + std::to_string(perHost));
    Seen seen;
    runRanks(4, [&](RankContext& c) { record(c, seen); }, Options{}, hostsOf(perHost));
    expectAllAlike(seen);
    EXPECT_EQ(seen.costs[0].source, "static");
    const topology::HostHardware hw = topology::detectHardware();
    const auto expected = topology::MachineCosts::forHardware(perHost, topology::hostCpus(hw), hw.nicBitsPerSecond);
    EXPECT_EQ(seen.costs[0].sameHost.alphaSeconds, expected.sameHost.alphaSeconds);
    EXPECT_EQ(seen.costs[0].sameHost.betaSecondsPerByte, expected.sameHost.betaSecondsPerByte);
    EXPECT_EQ(seen.costs[0].interHost.betaSecondsPerByte, expected.interHost.betaSecondsPerByte);
    EXPECT_EQ(seen.costs[0].shmSyncSeconds, expected.shmSyncSeconds);
  }
}

// GRADCOMM_NET_RATE replaces the NIC's speed (shaped or virtual links,
// whose sysfs speed is not what a rank gets), and rank 0's value counts.
TEST(StaticModel, TheNetRateOfRankZeroPricesTheLinksBetweenHosts) {
  Seen seen;
  auto world = transport::InProcWorld::create(4, hostsOf(2));
  gradcomm::testing::ThreadBarrier barrier(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      Options o;
      o.set("NET_RATE", r == 0 ? "1gbit" : "100gbit");
      Communicator comm = gradcomm::testing::makeInProcCommunicator(world, r, o);
      RankContext ctx{comm, r, 4, &barrier};
      record(ctx, seen);
    });
  }
  for (auto& t : threads) t.join();
  expectAllAlike(seen);
  const topology::HostHardware hw = topology::detectHardware();
  const auto expected = topology::MachineCosts::forHardware(2, topology::hostCpus(hw), 1e9);
  EXPECT_EQ(seen.costs[0].interHost.betaSecondsPerByte, expected.interHost.betaSecondsPerByte);
  EXPECT_NEAR(seen.costs[0].interHost.betaSecondsPerByte, 8.0 / (0.95 * 1e9), 1e-15);
}

TEST(StaticModel, TheSameJobTwiceChoosesAlikeAtEverySize) {
  // Two jobs one after the other in one process: with the static model the
  // choices are a function of the layout and rank 0's hardware alone.
  for (int perHost : {1, 2, 4}) {
    SCOPED_TRACE("ranks per host " + std::to_string(perHost));
    Seen first, second;
    runRanks(4, [&](RankContext& c) { record(c, first); }, Options{}, hostsOf(perHost));
    runRanks(4, [&](RankContext& c) { record(c, second); }, Options{}, hostsOf(perHost));
    expectAllAlike(first);
    expectAllAlike(second);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(first.choices[static_cast<size_t>(r)], second.choices[static_cast<size_t>(r)]) << "rank " << r;
    }
  }
}

TEST(StaticModel, RepeatedRunsOfAFixedAlgorithmGiveBitwiseIdenticalResults) {
  // Floats whose sum depends on the order of additions: the same algorithm
  // must add them in the same order every run.
  constexpr size_t kCount = 100003;
  auto input = [](int rank, size_t i) {
    return static_cast<float>((static_cast<double>((i * 2654435761u + static_cast<size_t>(rank) * 40503u) % 1000003) -
                               500000.0) *
                              1e-3 / static_cast<double>(rank + 1));
  };
  for (const char* algo : {"ring", "rd", "hd", "tree", "shm"}) {
    SCOPED_TRACE(algo);
    std::vector<std::vector<float>> runs[2];
    for (auto& run : runs) {
      run.assign(4, {});
      std::mutex mu;
      Options o;
      o.set("ALGO", algo);
      runRanks(
          4,
          [&](RankContext& c) {
            std::vector<float> v(kCount);
            for (size_t i = 0; i < kCount; ++i) v[i] = input(c.rank, i);
            c.comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).wait();
            std::lock_guard<std::mutex> lock(mu);
            run[static_cast<size_t>(c.rank)] = std::move(v);
          },
          o, hostsOf(4));
    }
    for (int r = 0; r < 4; ++r) {
      ASSERT_EQ(runs[0][static_cast<size_t>(r)].size(), kCount);
      EXPECT_EQ(std::memcmp(runs[0][static_cast<size_t>(r)].data(), runs[1][static_cast<size_t>(r)].data(),
                            kCount * sizeof(float)),
                0)
          << "rank " << r;
    }
  }
}

// A calibration (GRADCOMM_CALIBRATE=1) saved with Communicator::calibration()
// is what a later job of that layout loads; a job of another layout keeps
// the static model, and a job never measures because of a file.
TEST(Calibration, ASavedCalibrationIsLoadedByTheNextJobOfItsLayoutOnly) {
  const std::string path = tempPath("calibration");
  Options measured;
  measured.set("CALIBRATE", "1");
  Seen first;
  std::string text;
  runRanks(4, [&](RankContext& c) {
    record(c, first);
    if (c.rank == 0) text = c.comm.calibration();
  }, measured, hostsOf(2));
  EXPECT_EQ(first.costs[0].source, "calibrated");
  {
    std::ofstream out(path);
    out << text;
  }
  std::string layout;
  const auto saved = topology::parseCalibration(text, path, &layout);
  EXPECT_EQ(layout, "2x2");
  EXPECT_DOUBLE_EQ(saved.interHost.alphaSeconds, first.costs[0].interHost.alphaSeconds);
  Options o;
  o.set("CALIBRATE", path);
  Seen second;
  runRanks(4, [&](RankContext& c) { record(c, second); }, o, hostsOf(2));
  expectAllAlike(second);
  EXPECT_EQ(second.costs[0].source, "file " + path);
  EXPECT_DOUBLE_EQ(second.costs[0].interHost.betaSecondsPerByte, first.costs[0].interHost.betaSecondsPerByte);
  EXPECT_EQ(second.choices[0], first.choices[0]);
  // Another layout does not take the 2x2 numbers, and measures nothing.
  Seen other;
  runRanks(4, [&](RankContext& c) { record(c, other); }, o, hostsOf(1));
  expectAllAlike(other);
  EXPECT_EQ(other.costs[0].source, "static");
  std::remove(path.c_str());
}

TEST(TuningFile, RankZerosFileDecidesOnEveryRank) {
  const std::string path = tempPath("tuning");
  {
    std::ofstream out(path);
    out << "layout 2x2\nallreduce 0-inf tree\n";
  }
  Seen seen;
  Options o;
  o.set("CALIBRATE", "0");
  o.set("TUNING_FILE", path);
  runRanks(4, [&](RankContext& c) { record(c, seen); }, o, hostsOf(2));
  expectAllAlike(seen);
  for (const auto& name : seen.choices[0]) EXPECT_EQ(name, "tree");
  std::remove(path.c_str());
}

namespace {

/// Each of 3 ranks' creation outcome: "created" or the ConfigError's text.
std::vector<std::string> createThree(const Options& o) {
  auto world = transport::InProcWorld::create(3);
  std::vector<std::string> outcome(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        gradcomm::testing::makeInProcCommunicator(world, r, o);
        outcome[static_cast<size_t>(r)] = "created";
      } catch (const ConfigError& e) {
        outcome[static_cast<size_t>(r)] = e.what();
      } catch (const std::exception& e) {
        outcome[static_cast<size_t>(r)] = std::string("wrong error type: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcome;
}

}  // namespace

TEST(Calibration, MalformedFileIsAConfigErrorOnEveryRankNamingTheLine) {
  const std::string path = tempPath("bad_calibration");
  {
    std::ofstream out(path);
    out << "layout 1x3\nsame_host 1e-6\n";
  }
  Options o;
  o.set("CALIBRATE", path);
  const auto outcome = createThree(o);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(outcome[static_cast<size_t>(r)].find("line 2: 'same_host' takes 2 or 3 values (alpha, beta, loaded round floor), got 1"), std::string::npos)
        << "rank " << r << ": " << outcome[static_cast<size_t>(r)];
  }
  std::remove(path.c_str());
}

TEST(TuningFile, UnreadableOrMalformedFileIsAConfigErrorOnEveryRank) {
  const std::string bad = tempPath("bad_tuning");
  {
    std::ofstream out(bad);
    out << "allreduce 0-1K rd\nallreduce 1K ring\n";
  }
  for (const auto& [path, needle] : {std::pair<std::string, std::string>{tempPath("missing"), "cannot read"},
                                     std::pair<std::string, std::string>{bad, "line 2: size range '1K'"}}) {
    Options o;
    o.set("TUNING_FILE", path);
    const auto errors = createThree(o);
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(errors[static_cast<size_t>(r)].find(needle), std::string::npos)
          << "rank " << r << ": " << errors[static_cast<size_t>(r)];
    }
  }
  std::remove(bad.c_str());
}

namespace {

struct NamedLayout {
  const char* name;
  transport::InProcWorld::Settings settings;
  int size;
};

/// Every layout the tests run: one host, even hosts, uneven hosts.
std::vector<NamedLayout> layoutsUnderTest() {
  auto sizes = [](std::vector<int> s) {
    transport::InProcWorld::Settings settings;
    settings.hostSizes = std::move(s);
    return settings;
  };
  return {{"1 host of 4", sizes({4}), 4},
          {"2x2", sizes({2, 2}), 4},
          {"1+3", sizes({1, 3}), 4},
          {"2,1,3", sizes({2, 1, 3}), 6}};
}

/// Creates a communicator per rank with `o`; returns rank 0's layout() and
/// cost source, or the first error.
std::pair<std::string, std::string> createAll(const NamedLayout& l, const Options& o) {
  std::mutex mu;
  std::string layout, source, error;
  try {
    runRanks(
        l.size,
        [&](RankContext& c) {
          const auto* model = c.comm.impl()->selector().model();
          std::vector<float> v(100, 1.0f);
          c.comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).wait();
          std::lock_guard<std::mutex> lock(mu);
          if (c.rank == 0) {
            layout = c.comm.layout();
            source = model ? model->costs().source : "no model";
          }
        },
        o, l.settings);
  } catch (const std::exception& e) {
    return {"", std::string("ERROR ") + e.what()};
  }
  return {layout, source};
}

}  // namespace

/// Rank 0's Communicator::calibration() of a job of layout `l` made with `o`.
std::string calibrationOf(const NamedLayout& l, const Options& o) {
  std::string text;
  runRanks(l.size, [&](RankContext& c) {
    if (c.rank == 0) text = c.comm.calibration();
  }, o, l.settings);
  return text;
}

// A calibration saved on any layout, uneven ones included, is read back by
// the next job of that layout (a layout described in words, "4 rank(s) on 2
// host(s) (1+3)", would be taken for a malformed line).
TEST(Calibration, ACalibrationSavedOnAnyLayoutIsLoadedByTheNextJobOfThatLayout) {
  for (const auto& l : layoutsUnderTest()) {
    SCOPED_TRACE(l.name);
    const std::string path = tempPath("calibration_layout");
    Options measured;
    measured.set("CALIBRATE", "1");
    const std::string text = calibrationOf(l, measured);
    {
      std::ofstream out(path);
      out << text;
    }
    Options o;
    o.set("CALIBRATE", path);
    EXPECT_EQ(createAll(l, o).second, "file " + path) << "the file held:\n" << text;
    std::remove(path.c_str());
  }
}

// A file that an earlier version wrote on an uneven layout names it in
// words: it does not apply, and the job keeps the static model.
TEST(Calibration, AFileNamingItsLayoutInWordsLeavesTheStaticModel) {
  const auto l = layoutsUnderTest()[2];  // 1+3
  const std::string path = tempPath("calibration_old_layout");
  {
    std::ofstream out(path);
    out << topology::formatCalibration(topology::MachineCosts::defaults(), "4 rank(s) on 2 host(s) (1+3)");
  }
  Options o;
  o.set("CALIBRATE", path);
  EXPECT_EQ(createAll(l, o).second, "static");
  std::remove(path.c_str());
}

// A calibration file that cannot be read is an error on every rank, naming
// the file and the tool that writes one (a job never measures in its stead).
TEST(Calibration, AMissingFileIsAConfigErrorOnEveryRank) {
  const std::string path = tempPath("calibration_missing");
  std::remove(path.c_str());
  Options o;
  o.set("CALIBRATE", path);
  const auto outcome = createThree(o);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(outcome[static_cast<size_t>(r)].find("GRADCOMM_CALIBRATE: cannot read '" + path + "' on rank 0"),
              std::string::npos)
        << "rank " << r << ": " << outcome[static_cast<size_t>(r)];
    EXPECT_NE(outcome[static_cast<size_t>(r)].find("gradcomm-bench --calibrate"), std::string::npos);
  }
}

// With GRADCOMM_SELECT=rule there is no cost model to save.
TEST(Calibration, ThereIsNoneToSaveWithoutACostModel) {
  Options o;
  o.set("SELECT", "rule");
  runRanks(2, [&](RankContext& c) { EXPECT_THROW(c.comm.calibration(), InvalidUsage); }, o);
}

// A tuning file names the layout as Communicator::layout() does, for any
// layout: it applies to a job of that layout and is ignored by another.
TEST(TuningFile, AFileNamingAnyLayoutAppliesToThatLayoutOnly) {
  const auto layouts = layoutsUnderTest();
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.name);
    Options plain;
    plain.set("CALIBRATE", "0");
    const std::string name = createAll(l, plain).first;
    ASSERT_FALSE(name.empty());
    const std::string path = tempPath("tuning_layout");
    {
      std::ofstream out(path);
      out << "layout " << name << "\nallreduce 0-inf tree\n";
    }
    for (const auto& job : layouts) {
      if (job.size != l.size) continue;
      SCOPED_TRACE(std::string("job on ") + job.name);
      Options o;
      o.set("CALIBRATE", "0");
      o.set("TUNING_FILE", path);
      std::vector<std::string> choices;  // rank 0's, for allreduces of 8 B to 64 MiB
      try {
        runRanks(
            job.size,
            [&](RankContext& c) {
              if (c.rank != 0) return;
              auto* impl = c.comm.impl().get();
              for (size_t bytes = 8; bytes <= (64u << 20); bytes *= 4) {
                algorithms::CollectiveCall call;
                call.count = bytes / 4;
                choices.push_back(
                    impl->selector().select(call, {impl->transport(), impl->topology()}, "").algorithm->name());
              }
            },
            o, job.settings);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        continue;
      }
      ASSERT_FALSE(choices.empty());
      const std::vector<std::string> allTree(choices.size(), "tree");
      if (std::string(job.name) == l.name) {
        EXPECT_EQ(choices, allTree);
      } else {
        EXPECT_NE(choices, allTree);  // the cost model decided
      }
    }
    std::remove(path.c_str());
  }
}
