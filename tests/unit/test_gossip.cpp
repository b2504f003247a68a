// Pure checks of the gossip pieces, with no transport: the exponential peer
// graph (in/out peers, strong connectivity over a period for every size, the
// survivors' graph) and push-sum mixing (mass conservation, de-biasing to
// the exact average with messages delayed and dropped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <numeric>
#include <random>

#include "gossip/peer_graph.hpp"
#include "gossip/push_sum.hpp"

using namespace gradcomm::gossip;

namespace {
std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

/// True when the union of the graph's edges over steps [first, first + steps)
/// lets every member reach every other.
bool stronglyConnectedOver(const ExponentialGraph& graph, uint64_t first, size_t steps) {
  const auto& members = graph.members();
  const size_t m = members.size();
  if (m <= 1) return true;
  std::vector<std::vector<bool>> reach(m, std::vector<bool>(m, false));
  for (size_t i = 0; i < m; ++i) reach[i][i] = true;
  auto index = [&](int rank) {
    return static_cast<size_t>(std::lower_bound(members.begin(), members.end(), rank) - members.begin());
  };
  for (uint64_t s = first; s < first + steps; ++s) {
    for (size_t i = 0; i < m; ++i) {
      for (int peer : graph.outPeers(members[i], s)) reach[i][index(peer)] = true;
    }
  }
  // Transitive closure (Floyd-Warshall on booleans): m is small.
  for (size_t k = 0; k < m; ++k) {
    for (size_t i = 0; i < m; ++i) {
      if (!reach[i][k]) continue;
      for (size_t j = 0; j < m; ++j) reach[i][j] = reach[i][j] || reach[k][j];
    }
  }
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < m; ++j) {
      if (!reach[i][j]) return false;
    }
  }
  return true;
}
}  // namespace

TEST(ExponentialGraph, PushesToPowersOfTwoDistancesInTurn) {
  ExponentialGraph g(iota(8), 1);
  EXPECT_EQ(g.period(), 3u);
  EXPECT_EQ(g.outPeers(0, 0), std::vector<int>{1});
  EXPECT_EQ(g.outPeers(0, 1), std::vector<int>{2});
  EXPECT_EQ(g.outPeers(0, 2), std::vector<int>{4});
  EXPECT_EQ(g.outPeers(0, 3), std::vector<int>{1});
  EXPECT_EQ(g.outPeers(7, 2), std::vector<int>{3});
  EXPECT_EQ(g.inPeers(0, 2), std::vector<int>{4});
  ExponentialGraph two(iota(8), 2);
  EXPECT_EQ(two.outPeers(0, 0), (std::vector<int>{1, 2}));
  EXPECT_EQ(two.outPeers(0, 1), (std::vector<int>{4, 1}));
}

TEST(ExponentialGraph, InPeersAreExactlyTheRanksThatPushHere) {
  for (int n = 1; n <= 13; ++n) {
    for (size_t peers = 1; peers <= 3; ++peers) {
      ExponentialGraph g(iota(n), peers);
      for (uint64_t s = 0; s < 8; ++s) {
        for (int r = 0; r < n; ++r) {
          std::vector<int> expected;
          for (int q = 0; q < n; ++q) {
            for (int o : g.outPeers(q, s)) {
              if (o == r) expected.push_back(q);
            }
          }
          auto in = g.inPeers(r, s);
          std::sort(in.begin(), in.end());
          std::sort(expected.begin(), expected.end());
          EXPECT_EQ(in, expected) << "n=" << n << " peers=" << peers << " step=" << s << " rank=" << r;
          for (int o : g.outPeers(r, s)) EXPECT_NE(o, r) << "a rank never pushes to itself";
        }
      }
    }
  }
}

TEST(ExponentialGraph, EveryScheduleIsStronglyConnectedOverAPeriodForSizesOneToThirtyThree) {
  for (int n = 1; n <= 33; ++n) {
    for (size_t peers = 1; peers <= 4; ++peers) {
      ExponentialGraph g(iota(n), peers);
      for (uint64_t first = 0; first < 2 * g.period(); ++first) {
        EXPECT_TRUE(stronglyConnectedOver(g, first, g.period()))
            << "n=" << n << " peers=" << peers << " first step=" << first;
      }
    }
  }
}

TEST(ExponentialGraph, AOneStepWindowIsNotStronglyConnectedWhenThePeriodIsLonger) {
  // The connectivity check can fail: distance 2 alone splits 8 ranks in two.
  ExponentialGraph g(iota(8), 1);
  EXPECT_FALSE(stronglyConnectedOver(g, 1, 1));
}

