// GossipAverager with ranks as threads: consensus, the exact synchronize(),
// steps that never wait for a slow peer, stale pushes dropped and counted,
// collectives that run while gossip receives wait, a silent peer removed
// (and synchronize() failing naming it), misuse that fails on every rank,
// and the benchmark's problem reaching synchronous SGD's loss.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>
#include <thread>

#include "../../bench/gossip_problem.hpp"
#include "gradcomm/gossip.hpp"
#include "support/inproc.hpp"
#include "support/json_check.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

// Rank r's starting values: distinct per rank and element.
std::vector<float> startValues(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * 10) + static_cast<float>(i % 7);
  return v;
}

double meanOfStarts(int size, size_t i) {
  double s = 0;
  for (int r = 0; r < size; ++r) s += startValues(r, i + 1)[i];
  return s / size;
}

}  // namespace

TEST(Gossip, RanksReachTheAverageOfTheirStartingValues) {
  for (int size : {2, 3, 4, 5}) {
    runRanks(size, [&](RankContext& ctx) {
      auto a = startValues(ctx.rank, 100);
      auto b = startValues(ctx.rank + 7, 33);
      GossipAverager g(ctx.comm, {{a.data(), a.size()}, {b.data(), b.size()}});
      // A barrier per step keeps the ranks in lock-step so that no push goes
      // stale; the last steps let the pushes in flight land.
      for (int s = 0; s < 60; ++s) {
        g.step();
        ctx.barrier->wait();
      }
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], meanOfStarts(size, i), 2e-2) << "size " << size;
      const auto st = g.stats();
      EXPECT_EQ(st.steps, 60u);
      EXPECT_EQ(st.sent, 60u);
      EXPECT_GT(st.received, 50u);
      EXPECT_TRUE(st.removedPeers.empty());
    });
  }
}

TEST(Gossip, AveragersOnGroupsSplitFromOneCommunicatorAverageWithinTheirGroup) {
  // Two groups over one context: each reaches its own members' average,
  // and the pushes of one never reach the other (they carry its group id).
  runRanks(4, [&](RankContext& ctx) {
    Communicator half = ctx.comm.split(ctx.rank % 2, ctx.rank);
    auto a = startValues(ctx.rank, 64);
    GossipAverager g(half, {{a.data(), a.size()}});
    for (int s = 0; s < 40; ++s) {
      g.step();
      ctx.barrier->wait();
    }
    g.synchronize();
    const auto x = startValues(ctx.rank % 2, 64), y = startValues(ctx.rank % 2 + 2, 64);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], (x[i] + y[i]) / 2, 1e-4) << "rank " << ctx.rank;
  });
}

TEST(Gossip, SynchronizeLeavesTheExactAverageOnEveryRank) {
  runRanks(4, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 50);
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    g.synchronize();  // before any step: the plain average
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], meanOfStarts(4, i), 1e-4);
    for (int s = 0; s < 5; ++s) g.step();
    g.synchronize();
    EXPECT_EQ(g.weight(), 1.0);
    // Every rank holds the same bits.
    std::vector<float> first(a.size());
    ctx.comm.broadcast(a.data(), first.data(), a.size(), DataType::kFloat32, 0).wait();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], first[i]);
  });
}

TEST(Gossip, StepsNeverWaitForASlowPeerAndLatePushesAreDroppedAndCounted) {
  Options o;
  o.set("GOSSIP_MAX_STALENESS", "2");
  ThreadBarrier fast(3);  // ranks 0..2 step in lock-step among themselves
  runRanks(4, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 64);
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    // Rank 3 takes each block of 30 steps only after the others took theirs:
    // if step() waited for a peer, nobody would get past the first block.
    for (int block = 0; block < 2; ++block) {
      if (ctx.rank != 3) {
        for (int s = 0; s < 30; ++s) {
          g.step();
          fast.wait();
        }
      }
      ctx.barrier->wait();
      if (ctx.rank == 3) {
        for (int s = 0; s < 30; ++s) g.step();
      }
      ctx.barrier->wait();
    }
    const auto st = g.stats();
    EXPECT_EQ(st.steps, 60u);
    // Rank 0 hears from rank 3 (distance 1) at its even steps: rank 3's
    // pushes of steps 0..29 reached it during its own steps 30..59, far more
    // than 2 steps late, so they were dropped, not mixed.
    if (ctx.rank == 0) {
      EXPECT_GT(st.dropped, 0u);
      EXPECT_GT(st.received, 0u);
    }
    EXPECT_TRUE(st.removedPeers.empty()) << "a slow peer is not a dead one";
    // After synchronize() every rank agrees again.
    g.synchronize();
    std::vector<float> first(a.size());
    ctx.comm.broadcast(a.data(), first.data(), a.size(), DataType::kFloat32, 0).wait();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], first[i]);
  }, o);
}

