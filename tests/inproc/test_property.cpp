// Randomised property test: random collective, algorithm, data type, op,
// rank count, size, root and in/out of place, each checked against the
// reference. At least 2,000 cases per run; the seed is printed and can be
// fixed with GRADCOMM_TEST_SEED to reproduce a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>

#include "algorithms/catalog.hpp"
#include "support/collective_check.hpp"
#include "support/inproc.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

uint64_t testSeed() {
  if (const char* s = std::getenv("GRADCOMM_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
}

std::vector<std::string> namesOf(Collective c) {
  std::vector<std::string> out = {""};  // "" = the selector's choice
  for (const auto* a : algorithms::allAlgorithms()) {
    if (a->collective() == c && std::string(a->name()) != "native") out.push_back(a->name());
  }
  return out;
}

}  // namespace

TEST(Property, RandomCollectivesMatchTheReference) {
  const uint64_t seed = testSeed();
  std::printf("property test seed: %llu (set GRADCOMM_TEST_SEED=%llu to reproduce)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::mt19937_64 worldRng(seed);
  const int worlds = 16, casesPerWorld = 130;  // 2,080 cases
  int total = 0;
  for (int w = 0; w < worlds; ++w) {
    const int p = 1 + static_cast<int>(worldRng() % 8);
    Options o;
    const size_t segments[] = {64, 256, 1024, 4096, 65536};
    const size_t segment = segments[worldRng() % 5];
    o.set("SEGMENT_SIZE", std::to_string(segment));
    o.set("NET_SEGMENT_SIZE", std::to_string(segment));
    o.set("PIPELINE_DEPTH", std::to_string(1 + worldRng() % 4));
    o.set("SMALL_MESSAGE", std::to_string(worldRng() % 4096));
    // hier: one slice per call (the default below 32 KiB), a few, or one per rank.
    const size_t sliceMins[] = {0, 16, 256, 32 * 1024};
    const size_t sliceMin = sliceMins[worldRng() % 4];
    o.set("HIER_SLICE_MIN", std::to_string(sliceMin));
    o.set("TIMEOUT", "60s");
    transport::InProcWorld::Settings settings;
    settings.chaos = worldRng() % 2 == 0;
    const size_t chunks[] = {8, 64, 4096};
    settings.shmChunkBytes = chunks[worldRng() % 3];
    settings.seed = worldRng();
    // Half the worlds span several emulated hosts of random sizes.
    std::string hosts = "one host";
    if (p >= 2 && worldRng() % 2 == 0) {
      const int count = 2 + static_cast<int>(worldRng() % static_cast<uint64_t>(p - 1));  // 2..p hosts
      settings.hostSizes.assign(static_cast<size_t>(count), 1);
      for (int extra = p - count; extra > 0; --extra) ++settings.hostSizes[worldRng() % settings.hostSizes.size()];
      hosts = "hosts of";
      for (int n : settings.hostSizes) hosts += " " + std::to_string(n);
    }
    const int largestHost = settings.hostSizes.empty() ? p : *std::max_element(settings.hostSizes.begin(), settings.hostSizes.end());
    // What the layout can run (the others fall back by design, tested elsewhere).
    const bool shmRuns = settings.hostSizes.empty() && p >= 2;
    const bool hierRuns = settings.hostSizes.size() >= 2 && largestHost >= 2 && settings.shmChunkBytes >= 8 * static_cast<size_t>(p);
    const uint64_t caseSeed = worldRng();
    // Printed before it runs: an exception thrown out of the ranks names no trace.
    std::printf("world %d: %d ranks, %s, segments of %zu bytes, shared-memory chunks of %zu, hier slices of >= %zu "
                "bytes, chaos %s\n",
                w, p, hosts.c_str(), segment, settings.shmChunkBytes, sliceMin, settings.chaos ? "on" : "off");
    SCOPED_TRACE("seed " + std::to_string(seed) + " world " + std::to_string(w) + " ranks " + std::to_string(p) + ", " + hosts);
    runRanks(
        p,
        [&](RankContext& ctx) {
          std::mt19937_64 rng(caseSeed);  // identical draws on every rank
          for (int i = 0; i < casesPerWorld; ++i) {
            CollectiveCase c;
            const Collective colls[] = {Collective::kAllreduce, Collective::kAllreduce, Collective::kAllreduce,
                                        Collective::kBroadcast, Collective::kReduce,    Collective::kAllgather,
                                        Collective::kReduceScatter};
            c.collective = colls[rng() % 7];
            auto names = namesOf(c.collective);
            c.algorithm = names[rng() % names.size()];
            if ((c.algorithm == "shm" && !shmRuns) || (c.algorithm == "hier" && !hierRuns)) c.algorithm.clear();
            c.type = allTypes()[rng() % 8];
            c.op = allOps()[rng() % 5];
            if (!supported(c.type, c.op)) c.op = ReduceOp::kSum;
            // Log-uniform sizes from 0 to ~3000 elements.
            const int bits = static_cast<int>(rng() % 12);
            c.count = bits == 0 ? 0 : static_cast<size_t>(rng() % (size_t{1} << bits));
            c.root = static_cast<int>(rng() % static_cast<uint64_t>(p));
            c.inPlace = rng() % 2 == 0;
            c.seed = rng();
            // Compressed allreduce paths, on inputs where they are exact.
            if (c.collective == Collective::kAllreduce && c.type == DataType::kFloat32 &&
                (c.op == ReduceOp::kSum || c.op == ReduceOp::kAvg) && rng() % 2 == 0) {
              const uint64_t pick = rng() % 3;
              c.compression = pick == 0 ? "fp16" : pick == 1 ? "bf16"
                                                             : "topk:" + std::to_string(1 + rng() % (c.count + 1)) + ":exact:ef=0";
              if (!c.algorithm.empty() && c.compression.rfind("topk", 0) == 0) c.algorithm.clear();
            }
            std::string err = runAndCheck(ctx.comm, c);
            if (!err.empty()) throw std::runtime_error("case " + std::to_string(i) + ": " + err);
          }
        },
        o, settings);
    total += casesPerWorld;
  }
  EXPECT_GE(total, 2000);
}

TEST(Property, EveryRankGetsIdenticalBitsForRealValuedFloats) {
  // Sums of arbitrary reals depend on the order of additions; every
  // algorithm must still hand all ranks exactly the same bits, and stay
  // within rounding of the exact sum.
  for (int p : {2, 3, 5, 8}) {
    std::vector<std::vector<float>> results(static_cast<size_t>(p));
    for (const char* algo : {"ring", "rd", "hd", "tree", "hier"}) {
      Options o;
      o.set("SEGMENT_SIZE", "256");
      o.set("NET_SEGMENT_SIZE", "256");
      transport::InProcWorld::Settings settings;
      if (algo == std::string("hier")) {
        if (p < 3) continue;  // needs a host with two ranks and another host
        settings.hostSizes = {2, p - 2};
      }
      runRanks(
          p,
          [&](RankContext& ctx) {
            std::mt19937 rng(static_cast<unsigned>(ctx.rank * 977 + 5));
            std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
            std::vector<float> buf(1013);
            for (auto& v : buf) v = dist(rng);
            CollectiveOptions co;
            co.algorithm = algo;
            Work work = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, co);
            work.wait();
            if (work.algorithm() != algo) throw std::runtime_error(std::string(algo) + " fell back to " + work.algorithm());
            results[static_cast<size_t>(ctx.rank)] = buf;
          },
          o, settings);
      std::vector<double> exact(1013, 0.0);
      for (int r = 0; r < p; ++r) {
        std::mt19937 rng(static_cast<unsigned>(r * 977 + 5));
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (auto& v : exact) v += dist(rng);
      }
      for (int r = 1; r < p; ++r) {
        ASSERT_EQ(std::memcmp(results[0].data(), results[static_cast<size_t>(r)].data(), 1013 * sizeof(float)), 0)
            << algo << " p=" << p << ": rank " << r << " differs from rank 0";
      }
      for (size_t i = 0; i < exact.size(); ++i) {
        ASSERT_NEAR(results[0][i], exact[i], 1e-5 * p) << algo << " p=" << p << " i=" << i;
      }
    }
  }
}