TEST(ExponentialGraph, SurvivorsGraphSkipsRemovedRanksAndStaysConnected) {
  for (int n = 2; n <= 12; ++n) {
    for (int dead = 0; dead < n; ++dead) {
      std::vector<int> alive;
      for (int r = 0; r < n; ++r) {
        if (r != dead) alive.push_back(r);
      }
      ExponentialGraph g(alive, 1);
      EXPECT_EQ(std::count(g.members().begin(), g.members().end(), dead), 0);
      EXPECT_TRUE(g.outPeers(dead, 0).empty());
      for (uint64_t s = 0; s < 6; ++s) {
        for (int r : alive) {
          for (int o : g.outPeers(r, s)) EXPECT_NE(o, dead);
        }
      }
      EXPECT_TRUE(stronglyConnectedOver(g, 0, g.period())) << "n=" << n << " dead=" << dead;
    }
  }
}

namespace {

// A simulated gossip network: every rank pushes each step per the graph;
// a message is delivered after a random delay of 0..maxDelay steps or, with
// probability dropRate, lost (the receiver drops it as too stale).
struct Sim {
  struct Msg {
    int to;
    uint64_t due;
    double w;
    std::vector<float> z;
  };
  int n;
  size_t count;
  std::vector<std::vector<float>> z;
  std::vector<double> w;
  std::deque<Msg> inFlight;
  std::mt19937_64 rng;
  int lossyRank = -1;  // every push of this rank is lost

  Sim(int ranks, size_t c, uint64_t seed) : n(ranks), count(c), z(static_cast<size_t>(ranks)),
                                            w(static_cast<size_t>(ranks), 1.0), rng(seed) {
    std::uniform_real_distribution<float> u(-10.0f, 10.0f);
    for (auto& v : z) {
      v.resize(count);
      for (auto& e : v) e = u(rng);
    }
  }

  void step(const ExponentialGraph& g, uint64_t s, int maxDelay, double dropRate, double* lostWeight = nullptr) {
    std::uniform_int_distribution<int> delay(0, maxDelay);
    std::uniform_real_distribution<double> coin(0, 1);
    for (int r = 0; r < n; ++r) {
      const auto out = g.outPeers(r, s);
      if (out.empty()) continue;
      const double pw = PushSum::splitWeight(w[static_cast<size_t>(r)], out.size());
      for (int o : out) {
        if (r == lossyRank || coin(rng) < dropRate) {
          if (lostWeight) *lostWeight += pw;
          continue;
        }
        inFlight.push_back({o, s + static_cast<uint64_t>(delay(rng)), pw, z[static_cast<size_t>(r)]});
      }
    }
    for (auto it = inFlight.begin(); it != inFlight.end();) {
      if (it->due <= s) {
        const size_t to = static_cast<size_t>(it->to);
        PushSum::mix(z[to].data(), w[to], it->z.data(), it->w, count);
        it = inFlight.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The push-sum numerator x = z·w summed over ranks and messages in flight, in double.
  double massOf(size_t i) const {
    double m = 0;
    for (size_t r = 0; r < z.size(); ++r) m += static_cast<double>(z[r][i]) * w[r];
    for (const auto& msg : inFlight) m += static_cast<double>(msg.z[i]) * msg.w;
    return m;
  }
  double weightMass() const {
    double m = std::accumulate(w.begin(), w.end(), 0.0);
    for (const auto& msg : inFlight) m += msg.w;
    return m;
  }
};

}  // namespace

TEST(PushSum, ConservesMassToRoundingOverThousandsOfStepsWithDelays) {
  const uint64_t seed = 20261123;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int n : {2, 5, 8}) {
    for (size_t peers : {1, 2}) {
      Sim sim(n, 16, seed + static_cast<uint64_t>(n));
      std::vector<double> before(sim.count);
      double scale = 0;
      for (size_t i = 0; i < sim.count; ++i) {
        before[i] = sim.massOf(i);
        for (const auto& v : sim.z) scale = std::max(scale, std::fabs(static_cast<double>(v[i])));
      }
      ExponentialGraph g(iota(n), peers);
      const int steps = 3000;
      double worst = 0;
      for (int s = 0; s < steps; ++s) sim.step(g, static_cast<uint64_t>(s), 3, 0.0);
      for (size_t i = 0; i < sim.count; ++i) {
        worst = std::max(worst, std::fabs(sim.massOf(i) - before[i]) / (scale * n));
        // Each mix rounds once per element (float): the error is a random
        // walk of roundings: a few float ulps after 3000 steps (machine precision).
        EXPECT_NEAR(sim.massOf(i), before[i], 1e-6 * scale * n) << "n=" << n << " peers=" << peers << " i=" << i;
      }
      std::printf("n=%d peers=%zu: worst relative mass error %.2e after %d steps\n", n, peers, worst, steps);
      EXPECT_NEAR(sim.weightMass(), static_cast<double>(n), 1e-9) << "n=" << n << " peers=" << peers;
    }
  }
}

TEST(PushSum, DebiasedEstimatesReachTheExactAverageDespiteDelays) {
  const uint64_t seed = 7;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int n : {3, 4, 6, 7}) {
    Sim sim(n, 8, seed + static_cast<uint64_t>(n));
    std::vector<double> average(sim.count);
    for (size_t i = 0; i < sim.count; ++i) average[i] = sim.massOf(i) / n;
    ExponentialGraph g(iota(n), 1);
    uint64_t s = 0;
    for (; s < 400; ++s) sim.step(g, s, 2, 0.0);
    // Drain: let every message in flight arrive with no new pushes.
    for (uint64_t d = s; d < s + 3; ++d) sim.step(ExponentialGraph({}, 1), d, 0, 0.0);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < sim.count; ++i) {
        EXPECT_NEAR(sim.z[static_cast<size_t>(r)][i], average[i], 1e-4) << "n=" << n << " rank=" << r;
      }
    }
  }
}