TEST(Gossip, ASlowRankAdoptsTheGroupsClockSoItsPushesAreMixedNotDropped) {
  Options o;
  o.set("GOSSIP_MAX_STALENESS", "16");
  std::atomic<size_t> droppedOfOthers{0};
  runRanks(4, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 32);
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    // Rank 3 steps once per round, the others three times: by step count it
    // would end 40 steps behind, and with a bound of 16 every push of its
    // second half would be dropped. On the clock it stays within a few
    // steps (a round at most, and the bound leaves room for the barriers'
    // jitter).
    for (int round = 0; round < 20; ++round) {
      for (int s = 0; s < (ctx.rank == 3 ? 1 : 3); ++s) g.step();
      ctx.barrier->wait();
    }
    const auto st = g.stats();
    EXPECT_EQ(st.steps, ctx.rank == 3 ? 20u : 60u);
    if (ctx.rank == 3) {
      // Within the margin (half the bound, 8) and a round (3) of the others.
      EXPECT_GE(st.clock, 60u - 8 - 3 - 3) << "the slow rank did not adopt its peers' clock";
    } else {
      droppedOfOthers += st.dropped;
    }
    EXPECT_GT(st.received, 0u);
    EXPECT_TRUE(st.removedPeers.empty());
    ctx.barrier->wait();
    // synchronize() works across different step counts and clocks.
    g.synchronize();
    std::vector<float> first(a.size());
    ctx.comm.broadcast(a.data(), first.data(), a.size(), DataType::kFloat32, 0).wait();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], first[i]);
  }, o);
  // Rank 3's pushes reach ranks 0 and 1: none was too late to mix.
  EXPECT_EQ(droppedOfOthers.load(), 0u);
}

TEST(Gossip, TheCallersUpdateIsAppliedToThePushSumNumeratorAsInSgp) {
  Options o;
  o.set("GOSSIP_PEER_TIMEOUT", "60s");
  runRanks(2, [&](RankContext& ctx) {
    std::vector<float> a(8, ctx.rank == 0 ? 1.0f : 5.0f);
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    if (ctx.rank == 0) {
      // Rank 1 never steps, so nothing arrives here: the first step pushes
      // half of this rank's weight away and keeps z.
      g.step();
      ASSERT_DOUBLE_EQ(g.weight(), 0.5);
      for (float v : a) ASSERT_EQ(v, 1.0f);
      // An update of +0.25 to z with half the weight is +0.125 to the
      // numerator x = w z in a plain copy; SGP applies it to x whole, so
      // z moves by 0.25 / 0.5.
      for (auto& v : a) v += 0.25f;
      g.step();
      for (float v : a) EXPECT_FLOAT_EQ(v, 1.5f);
      EXPECT_DOUBLE_EQ(g.weight(), 0.25);
      // Beyond 4x (weight 1/8 here) the update is taken at 4x.
      g.step();
      ASSERT_DOUBLE_EQ(g.weight(), 0.125);
      for (auto& v : a) v += 0.25f;
      g.step();
      for (float v : a) EXPECT_FLOAT_EQ(v, 1.5f + 4 * 0.25f);
    }
    ctx.barrier->wait();
  }, o);
}

TEST(Gossip, CollectivesRunWhileGossipReceivesWaitForASilentPeer) {
  runRanks(3, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 16);
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    // Ranks 0 and 1 step (their receives from rank 2 stay pending); rank 2
    // never steps. Allreduces behind those receives must still complete.
    if (ctx.rank != 2) {
      for (int s = 0; s < 3; ++s) g.step();
    }
    for (int i = 0; i < 5; ++i) {
      int32_t v = ctx.rank + i, sum = 0;
      ctx.comm.allreduce(&v, &sum, 1, DataType::kInt32, ReduceOp::kSum).wait();
      EXPECT_EQ(sum, 3 * i + 3);
    }
  });
}

TEST(Gossip, ASilentPeerIsRemovedTheOthersKeepGoingAndSynchronizeNamesIt) {
  Options o;
  o.set("GOSSIP_PEER_TIMEOUT", "200ms");
  std::atomic<int> done{0};
  ThreadBarrier survivors(3);
  runRanks(4, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 32);
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    if (ctx.rank == 3) {
      g.step();  // then falls silent until the others are done (bounded, should they fail)
      const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (done.load() < 3 && std::chrono::steady_clock::now() < giveUp) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return;
    }
    // Bounded: 2 ms per step, the timeout after about 100 steps.
    int steps = 0;
    for (; steps < 3000 && g.stats().removedPeers.empty(); ++steps) {
      g.step();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(g.stats().removedPeers, std::vector<int>{3}) << "rank " << ctx.rank << " after " << steps << " steps";
    // The survivors keep averaging among themselves.
    for (int s = 0; s < 40; ++s) {
      g.step();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // Every survivor is done stepping before any drops its averager (and
    // with it the receives the others' pushes are bound for).
    survivors.wait();
    EXPECT_EQ(g.stats().removedPeers, std::vector<int>{3});
    try {
      g.synchronize();
      ADD_FAILURE() << "synchronize() succeeded without rank 3";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
    }
    survivors.wait();
    done.fetch_add(1);
  }, o);
}