TEST(PushSum, LostPushesKeepEstimatesConvexCombinations) {
  // A dropped push takes its weight with it: the estimates still agree and
  // stay within the range of the starting values (no bias towards zero).
  const uint64_t seed = 11;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const int n = 6;
  Sim sim(n, 4, seed);
  std::vector<float> lo(sim.count, INFINITY), hi(sim.count, -INFINITY);
  for (const auto& v : sim.z) {
    for (size_t i = 0; i < sim.count; ++i) {
      lo[i] = std::min(lo[i], v[i]);
      hi[i] = std::max(hi[i], v[i]);
    }
  }
  ExponentialGraph g(iota(n), 1);
  double lost = 0;
  for (uint64_t s = 0; s < 300; ++s) sim.step(g, s, 2, 0.2, &lost);
  EXPECT_GT(lost, 0.0) << "the simulation must have dropped pushes";
  for (uint64_t d = 300; d < 303; ++d) sim.step(ExponentialGraph({}, 1), d, 0, 0.0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < sim.count; ++i) {
      const float z = sim.z[static_cast<size_t>(r)][i];
      EXPECT_GE(z, lo[i] - 1e-3f);
      EXPECT_LE(z, hi[i] + 1e-3f);
      EXPECT_NEAR(z, sim.z[0][i], 1e-3) << "rank " << r << " disagrees";
    }
  }
}

TEST(PushSum, EstimatesStayFiniteWhenOneRanksPushesAreAlwaysLost) {
  // A persistent straggler: every push rank 3 makes is dropped as stale, so
  // the others' weights leak away geometrically. Estimates must stay finite
  // averages of the starting values (the weight is rescaled, never 0).
  const uint64_t seed = 5;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const int n = 4;
  Sim sim(n, 4, seed);
  ExponentialGraph g(iota(n), 1);
  int rescaled = 0;
  sim.lossyRank = 3;
  for (uint64_t s = 0; s < 20000; ++s) {
    sim.step(g, s, 0, 0.0);
    for (auto& w : sim.w) rescaled += PushSum::renormalize(w) ? 1 : 0;
  }
  EXPECT_GT(rescaled, 0) << "weights must have shrunk far enough to be rescaled";
  for (int r = 0; r < n; ++r) {
    EXPECT_GT(sim.w[static_cast<size_t>(r)], 0.0);
    for (size_t i = 0; i < sim.count; ++i) {
      EXPECT_TRUE(std::isfinite(sim.z[static_cast<size_t>(r)][i]));
      EXPECT_LE(std::fabs(sim.z[static_cast<size_t>(r)][i]), 10.0f);
    }
  }
}

TEST(PushSum, MixIsTheWeightedAverageAndSplitSharesAddUpToTheWhole) {
  std::vector<float> z = {1.0f, -2.0f, 5.0f};
  double w = 1.0;
  const std::vector<float> y = {3.0f, 2.0f, 5.0f};
  PushSum::mix(z.data(), w, y.data(), 3.0, z.size());
  EXPECT_FLOAT_EQ(z[0], 2.5f);
  EXPECT_FLOAT_EQ(z[1], 1.0f);
  EXPECT_FLOAT_EQ(z[2], 5.0f);
  EXPECT_EQ(w, 4.0);
  PushSum::mix(z.data(), w, y.data(), 0.0, z.size());  // an empty push changes nothing
  EXPECT_FLOAT_EQ(z[0], 2.5f);
  EXPECT_EQ(w, 4.0);
  for (size_t peers : {1, 2, 3, 6}) {
    double v = 1.0;
    const double pw = PushSum::splitWeight(v, peers);
    EXPECT_NEAR(v + static_cast<double>(peers) * pw, 1.0, 1e-15);
    EXPECT_NEAR(pw, 1.0 / static_cast<double>(peers + 1), 1e-15);
  }
  double tiny = std::ldexp(1.0, -700), huge = std::ldexp(1.0, 700), one = 1.0;
  EXPECT_TRUE(PushSum::renormalize(tiny));
  EXPECT_EQ(tiny, std::ldexp(1.0, -100));
  EXPECT_TRUE(PushSum::renormalize(huge));
  EXPECT_EQ(huge, std::ldexp(1.0, 100));
  EXPECT_FALSE(PushSum::renormalize(one));
}