TEST(Gossip, ConsensusDistanceShrinksAsRanksMixAndIsZeroAfterSynchronize) {
  runRanks(4, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 40);
    GossipOptions opts;
    opts.consensusDistance = true;
    GossipAverager g(ctx.comm, {{a.data(), a.size()}}, opts);
    EXPECT_EQ(g.stats().consensusDistance, -1.0) << "nothing measured before the first step";
    g.step();
    const double first = g.stats().consensusDistance;
    for (int s = 0; s < 30; ++s) g.step();  // the measuring allreduces keep the ranks in step
    const double later = g.stats().consensusDistance;
    EXPECT_GT(first, 1.0);
    EXPECT_LT(later, first / 100) << "first " << first << ", later " << later;
    g.synchronize();
    g.step();
    // After the exact average and one step every rank holds the same values.
    EXPECT_LT(g.stats().consensusDistance, 1e-4);
  });
}

TEST(Gossip, TimelineRecordsEveryStepAsValidJson) {
  char dir[] = "/tmp/gradcomm-gossip-trace.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  runRanks(2, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 8);
    GossipOptions opts;
    opts.timelinePath = std::string(dir) + "/gossip.json";
    GossipAverager g(ctx.comm, {{a.data(), a.size()}}, opts);
    for (int s = 0; s < 5; ++s) g.step();
  });
  for (int r = 0; r < 2; ++r) {
    const std::string path = std::string(dir) + "/gossip.rank" + std::to_string(r) + ".json";
    std::ifstream f(path);
    ASSERT_TRUE(f.good()) << path;
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_EQ(JsonChecker(text.str()).check(), "") << path;
    // One span per step() call, named by the gossip clock (which may skip
    // a step when the peer is ahead), with the call's number.
    for (const char* needle : {"gossip step 0", "\"call\": 0", "\"call\": 4", "\"mixed\": "}) {
      EXPECT_NE(text.str().find(needle), std::string::npos) << needle << " missing from " << path;
    }
    EXPECT_EQ(text.str().find("\"call\": 5"), std::string::npos) << path;
    std::remove(path.c_str());
  }
  rmdir(dir);
}

TEST(Gossip, ASingleRankKeepsItsValuesAndSynchronizes) {
  runRanks(1, [&](RankContext& ctx) {
    auto a = startValues(0, 10);
    const auto before = a;
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    for (int s = 0; s < 5; ++s) g.step();
    g.synchronize();
    EXPECT_EQ(a, before);
    EXPECT_EQ(g.stats().sent, 0u);
  });
}

TEST(Gossip, StepAfterTheCommunicatorWasDestroyedIsAnError) {
  runRanks(2, [&](RankContext& ctx) {
    auto a = startValues(ctx.rank, 10);
    GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    g.step();
    ctx.barrier->wait();
    ctx.comm.destroy();
    try {
      g.step();
      ADD_FAILURE() << "step() after destroy() succeeded";
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
    }
  });
}

TEST(Gossip, DifferentParameterSizesFailOnEveryRank) {
  std::atomic<int> failures{0};
  runRanks(3, [&](RankContext& ctx) {
    std::vector<float> a(ctx.rank == 1 ? 11 : 10);
    try {
      GossipAverager g(ctx.comm, {{a.data(), a.size()}});
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("different parameter sizes"), std::string::npos) << e.what();
      failures.fetch_add(1);
    }
  });
  EXPECT_EQ(failures.load(), 3);
}

TEST(Gossip, ANullBufferFailsOnItsRankAndTheOthersAreTold) {
  std::atomic<int> invalid{0}, told{0};
  runRanks(3, [&](RankContext& ctx) {
    std::vector<float> a(10);
    try {
      GossipAverager g(ctx.comm, {{ctx.rank == 2 ? nullptr : a.data(), a.size()}});
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("null"), std::string::npos) << e.what();
      invalid.fetch_add(1);
    } catch (const Error&) {
      told.fetch_add(1);
    }
  });
  EXPECT_EQ(invalid.load(), 1);
  EXPECT_EQ(told.load(), 2);
}

TEST(Gossip, TheBenchmarkProblemReachesSynchronousSgdsLossWithinTwoPercent) {
  bench::SoftmaxSpec spec;
  spec.features = 32;
  spec.classes = 4;
  spec.samplesPerRank = 512;
  spec.evalSamples = 512;
  spec.batch = 32;
  const int size = 4, steps = 400;
  const float lr = 0.5f;
  // Synchronous SGD, computed directly: the average of the ranks' gradients.
  std::vector<bench::SoftmaxProblem> problems;
  for (int r = 0; r < size; ++r) problems.emplace_back(spec, r);
  const size_t n = problems[0].paramCount();
  std::vector<float> w(n, 0.0f), g(n), avg(n);
  for (int s = 0; s < steps; ++s) {
    std::fill(avg.begin(), avg.end(), 0.0f);
    for (int r = 0; r < size; ++r) {
      problems[static_cast<size_t>(r)].gradient(w.data(), static_cast<uint64_t>(s), g.data());
      for (size_t i = 0; i < n; ++i) avg[i] += g[i] / size;
    }
    for (size_t i = 0; i < n; ++i) w[i] -= lr * avg[i];
  }
  const double syncLoss = problems[0].loss(w.data());
  const double startLoss = problems[0].loss(std::vector<float>(n, 0.0f).data());
  std::vector<double> gossipLoss(size);
  runRanks(size, [&](RankContext& ctx) {
    const auto& p = problems[static_cast<size_t>(ctx.rank)];
    std::vector<float> z(n, 0.0f), grad(n);
    GossipAverager avgr(ctx.comm, {{z.data(), z.size()}});
    // Lock-step (a barrier per step), so that pushes arrive one step late as
    // in SGP's one-step overlap and the result does not depend on how the
    // host schedules the threads; the timing behaviour has its own tests.
    for (int s = 0; s < steps; ++s) {
      p.gradient(z.data(), static_cast<uint64_t>(s), grad.data());
      for (size_t i = 0; i < n; ++i) z[i] -= lr * grad[i];
      avgr.step();
      ctx.barrier->wait();
    }
    avgr.synchronize();
    gossipLoss[static_cast<size_t>(ctx.rank)] = p.loss(z.data());
  });
  std::printf("start loss %.5f, synchronous SGD %.5f, gossip %.5f\n", startLoss, syncLoss, gossipLoss[0]);
  EXPECT_LT(syncLoss, 0.8 * startLoss) << "the problem must actually be optimised";
  for (double l : gossipLoss) EXPECT_LE(std::fabs(l - syncLoss), 0.02 * syncLoss);
}

TEST(Gossip, ReceiveBuffersAreBoundedByTheStalenessWindowNotByInNeighboursTimesIt) {
  // Each in-neighbour pushes here once per graph period (log2 n steps): the
  // pushes that can matter, those of the last S + 1 steps, need about
  // (S + 1) / log2 n receives from each, not S + 1. Bound: S + 1 in all,
  // plus two per in-neighbour for rounding and slack.
  constexpr size_t kCount = 4096;  // floats: a 16 KiB model
  constexpr size_t kStaleness = 16;  // GRADCOMM_GOSSIP_MAX_STALENESS's default
  for (int n : {8, 64}) {
    const size_t inNeighbours = static_cast<size_t>(std::ceil(std::log2(n)));
    const size_t bound = kStaleness + 1 + 2 * inNeighbours;
    std::atomic<size_t> worstBuffers{0}, worstBytes{0};
    runRanks(n, [&](RankContext& ctx) {
      auto a = startValues(ctx.rank, kCount);
      GossipAverager g(ctx.comm, {{a.data(), a.size()}});
      size_t buffers = g.stats().receiveBuffers, bytes = g.stats().bufferBytes;
      // In lock-step, so that pushes in flight are only this step's (ranks
      // running ahead of receivers that are not scheduled leave more).
      for (int s = 0; s < 24; ++s) {
        g.step();
        ctx.barrier->wait();
        buffers = std::max(buffers, g.stats().receiveBuffers);
        bytes = std::max(bytes, g.stats().bufferBytes);
      }
      EXPECT_GT(buffers, 0u);
      EXPECT_LE(buffers, bound) << "rank " << ctx.rank << " of " << n;
      size_t seen = worstBuffers.load();
      while (buffers > seen && !worstBuffers.compare_exchange_weak(seen, buffers)) {
      }
      seen = worstBytes.load();
      while (bytes > seen && !worstBytes.compare_exchange_weak(seen, bytes)) {
      }
      g.synchronize();
    });
    // A receive buffer holds one push: the model plus a header of a few bytes.
    const double model = static_cast<double>(kCount * sizeof(float));
    std::printf("gossip buffers, %d ranks, model %.0f bytes: at most %zu receive buffers per rank (bound %zu) = "
                "%.1f x the model; with pushes still in flight at most %zu bytes = %.1f x the model\n",
                n, model, worstBuffers.load(), bound, static_cast<double>(worstBuffers.load()), worstBytes.load(),
                static_cast<double>(worstBytes.load()) / model);
  }
}
