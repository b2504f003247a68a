// The topology view, the cost model on synthetic layouts, the tuning and
// calibration file parsers, and the selector's order of precedence. No
// timing: every number here is chosen, none measured.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "algorithms/selector.hpp"
#include "gradcomm/error.hpp"
#include "topology/calibration.hpp"
#include "topology/cost_model.hpp"
#include "topology/topology_view.hpp"
#include "topology/tuning_file.hpp"
#include "transport/call_signature.hpp"
#include "transport/inproc_transport.hpp"

using namespace gradcomm;
using namespace gradcomm::topology;

namespace {

constexpr size_t kSmall = 8;
constexpr size_t kLarge = 64u << 20;

/// Round numbers: same host 1 us and 5 GB/s (a point-to-point message
/// between processes costs about two copies), across hosts 10 us and
/// 1 Gbit/s (the emulated hosts of the lead's measurements), copy 10 GB/s.
MachineCosts chosenCosts() {
  MachineCosts c;
  c.sameHost = {1e-6, 1.0 / 5e9};
  c.interHost = {10e-6, 8.0 / 1e9};
  c.copySecondsPerByte = 1.0 / 10e9;
  c.reduceSecondsPerByte = 1.0 / 5e9;
  c.shmSyncSeconds = 0.5e-6;
  c.source = "test";
  return c;
}

/// The modelled algorithm with the lowest prediction among `names`.
std::string fastest(const CostModel& m, Collective c, size_t bytes, std::vector<std::string> names) {
  std::string best;
  double bestTime = 1e300;
  for (const auto& n : names) {
    auto t = m.predict(c, n, bytes);
    if (t && *t < bestTime) {
      bestTime = *t;
      best = n;
    }
  }
  return best;
}

const std::vector<std::string> kFlat = {"ring", "rd", "hd", "tree", "shm"};

algorithms::CollectiveCall allreduce(size_t bytes) {
  algorithms::CollectiveCall c;
  c.collective = Collective::kAllreduce;
  c.type = DataType::kFloat32;
  c.count = bytes / 4;
  return c;
}

}  // namespace

TEST(TopologyView, GroupsRanksByHostLeader) {
  TopologyView v({0, 0, 2, 0, 2});
  EXPECT_EQ(v.size(), 5);
  EXPECT_EQ(v.numHosts(), 2);
  EXPECT_EQ(v.ranksOnHost(0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(v.hostLocalRanks(4), (std::vector<int>{2, 4}));
  EXPECT_EQ(v.localIndex(3), 2);
  EXPECT_EQ(v.linkClass(1, 3), LinkClass::kSameHost);
  EXPECT_EQ(v.linkClass(1, 2), LinkClass::kInterHost);
  EXPECT_EQ(v.linkClass(2, 2), LinkClass::kSelf);
  EXPECT_FALSE(v.uniformHosts());
  EXPECT_EQ(v.maxRanksPerHost(), 3);
  EXPECT_EQ(v.describe(), "5 rank(s) on 2 host(s) (3+2)");
  EXPECT_EQ(TopologyView::uniform(2, 3).describe(), "6 rank(s) on 2 host(s) (2x3)");
}

TEST(TopologyView, RejectsInconsistentHostLeaders) {
  EXPECT_THROW(TopologyView({1, 1}), InternalError);     // leader above the rank
  EXPECT_THROW(TopologyView({0, 2, 2}), InternalError);  // rank 1's leader is rank 2
  EXPECT_THROW(TopologyView({0, 0, 1}), InternalError);  // rank 1 is not a leader
}

TEST(TopologyView, InProcTransportReportsHostLeaders) {
  transport::InProcWorld::Settings s;
  s.ranksPerHost = 2;
  auto world = transport::InProcWorld::create(5, s);
  auto view = detect(world->hostLayout(3));
  EXPECT_EQ(view.numHosts(), 3);
  EXPECT_EQ(view.hostLocalRanks(3), (std::vector<int>{2, 3}));
  EXPECT_EQ(view.hostLabel(), "inproc-host1");
}

TEST(Calibration, FitsAlphaAndBetaFromTwoRoundTrips) {
  // 10 us small round trip, 1 MiB in 2 ms round trip: alpha 5 us, the
  // rest of the 1 ms one-way time is bandwidth.
  const LinkCost l = fitLink(10e-6, 2e-3, 1 << 20, 1e-11);
  EXPECT_DOUBLE_EQ(l.alphaSeconds, 5e-6);
  EXPECT_NEAR(l.betaSecondsPerByte, (1e-3 - 5e-6) / (1 << 20), 1e-18);
}

TEST(Calibration, ANoisyPingCannotMakeALinkFasterThanAMemoryCopy) {
  // Seen on a loaded machine: every small ping lost its core (5.9 ms
  // round trip) while the bulk one did not. The plain fit made the link
  // move bytes for free; bounded, alpha is the bulk one-way time and beta
  // no faster than memcpy.
  const double copy = 1.0 / 25e9;
  const LinkCost l = fitLink(11.8e-3, 1e-3, 64 * 1024, copy);
  EXPECT_DOUBLE_EQ(l.alphaSeconds, 0.5e-3);
  EXPECT_DOUBLE_EQ(l.betaSecondsPerByte, copy);
  // A plausible fit is left alone by the bound.
  EXPECT_GT(fitLink(10e-6, 2e-3, 1 << 20, copy).betaSecondsPerByte, 10 * copy);
}

TEST(Calibration, ALoadedRoundSetsTheRoundFloorLessTheModelsOverhead) {
  // 4 emulated hosts on 2 cores: a round with every rank active 100 us;
  // the model adds 2 us per round on top of the floor.
  EXPECT_DOUBLE_EQ(fitRoundFloor(100e-6, 2e-6), 98e-6);
  // A round faster than the overhead: no floor.
  EXPECT_DOUBLE_EQ(fitRoundFloor(1e-6, 2e-6), 0.0);
}

TEST(Calibration, ALoadedBulkRoundRaisesBetaButNeverLowersIt) {
  const LinkCost lone{5e-6, 1e-9};
  // 256 KiB in 400 us with every rank sending at once: 2 us of the model's
  // round overhead and the 5 us alpha, the rest is the loaded beta.
  EXPECT_DOUBLE_EQ(fitLoadedBeta(400e-6, 256 * 1024, lone, 2e-6), (400e-6 - 2e-6 - 5e-6) / (256 * 1024));
  // A round faster than the lone ping-pong predicts keeps the lone beta.
  EXPECT_DOUBLE_EQ(fitLoadedBeta(100e-6, 256 * 1024, lone, 2e-6), 1e-9);
  // No round measured: the lone beta.
  EXPECT_DOUBLE_EQ(fitLoadedBeta(0, 256 * 1024, lone, 2e-6), 1e-9);
}

// The shared-memory data rounds: a round of 512 KiB per rank on 4 ranks
// that took 3 hand-offs plus 1.5x what copy and reduce price its bytes at.
TEST(Calibration, SharedMemoryDataRoundsFitTheByteFactorBeyondTheHandOffs) {
  MachineCosts c = MachineCosts::defaults();
  c.copySecondsPerByte = 1e-10;
  c.reduceSecondsPerByte = 2e-10;
  c.shmSyncSeconds = 4e-6;
  const double bytes = 512 * 1024, l = 4;
  const double formula = bytes * ((2 * l - 1) / l * 1e-10 + (l - 1) / l * 2e-10);
  EXPECT_NEAR(fitShmByteFactor(3 * 4e-6 + 1.5 * formula, bytes, 4, c), 1.5, 1e-12);
  // Clamped: a round that took almost nothing, and one that took forever.
  EXPECT_DOUBLE_EQ(fitShmByteFactor(1e-9, bytes, 4, c), kShmByteFactorMin);
  EXPECT_DOUBLE_EQ(fitShmByteFactor(1.0, bytes, 4, c), kShmByteFactorMax);
  // Nothing to fit: one rank, no time, no bytes.
  EXPECT_DOUBLE_EQ(fitShmByteFactor(1e-3, bytes, 1, c), 1.0);
  EXPECT_DOUBLE_EQ(fitShmByteFactor(0, bytes, 4, c), 1.0);
  EXPECT_DOUBLE_EQ(fitShmByteFactor(1e-3, 0, 4, c), 1.0);
}

TEST(Calibration, RanksThatOutnumberTheirCpusPayForEveryByteOnTheirHostInProportion) {
  MachineCosts idle = MachineCosts::defaults();
  idle.copySecondsPerByte = 1e-10;
  idle.reduceSecondsPerByte = 2e-10;
  idle.shmSyncSeconds = 3e-6;
  // 4 ranks on 2 CPUs: each byte copied, reduced or sent on the host costs
  // twice; nothing else changes.
  const MachineCosts shared = shareCores(idle, 4, 2);
  EXPECT_DOUBLE_EQ(shared.copySecondsPerByte, 2e-10);
  EXPECT_DOUBLE_EQ(shared.reduceSecondsPerByte, 4e-10);
  EXPECT_DOUBLE_EQ(shared.sameHost.betaSecondsPerByte, 2 * idle.sameHost.betaSecondsPerByte);
  EXPECT_DOUBLE_EQ(shared.shmSyncSeconds, 3e-6);
  EXPECT_DOUBLE_EQ(shared.sameHost.alphaSeconds, idle.sameHost.alphaSeconds);
  EXPECT_DOUBLE_EQ(shared.interHost.betaSecondsPerByte, idle.interHost.betaSecondsPerByte);
  // 3 ranks on 2 CPUs: 1.5 times.
  EXPECT_DOUBLE_EQ(shareCores(idle, 3, 2).copySecondsPerByte, 1.5e-10);
  // As many CPUs as ranks or more, or an unknown count: an idle core's cost.
  for (auto [ranks, cpus] : {std::pair{2, 2}, std::pair{2, 16}, std::pair{4, 0}}) {
    EXPECT_DOUBLE_EQ(shareCores(idle, ranks, cpus).copySecondsPerByte, 1e-10) << ranks << " ranks, " << cpus << " cpus";
    EXPECT_DOUBLE_EQ(shareCores(idle, ranks, cpus).reduceSecondsPerByte, 2e-10) << ranks << " ranks, " << cpus << " cpus";
  }
}

// A round costs max(floor, alpha + bytes x beta) plus the overhead: small
// messages pay the loaded round, large ones their transfer, never both.
// 4 hosts x 1 rank, 1 Gbit/s, ping alpha 14 us, floor 40 us: at 16 KiB
// halving-doubling's four rounds of 4..8 KiB beat recursive doubling's two
// of 16 KiB (as measured: 216 against 273 us); at 1 KiB rd wins.
TEST(CostModel, TheLoadedRoundFloorOverlapsTheTransfer) {
  MachineCosts c = MachineCosts::defaults();
  c.interHost = {14e-6, 8e-9, 40e-6};
  ModelSettings s;
  const double ov = s.roundOverheadSeconds, red = c.reduceSecondsPerByte;
  // Two hosts, rd is one round.
  CostModel two(TopologyView::uniform(2, 1), c, s);
  EXPECT_NEAR(*two.predict(Collective::kAllreduce, "rd", 8), 40e-6 + ov + 8 * red, 1e-12);
  EXPECT_NEAR(*two.predict(Collective::kAllreduce, "rd", 16384), 14e-6 + 16384 * 8e-9 + ov + 16384 * red, 1e-12);
  CostModel m(TopologyView::uniform(4, 1), c, s);
  auto at = [](const CostModel& model, const char* algo, size_t bytes) {
    return *model.predict(Collective::kAllreduce, algo, bytes);
  };
  EXPECT_LT(at(m, "hd", 16384), at(m, "rd", 16384));
  EXPECT_LT(at(m, "rd", 1024), at(m, "hd", 1024));
  // With alpha raised to the loaded round instead (the model before the
  // floor), rd looked cheaper at 16 KiB.
  MachineCosts raised = c;
  raised.interHost = {40e-6, 8e-9, 0};
  CostModel old(TopologyView::uniform(4, 1), raised, s);
  EXPECT_LT(at(old, "rd", 16384), at(old, "hd", 16384));
}

TEST(WaitPolicy, AutoYieldsOnlyWhenTheHostsRanksOutnumberItsCpus) {
  EXPECT_TRUE(decideWait("auto", 4, 2).yield);
  EXPECT_FALSE(decideWait("auto", 2, 2).yield);
  EXPECT_FALSE(decideWait("auto", 1, 1).yield);
  EXPECT_NE(decideWait("auto", 4, 2).why.find("ranks outnumber CPUs: 4 rank(s) on this host, 2 CPU(s)"),
            std::string::npos)
      << decideWait("auto", 4, 2).why;
  // Forcing wins either way.
  EXPECT_FALSE(decideWait("spin", 8, 2).yield);
  EXPECT_TRUE(decideWait("yield", 1, 64).yield);
  EXPECT_NE(decideWait("yield", 1, 64).why.find("GRADCOMM_WAIT=yield"), std::string::npos);
  EXPECT_GE(cpusAvailable(), 1);
}

TEST(CostModel, OneHostOfFourPrefersSharedMemoryAtEverySize) {
  CostModel m(TopologyView::uniform(1, 4), chosenCosts());
  for (size_t bytes = kSmall; bytes <= kLarge; bytes *= 4) {
    EXPECT_EQ(fastest(m, Collective::kAllreduce, bytes, kFlat), "shm") << bytes;
  }
}

// allreduce_shm.cpp's rounds, per rank: stage the (L-1)/L it does not own,
// reduce its slice from L operands ((L-1) passes over 1/L), copy the
// reduced slice (1/L) into its output, gather the (L-1)/L others reduced;
// three hand-offs a round of L x GRADCOMM_SHM_CHUNK bytes. Up to 16 KiB in
// one round: one hand-off, the whole input staged, L - 1 passes over all.
TEST(CostModel, SharedMemoryAllreducePricesEveryCopyOfItsRounds) {
  const MachineCosts c = chosenCosts();
  const ModelSettings s;
  CostModel m(TopologyView::uniform(1, 4), c, s);
  const double b = kLarge, l = 4;
  const double rounds = std::ceil(b / (l * static_cast<double>(s.shmChunkBytes)));
  EXPECT_NEAR(*m.predict(Collective::kAllreduce, "shm", kLarge),
              rounds * 3 * c.shmSyncSeconds + b * (7 / l) * c.copySecondsPerByte + b * (3 / l) * c.reduceSecondsPerByte,
              1e-12);
  const double d = 4096;
  EXPECT_NEAR(*m.predict(Collective::kAllreduce, "shm", 4096),
              c.shmSyncSeconds + d * c.copySecondsPerByte + 3 * d * c.reduceSecondsPerByte, 1e-12);

  // The calibrated byte factor prices the bytes of calls of several rounds
  // (data that streams through memory and another core's cache), not the
  // hand-offs, and not calls of one round (4 x 128 KiB here).
  MachineCosts slow = c;
  slow.shmByteFactor = 1.5;
  CostModel ms(TopologyView::uniform(1, 4), slow, s);
  EXPECT_NEAR(*ms.predict(Collective::kAllreduce, "shm", kLarge),
              rounds * 3 * c.shmSyncSeconds +
                  1.5 * (b * (7 / l) * c.copySecondsPerByte + b * (3 / l) * c.reduceSecondsPerByte),
              1e-12);
  EXPECT_NEAR(*ms.predict(Collective::kAllreduce, "shm", 4096), *m.predict(Collective::kAllreduce, "shm", 4096), 1e-15);
  const size_t oneRound = 4 * s.shmChunkBytes;
  EXPECT_NEAR(*ms.predict(Collective::kAllreduce, "shm", oneRound), *m.predict(Collective::kAllreduce, "shm", oneRound),
              1e-15);
  EXPECT_GT(*ms.predict(Collective::kAllreduce, "shm", 2 * oneRound), *m.predict(Collective::kAllreduce, "shm", 2 * oneRound));
  // The hierarchy's shared-memory phases alike: on 2x2 the difference is
  // half the factor's extra on the host part (2 copies and the reduce of
  // half the bytes, L = 2 owning one slice each).
  CostModel h(TopologyView::uniform(2, 2), c, s), hs(TopologyView::uniform(2, 2), slow, s);
  EXPECT_NEAR(*hs.predict(Collective::kAllreduce, "hier", kLarge) - *h.predict(Collective::kAllreduce, "hier", kLarge),
              0.5 * b * (2 * c.copySecondsPerByte + 0.5 * c.reduceSecondsPerByte), 1e-9);
  const size_t hostRound = 2 * s.shmChunkBytes;
  EXPECT_NEAR(*hs.predict(Collective::kAllreduce, "hier", hostRound), *h.predict(Collective::kAllreduce, "hier", hostRound),
              1e-15);
}

TEST(CostModel, FourHostsPreferRecursiveDoublingSmallAndHalvingDoublingInTheMiddle) {
  CostModel m(TopologyView::uniform(4, 1), chosenCosts());
  EXPECT_FALSE(m.predict(Collective::kAllreduce, "shm", kSmall)) << "shm cannot span hosts";
  EXPECT_EQ(fastest(m, Collective::kAllreduce, kSmall, kFlat), "rd");
  // At 1 Gbit/s rd's full-vector rounds lose to hd's halving by 32 KiB,
  // as measured on the emulated hosts.
  EXPECT_EQ(fastest(m, Collective::kAllreduce, 32 * 1024, kFlat), "hd");
  const std::string large = fastest(m, Collective::kAllreduce, kLarge, kFlat);
  EXPECT_TRUE(large == "ring" || large == "hd") << large;
  // Bandwidth-optimal algorithms move 2(p-1)/p of the vector; rd moves log2(p) vectors.
  EXPECT_LT(*m.predict(Collective::kAllreduce, "ring", kLarge), *m.predict(Collective::kAllreduce, "rd", kLarge) / 1.2);
  EXPECT_LT(*m.predict(Collective::kAllreduce, "ring", kLarge), *m.predict(Collective::kAllreduce, "tree", kLarge));
}

TEST(CostModel, TwoByTwoChargesSharedHostLinksAndFavoursHierarchicalWhenLarge) {
  const MachineCosts c = chosenCosts();
  CostModel m(TopologyView::uniform(2, 2), c);
  // rd's second round sends both ranks of each host across at once: the
  // two messages share the host's link. Too large to sign its messages, it
  // pays the engine's call check (one more round's software), as the ring
  // does.
  const double ov = ModelSettings{}.roundOverheadSeconds;
  const double rd = *m.predict(Collective::kAllreduce, "rd", kLarge);
  const double expectedRd = (c.sameHost.alphaSeconds + kLarge * c.sameHost.betaSecondsPerByte) +
                            (c.interHost.alphaSeconds + 2.0 * kLarge * c.interHost.betaSecondsPerByte) +
                            2.0 * kLarge * c.reduceSecondsPerByte + 2 * ov + ov;
  EXPECT_NEAR(rd, expectedRd, expectedRd * 1e-9);
  // The ring 0-1-2-3 crosses each host link once per step.
  const double ring = *m.predict(Collective::kAllreduce, "ring", kLarge);
  const double chunk = kLarge / 4.0;
  const double expectedRing = 6 * (c.interHost.alphaSeconds + chunk * c.interHost.betaSecondsPerByte) +
                              3 * chunk * c.reduceSecondsPerByte + 6 * ov + ov;
  EXPECT_NEAR(ring, expectedRing, expectedRing * 1e-9);
  // hier moves n/L per host per direction instead of 2(p-1)/p n.
  const double hier = *m.predict(Collective::kAllreduce, "hier", kLarge);
  EXPECT_LT(hier, ring);
  // At 8 B both sign their messages and pay one inter-host round; rd adds
  // a same-host message round, hier three shared-memory hand-offs, which
  // cost less (measured on 2x2 at 1 Gbit/s: hier at or below rd from 64 B,
  // level at 16 B). Among the flat algorithms rd stays the cheapest.
  const double b = kSmall;
  const double rdSmall = *m.predict(Collective::kAllreduce, "rd", kSmall);
  EXPECT_NEAR(rdSmall,
              (c.sameHost.alphaSeconds + b * c.sameHost.betaSecondsPerByte + ov) +
                  (c.interHost.alphaSeconds + 2 * b * c.interHost.betaSecondsPerByte + ov) +
                  2 * b * c.reduceSecondsPerByte,
              1e-12);
  // hier: shared-memory reduce-scatter and allgather around one rd round
  // on one slice (8 B is far below GRADCOMM_HIER_SLICE_MIN): each host's
  // first rank reduces its peer's part and exchanges the whole call.
  const double hierSmall = *m.predict(Collective::kAllreduce, "hier", kSmall);
  EXPECT_NEAR(hierSmall,
              3 * c.shmSyncSeconds + b * (2 * c.copySecondsPerByte + c.reduceSecondsPerByte) +
                  (c.interHost.alphaSeconds + b * c.interHost.betaSecondsPerByte + ov) + b * c.reduceSecondsPerByte,
              1e-12);
  EXPECT_LT(hierSmall, rdSmall);
  // With a slice per local rank (GRADCOMM_HIER_SLICE_MIN=0): slices of
  // b / 2, two sharing each host link.
  ModelSettings everyRank;
  everyRank.hierSliceMinBytes = 0;
  EXPECT_NEAR(*CostModel(TopologyView::uniform(2, 2), c, everyRank).predict(Collective::kAllreduce, "hier", kSmall),
              3 * c.shmSyncSeconds + b * (2 * c.copySecondsPerByte + 0.5 * c.reduceSecondsPerByte) +
                  (c.interHost.alphaSeconds + 2 * (b / 2) * c.interHost.betaSecondsPerByte + ov) +
                  (b / 2) * c.reduceSecondsPerByte,
              1e-12);
  EXPECT_EQ(fastest(m, Collective::kAllreduce, kSmall, kFlat), "rd");
}

// The inter-host link gap: each message of a round beyond the first on a
// host's link adds it, whatever the size. On 2x2, rd's round across hosts
// sends both ranks of each host across at once and pays it once; hier's
// small calls send one slice per host and do not; neither do 4 hosts of
// one rank, nor the ring 0-1-2-3.
TEST(CostModel, TheLinkGapChargesEveryFurtherMessageOnAHostsLinkAtAnySize) {
  const MachineCosts c = chosenCosts();
  MachineCosts gapped = c;
  gapped.interHost.gapSeconds = 10e-6;
  const auto at = [](const MachineCosts& costs, const TopologyView& v, const char* algo, size_t bytes,
                     ModelSettings s = {}) { return *CostModel(v, costs, s).predict(Collective::kAllreduce, algo, bytes); };
  const TopologyView twoByTwo = TopologyView::uniform(2, 2), fourByOne = TopologyView::uniform(4, 1);
  for (size_t bytes : {kSmall, size_t{4096}, kLarge}) {
    SCOPED_TRACE(bytes);
    EXPECT_NEAR(at(gapped, twoByTwo, "rd", bytes), at(c, twoByTwo, "rd", bytes) + 10e-6, 1e-12);
    EXPECT_NEAR(at(gapped, twoByTwo, "ring", bytes), at(c, twoByTwo, "ring", bytes), 1e-12);
    EXPECT_NEAR(at(gapped, fourByOne, "rd", bytes), at(c, fourByOne, "rd", bytes), 1e-12);
  }
  EXPECT_NEAR(at(gapped, twoByTwo, "hier", kSmall), at(c, twoByTwo, "hier", kSmall), 1e-12);
  // A slice per local rank (GRADCOMM_HIER_SLICE_MIN=0): two messages share
  // each host's link.
  ModelSettings everyRank;
  everyRank.hierSliceMinBytes = 0;
  EXPECT_NEAR(at(gapped, twoByTwo, "hier", kSmall, everyRank), at(c, twoByTwo, "hier", kSmall, everyRank) + 10e-6,
              1e-12);
  // Measured on 2x2 at 1 Gbit/s: rd 29..32 us at 4..1024 B, hier 22..23;
  // without the gap the model had them level (19.3 and 19.4 us).
  EXPECT_LT(at(gapped, twoByTwo, "hier", kSmall) + 9e-6, at(gapped, twoByTwo, "rd", kSmall));
}

TEST(Calibration, TheLinkGapIsTheAcrossRoundsExtraTimePerFurtherMessageAtMostARound) {
  EXPECT_NEAR(fitLinkGap(26e-6, 2, 14e-6), 12e-6, 1e-15);
  EXPECT_NEAR(fitLinkGap(26e-6, 3, 14e-6), 6e-6, 1e-15);
  // A further message costs at most a round of its own (here the across
  // round took ten times the leaders').
  EXPECT_NEAR(fitLinkGap(63e-6, 2, 6.5e-6), 6.5e-6, 1e-15);
  // Not slower, one rank per host, or no time: nothing to fit.
  EXPECT_EQ(fitLinkGap(14e-6, 2, 15e-6), 0.0);
  EXPECT_EQ(fitLinkGap(26e-6, 1, 14e-6), 0.0);
  EXPECT_EQ(fitLinkGap(26e-6, 2, 0.0), 0.0);
}

// Rounds come in bursts where ranks share cores: one long, then some that
// found their data waiting. The median of single rounds is the short ones'
// (measured on 2x2: 0 us where the rounds took 28 on average); windows of
// four average the bursts, and their median drops a stalled window.
TEST(Calibration, TheTypicalRoundAveragesBurstsAndDropsAStall) {
  const std::vector<double> bursts = {100e-6, 0, 0, 0, 120e-6, 0, 0, 0, 80e-6, 0, 0, 0, 100e-6, 0, 0, 0};
  EXPECT_NEAR(typicalRound(bursts), 25e-6, 1e-12);
  std::vector<double> stalled(16, 20e-6);
  stalled[5] = 0.1;
  EXPECT_NEAR(typicalRound(stalled), 20e-6, 1e-12);
  // Fewer rounds than a window: their median.
  EXPECT_NEAR(typicalRound({3e-6, 1e-6, 2e-6}), 2e-6, 1e-15);
}

TEST(CostModel, HalvingDoublingTakesTheDistancesWithinHostsFirst) {
  // Which distances (in core ranks) pair only ranks of one host: bit k
  // for distance 2^k.
  EXPECT_EQ(hdSameHostDistances(TopologyView::uniform(2, 2)), 1u << 0);
  EXPECT_EQ(hdSameHostDistances(TopologyView::uniform(2, 4)), (1u << 0) | (1u << 1));
  EXPECT_EQ(hdSameHostDistances(TopologyView::uniform(1, 4)), (1u << 0) | (1u << 1));
  EXPECT_EQ(hdSameHostDistances(TopologyView::uniform(4, 1)), 0u);
  EXPECT_EQ(hdSameHostDistances(TopologyView({0, 0, 0, 0, 4, 4, 6, 6})), 1u << 0);  // hosts of 4, 2, 2
  // 2 + 2 + 2 folds ranks 0 and 2 into 1 and 3: the core is ranks 1, 3, 4, 5.
  EXPECT_EQ(hdSameHostDistances(TopologyView::uniform(3, 2)), 0u);
  // Ranks round-robin over 2 hosts: partners 2 apart share a host.
  EXPECT_EQ(hdSameHostDistances(TopologyView({0, 1, 0, 1})), 1u << 1);
  // The order: same-host distances first, each group from the largest down.
  EXPECT_EQ(hdHalvingOrder(4, 0), (std::vector<int>{2, 1}));
  EXPECT_EQ(hdHalvingOrder(4, 1u << 0), (std::vector<int>{1, 2}));
  EXPECT_EQ(hdHalvingOrder(8, (1u << 0) | (1u << 1)), (std::vector<int>{2, 1, 4}));
  EXPECT_EQ(hdHalvingOrder(8, 1u << 0), (std::vector<int>{1, 4, 2}));
  EXPECT_EQ(hdHalvingOrder(8, (1u << 0) | (1u << 1) | (1u << 2)), (std::vector<int>{4, 2, 1}));
  EXPECT_EQ(hdHalvingOrder(1, 0), std::vector<int>{});
  // Large hosts: 2 x 64, every distance up to 32 inside a host, 64 across.
  EXPECT_EQ(hdSameHostDistances(TopologyView::uniform(2, 64)), 0x3Fu);
  EXPECT_EQ(hdHalvingOrder(128, 0x3F), (std::vector<int>{32, 16, 8, 4, 2, 1, 64}));
  // The model follows it: on 2x2 the first round (half the vector) stays on
  // the host, the second (a quarter) crosses, both ranks of a host at once.
  const MachineCosts c = chosenCosts();
  const double ov = ModelSettings{}.roundOverheadSeconds;
  const double n = kLarge;
  const double expected =
      2 * (c.sameHost.alphaSeconds + n / 2 * c.sameHost.betaSecondsPerByte + ov) +
      2 * (c.interHost.alphaSeconds + 2 * (n / 4) * c.interHost.betaSecondsPerByte + ov) +
      (n / 2 + n / 4) * c.reduceSecondsPerByte + ov;
  const double hd = *CostModel(TopologyView::uniform(2, 2), c).predict(Collective::kAllreduce, "hd", kLarge);
  EXPECT_NEAR(hd, expected, expected * 1e-9);
}

// The engine's call check costs one more message's software, except where
// the algorithm compares calls itself (shm, native) or signs its messages
// (rd up to the signed-payload limit; hier on equal hosts while its slices
// go by rd within that limit).
TEST(CostModel, TheCallCheckCostsAMessagesSoftwareWhereTheAlgorithmDoesNotCheckCallsItself) {
  CostModel m(TopologyView::uniform(2, 2), chosenCosts());
  const double ov = ModelSettings{}.roundOverheadSeconds;
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "rd", 8), 0.0);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "rd", transport::kSignedPayloadLimit), 0.0);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "rd", transport::kSignedPayloadLimit + 4), ov);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "native", 8), 0.0);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "shm", 8), 0.0);
  for (const char* algo : {"ring", "hd", "tree"}) {
    EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, algo, 8), ov) << algo;
  }
  // 2 ranks per host: calls under 64 KiB are one slice (slices of at
  // least GRADCOMM_HIER_SLICE_MIN, 32 KiB), by rd up to 16 KiB.
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "hier", 8), 0.0);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "hier", 16 * 1024), 0.0);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "hier", 16 * 1024 + 4), ov);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "hier", 64 * 1024), ov);  // 2 slices of 32 KiB: rings
  // A slice per local rank: halves of the call by rd up to 16 KiB.
  ModelSettings everyRank;
  everyRank.hierSliceMinBytes = 0;
  CostModel halves(TopologyView::uniform(2, 2), chosenCosts(), everyRank);
  EXPECT_EQ(halves.callCheckSeconds(Collective::kAllreduce, "hier", 32 * 1024), 0.0);
  EXPECT_EQ(halves.callCheckSeconds(Collective::kAllreduce, "hier", 32 * 1024 + 4), ov);
  EXPECT_EQ(m.callCheckSeconds(Collective::kAllreduce, "hier", 0), ov);
  EXPECT_EQ(m.callCheckSeconds(Collective::kBroadcast, "hier", 8), ov);
  // Hosts of different sizes sign where their slices pair once (2 and 3
  // ranks), not where two slices of a rank meet one owner (2, 2 and 4).
  CostModel twoAndThree(TopologyView({0, 0, 2, 2, 2}), chosenCosts());
  EXPECT_EQ(twoAndThree.callCheckSeconds(Collective::kAllreduce, "hier", 8), 0.0);
  EXPECT_EQ(twoAndThree.callCheckSeconds(Collective::kAllreduce, "hier", 0), ov);
  CostModel twoTwoFour(TopologyView({0, 0, 2, 2, 4, 4, 4, 4}), chosenCosts(), everyRank);
  EXPECT_EQ(twoTwoFour.callCheckSeconds(Collective::kAllreduce, "hier", 8), ov);
  // With one slice (the default at 8 B) every owner meets each other once.
  EXPECT_EQ(CostModel(TopologyView({0, 0, 2, 2, 4, 4, 4, 4}), chosenCosts()).callCheckSeconds(Collective::kAllreduce, "hier", 8), 0.0);
  EXPECT_EQ(m.callCheckSeconds(Collective::kBroadcast, "tree", 8), ov);
  EXPECT_EQ(m.callCheckSeconds(Collective::kBarrier, "dissemination", 0), ov);
  // One rank sends nothing.
  CostModel alone(TopologyView::uniform(1, 1), chosenCosts());
  EXPECT_EQ(alone.callCheckSeconds(Collective::kAllreduce, "ring", 8), 0.0);
}

// The hierarchy's exchange between hosts follows the algorithm's rule
// (hierExchangesByRd): up to hierRdSliceBytes a slice goes by recursive
// doubling (one round on 2 hosts, every local index's message sharing the
// host link), above it by a ring (2 (H - 1) steps of slice / H) and the
// engine's call check, except on two hosts, where recursive doubling sends
// the same bytes in one round.
TEST(CostModel, HierarchicalAllreducePricesRecursiveDoublingForSmallSlicesAndARingAboveThem) {
  const MachineCosts c = chosenCosts();
  ModelSettings s;
  s.hierRdSliceBytes = 1024;
  s.hierSliceMinBytes = 0;  // a slice per local rank
  CostModel m(TopologyView::uniform(2, 2), c, s);
  const double ov = s.roundOverheadSeconds;
  auto shmPart = [&](double bytes) {
    return 3 * c.shmSyncSeconds + bytes * (2 * c.copySecondsPerByte + 0.5 * c.reduceSecondsPerByte);
  };
  const double small = 2048, large = 4096;  // slices of 1 KiB and 2 KiB
  const double rdSmall = c.interHost.alphaSeconds + 2 * (small / 2) * c.interHost.betaSecondsPerByte + ov +
                         (small / 2) * c.reduceSecondsPerByte;
  // Signed below the limit: no call check.
  EXPECT_NEAR(*m.predict(Collective::kAllreduce, "hier", 2048), shmPart(small) + rdSmall, 1e-12);
  // Two hosts: recursive doubling above the limit too, and the call check.
  const double rdLarge = c.interHost.alphaSeconds + 2 * (large / 2) * c.interHost.betaSecondsPerByte + ov +
                         (large / 2) * c.reduceSecondsPerByte;
  EXPECT_NEAR(*m.predict(Collective::kAllreduce, "hier", 4096), shmPart(large) + rdLarge + ov, 1e-12);
  // Four hosts of two: a ring of 2 x 3 steps of slice / 4 above the limit.
  CostModel four(TopologyView::uniform(4, 2), c, s);
  const double chunk = large / 2 / 4;
  const double ringLarge = 6 * (c.interHost.alphaSeconds + 2 * chunk * c.interHost.betaSecondsPerByte + ov) +
                           3 * chunk * c.reduceSecondsPerByte;
  EXPECT_NEAR(*four.predict(Collective::kAllreduce, "hier", 4096), shmPart(large) + ringLarge + ov, 1e-12);
  EXPECT_TRUE(hierExchangesByRd(2048, 4, 1024) == false && hierExchangesByRd(1024, 4, 1024) &&
              hierExchangesByRd(size_t{1} << 30, 2, 1024) && !hierExchangesByRd(8, 2, 0));
}

TEST(CostModel, HierarchicalBroadcastAndAllgatherWinLargeOnTwoByTwo) {
  const MachineCosts c = chosenCosts();
  CostModel m(TopologyView::uniform(2, 2), c);
  // allgather of 64 MiB in all (16 MiB per rank): the flat ring crosses a
  // host link with one block in each of its 3 steps, hier sends each of the
  // host's 2 blocks across once, then copies the other local rank's half.
  const double block = kLarge / 4.0;
  const double expectedHier = (c.interHost.alphaSeconds + 2 * block * c.interHost.betaSecondsPerByte) +
                              ModelSettings{}.roundOverheadSeconds + c.shmSyncSeconds +
                              0.5 * kLarge * c.copySecondsPerByte + ModelSettings{}.roundOverheadSeconds;
  const double hier = *m.predict(Collective::kAllgather, "hier", kLarge);
  EXPECT_NEAR(hier, expectedHier, expectedHier * 1e-9);
  EXPECT_LT(hier, *m.predict(Collective::kAllgather, "ring", kLarge) / 1.3);
  // broadcast: the flat tree 0-1-2-3 crosses the host link once per
  // segment, as the two half-vector trees of hier do together: neither
  // wins by much (measured on 2 x 2 at 1 Gbit/s: within 7% of each other).
  const double tree = *m.predict(Collective::kBroadcast, "tree", kLarge);
  const double hierBroadcast = *m.predict(Collective::kBroadcast, "hier", kLarge);
  EXPECT_NEAR(tree, kLarge * c.interHost.betaSecondsPerByte, 0.05 * tree);
  EXPECT_NEAR(hierBroadcast, tree, 0.1 * tree);
  // On 4 hosts of 2 the flat tree's root host sends every segment to two
  // hosts; hier's 2 trees of half the vector put the same load on it.
  CostModel fourByTwo(TopologyView::uniform(4, 2), c);
  EXPECT_LT(*fourByTwo.predict(Collective::kBroadcast, "hier", kLarge),
            *fourByTwo.predict(Collective::kBroadcast, "tree", kLarge) * 1.1);
  // Neither exists on one host (the flat ones cover it) or on one rank per host.
  CostModel oneHost(TopologyView::uniform(1, 4), c);
  EXPECT_FALSE(oneHost.predict(Collective::kBroadcast, "hier", kLarge));
  EXPECT_FALSE(oneHost.predict(Collective::kAllgather, "hier", kLarge));
  CostModel flat(TopologyView::uniform(4, 1), c);
  EXPECT_FALSE(flat.predict(Collective::kBroadcast, "hier", kLarge));
  EXPECT_FALSE(flat.predict(Collective::kAllgather, "hier", kLarge));
}

TEST(CostModel, HierarchicalNeedsSeveralHostsOneWithSeveralRanksAndSharedMemoryNeedsOneHost) {
  CostModel uneven(TopologyView({0, 0, 0, 3, 3}), chosenCosts());
  EXPECT_TRUE(uneven.predict(Collective::kAllreduce, "hier", 1024));
  EXPECT_FALSE(uneven.predict(Collective::kAllreduce, "shm", 1024));
  EXPECT_TRUE(uneven.predict(Collective::kAllreduce, "ring", 1024));
  // hier cannot run on one host, nor with one rank per host (layoutProblem).
  EXPECT_FALSE(CostModel(TopologyView::uniform(1, 4), chosenCosts()).predict(Collective::kAllreduce, "hier", 1024));
  EXPECT_FALSE(CostModel(TopologyView::uniform(4, 1), chosenCosts()).predict(Collective::kAllreduce, "hier", 1024));
  CostModel twoByThree(TopologyView::uniform(2, 3), chosenCosts());
  EXPECT_TRUE(twoByThree.predict(Collective::kAllreduce, "hier", 1024));
  EXPECT_EQ(fastest(twoByThree, Collective::kAllreduce, kSmall, kFlat), "rd");
  const std::string large = fastest(twoByThree, Collective::kAllreduce, kLarge, kFlat);
  EXPECT_TRUE(large == "ring" || large == "hd") << large;
  EXPECT_FALSE(twoByThree.predict(Collective::kAllreduce, "bogus", 1024));
}

TEST(CostModel, HierarchicalSlicesPairTheirOwnersOnceWhereEveryTwoHostsCountsHaveALargeEnoughMultiple) {
  auto layout = [](std::vector<int> sizes) {
    std::vector<int> leaders;
    for (int n : sizes) {
      const int leader = static_cast<int>(leaders.size());
      for (int i = 0; i < n; ++i) leaders.push_back(leader);
    }
    return TopologyView(leaders);
  };
  for (auto sizes : std::vector<std::vector<int>>{{2, 2}, {1, 3}, {3, 1}, {2, 3}, {4, 2}, {4, 3}, {3, 3, 1}}) {
    EXPECT_TRUE(hierSlicesPairOnce(layout(sizes))) << ::testing::PrintToString(sizes);
  }
  // {2, 1, 3}: slices 0 and 2 both belong to the 2-rank host's first rank
  // and the lone rank; {2, 2, 4}, {1, 2, 3} and {3, 2, 1} alike.
  for (auto sizes : std::vector<std::vector<int>>{{2, 1, 3}, {2, 2, 4}, {1, 2, 3}, {3, 2, 1}}) {
    EXPECT_FALSE(hierSlicesPairOnce(layout(sizes))) << ::testing::PrintToString(sizes);
    EXPECT_FALSE(hierSignsMessages(layout(sizes), 4, 4, 16 * 1024, 256 * 1024, 0)) << ::testing::PrintToString(sizes);
  }
  // Counts of float32 (4 bytes), 16 KiB slices by rd, 256 KiB segments.
  auto signs = [&](std::vector<int> sizes, size_t count, size_t segment = 256 * 1024) {
    return hierSignsMessages(layout(sizes), count, 4, 16 * 1024, segment, 0);
  };
  EXPECT_TRUE(signs({2, 2}, 4));
  EXPECT_TRUE(signs({2, 2}, 8 * 1024));   // slices of 16 KiB
  EXPECT_FALSE(signs({2, 2}, 8 * 1024 + 2));  // slices go by ring
  EXPECT_FALSE(signs({2, 2}, 0));          // nothing between hosts: the engine checks
  EXPECT_TRUE(signs({1, 3}, 4));           // uneven, slices pair once
  EXPECT_TRUE(signs({2, 1, 2}, 4));
  EXPECT_FALSE(signs({1, 1}, 4));          // no hier at all
  // 64-byte segments: waves of 16 x 2 slices x 16 floats; a second wave
  // sends each pair a second message under the call's one tag.
  EXPECT_EQ(hierWaveElems(2, 64, 4), 512u);
  EXPECT_EQ(hierWaveElems(2, 1, 4), 32u);  // a segment below one element holds one
  EXPECT_TRUE(signs({2, 2, 2}, 512, 64));
  EXPECT_FALSE(signs({2, 2, 2}, 513, 64));
  // Calls of one slice (GRADCOMM_HIER_SLICE_MIN) pair each two owners once
  // on any layout: {2, 1, 3} signs its small calls, and calls of two slices
  // where every host has two ranks.
  EXPECT_TRUE(hierSignsMessages(layout({2, 1, 3}), 4, 4, 16 * 1024, 256 * 1024, 32 * 1024));
  EXPECT_TRUE(hierSignsMessages(layout({2, 2, 4}), 32, 4, 16 * 1024, 256 * 1024, 64));  // 2 slices of 64 B
  EXPECT_FALSE(hierSignsMessages(layout({2, 2, 4}), 48, 4, 16 * 1024, 256 * 1024, 64));  // 3: slices 0 and 2 meet twice
}

TEST(HierSlices, SmallCallsUseFewerSlicesThanRanksPerHost) {
  // float32, slices of at least 32 KiB (8192 elements).
  EXPECT_EQ(hierSlicesUsed(2, 0, 4, 32 * 1024), 1u);
  EXPECT_EQ(hierSlicesUsed(2, 1, 4, 32 * 1024), 1u);
  EXPECT_EQ(hierSlicesUsed(2, 16383, 4, 32 * 1024), 1u);
  EXPECT_EQ(hierSlicesUsed(2, 16384, 4, 32 * 1024), 2u);
  EXPECT_EQ(hierSlicesUsed(4, 3 * 8192, 4, 32 * 1024), 3u);
  EXPECT_EQ(hierSlicesUsed(4, size_t{1} << 30, 4, 32 * 1024), 4u);  // never more than the ranks per host
  EXPECT_EQ(hierSlicesUsed(4, 1, 4, 0), 4u);                         // 0: a slice per rank
  EXPECT_EQ(hierSlicesUsed(3, 5, 8, 2), 3u);  // a minimum below one element: one element each
  EXPECT_EQ(hierSlicesUsed(0, 5, 4, 0), 1u);
}

// Hosts of 1 and 3 ranks, term by term: 3 slices; the lone rank owns all
// three and exchanges each with one rank of the other host, so its host
// link carries 3 messages a round, and it handles them one after another
// (two more fixed costs a round); the 3-rank host's shared-memory phases
// (each rank reduces 2 peers' parts of its one slice) outlast the lone
// rank's copy of its input.
TEST(CostModel, HierarchicalAllreduceOnUnevenHostsPricesTheLargestHostAndTheSharedLink) {
  const MachineCosts c = chosenCosts();
  ModelSettings s;
  s.hierRdSliceBytes = 1024;
  s.hierSliceMinBytes = 0;  // a slice per rank of the 3-rank host
  CostModel m(TopologyView({0, 1, 1, 1}), c, s);
  const double ov = s.roundOverheadSeconds;
  auto shmPart = [&](double bytes) {
    return 3 * c.shmSyncSeconds + bytes * (2 * c.copySecondsPerByte + 2.0 / 3.0 * c.reduceSecondsPerByte);
  };
  const double small = 3 * 1024, large = 3 * 2048;  // slices of 1 KiB and 2 KiB
  const double serial = 2 * c.interHost.alphaSeconds;
  const double rdSmall = c.interHost.alphaSeconds + 3 * (small / 3) * c.interHost.betaSecondsPerByte + serial + ov +
                         (small / 3) * c.reduceSecondsPerByte;
  // Slices by rd sign their messages: no call check.
  EXPECT_NEAR(*m.predict(Collective::kAllreduce, "hier", 3 * 1024), shmPart(small) + rdSmall, 1e-12);
  // Two hosts: recursive doubling above the limit too (the same three
  // exchanges with whole slices), and the call check.
  const double rdLarge = c.interHost.alphaSeconds + 3 * (large / 3) * c.interHost.betaSecondsPerByte + serial + ov +
                         (large / 3) * c.reduceSecondsPerByte;
  EXPECT_NEAR(*m.predict(Collective::kAllreduce, "hier", 3 * 2048), shmPart(large) + rdLarge + ov, 1e-12);
  // Small calls: those three exchanges in a row cost more than flat rd's
  // two rounds; large ones: hier's host link carries n where the flat
  // ring's carries 1.5 n.
  EXPECT_LT(*m.predict(Collective::kAllreduce, "rd", kSmall), *m.predict(Collective::kAllreduce, "hier", kSmall));
  EXPECT_LT(*m.predict(Collective::kAllreduce, "hier", kLarge), *m.predict(Collective::kAllreduce, "ring", kLarge));
  // By default a small call is one slice: one exchange between the lone
  // rank and the other host's first rank, cheaper than rd's two rounds
  // (measured on 1 + 3 emulated hosts: 1.7x faster at 16 B..1 KiB).
  CostModel oneSlice(TopologyView({0, 1, 1, 1}), c);
  EXPECT_LT(*oneSlice.predict(Collective::kAllreduce, "hier", kSmall),
            *oneSlice.predict(Collective::kAllreduce, "rd", kSmall));
  // A host of one rank alone: its copy is the shared-memory phases' time
  // when it is the slowest (a free copy elsewhere would not be).
  MachineCosts slowCopy = c;
  slowCopy.reduceSecondsPerByte = 0;
  slowCopy.shmSyncSeconds = 0;
  CostModel flatCopy(TopologyView({0, 1, 1, 1}), slowCopy, s);
  EXPECT_NEAR(*flatCopy.predict(Collective::kAllreduce, "hier", 3 * 1024),
              small * 2 * c.copySecondsPerByte + c.interHost.alphaSeconds +
                  3 * (small / 3) * c.interHost.betaSecondsPerByte + serial + ov,
              1e-12);
}

TEST(CostModel, PredictionsGrowWithSizeForEveryModelledAlgorithm) {
  for (auto layout : {TopologyView::uniform(1, 4), TopologyView::uniform(4, 1), TopologyView::uniform(2, 2),
                      TopologyView::uniform(2, 3)}) {
    CostModel m(layout, chosenCosts());
    for (int c = 0; c < kNumCollectives; ++c) {
      const auto coll = static_cast<Collective>(c);
      for (const auto& name : CostModel::modelled(coll)) {
        double last = -1;
        for (size_t bytes = kSmall; bytes <= kLarge; bytes *= 4) {
          auto t = m.predict(coll, name, bytes);
          if (!t) continue;
          EXPECT_GT(*t, 0) << toString(coll) << "/" << name << " " << layout.describe();
          EXPECT_GE(*t, last) << toString(coll) << "/" << name << " at " << bytes << " on " << layout.describe();
          last = *t;
        }
      }
    }
  }
}

TEST(CostModel, NativeIsNeverPredictedFasterThanOurOwn) {
  CostModel m(TopologyView::uniform(4, 1), chosenCosts());
  for (size_t bytes = kSmall; bytes <= kLarge; bytes *= 4) {
    EXPECT_GT(*m.predict(Collective::kAllreduce, "native", bytes),
              std::min(*m.predict(Collective::kAllreduce, "ring", bytes), *m.predict(Collective::kAllreduce, "rd", bytes)));
  }
}

TEST(TuningFile, ParsesEntriesAndFormatsThemBack) {
  const std::string text =
      "# measured\n"
      "layout 2x2\n"
      "allreduce 0-16K rd   # latency\n"
      "\n"
      "allreduce 16K-inf ring\n"
      "broadcast 0-1M tree\n";
  auto t = TuningTable::parse(text, "tune.txt");
  EXPECT_EQ(t.layout, "2x2");
  ASSERT_EQ(t.entries.size(), 3u);
  EXPECT_EQ(t.entries[1].lo, 16u * 1024);
  EXPECT_EQ(t.entries[1].hi, SIZE_MAX);
  EXPECT_EQ(t.entries[1].line, 5);
  EXPECT_EQ(t.find(Collective::kAllreduce, 16 * 1024 - 1)->algorithm, "rd");
  EXPECT_EQ(t.find(Collective::kAllreduce, 16 * 1024)->algorithm, "ring");
  EXPECT_EQ(t.find(Collective::kAllgather, 10), nullptr);
  auto again = TuningTable::parse(t.format(), "again");
  ASSERT_EQ(again.entries.size(), 3u);
  EXPECT_EQ(again.layout, "2x2");
  EXPECT_EQ(again.entries[2].algorithm, "tree");
  EXPECT_EQ(again.entries[2].hi, 1u << 20);
}

TEST(TuningFile, BadLinesAreConfigErrorsNamingTheLine) {
  auto failsWith = [](const std::string& text, const std::string& needle) {
    try {
      TuningTable::parse(text, "tune.txt");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  failsWith("allreduce 0-16K rd\nallreduce 16K ring\n", "tune.txt line 2: size range '16K' is not LO-HI");
  failsWith("allreduce 0-16K\n", "tune.txt line 1: expected 'COLLECTIVE LO-HI ALGORITHM'");
  failsWith("# x\ngather 0-1K ring\n", "tune.txt line 2: 'gather' is not a collective");
  failsWith("allreduce 64K-1K ring\n", "line 1: size range '64K-1K' is empty");
  failsWith("allreduce 1Q-2K ring\n", "line 1: size range '1Q-2K'");
  failsWith("layout four\n", "line 1: layout 'four' is not HxL");
}

TEST(TuningFile, UnknownAlgorithmIsAConfigErrorNamingTheLine) {
  algorithms::Selector sel("auto", algorithms::DefaultRule{});
  auto table = std::make_shared<TuningTable>(TuningTable::parse("allreduce 0-1K rd\nallgather 0-1K hd\n", "t.txt"));
  CostModel m(TopologyView::uniform(4, 1), chosenCosts());
  try {
    sel.useModel(std::make_shared<CostModel>(m), table);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.txt line 2: 'hd' is not a allgather algorithm; valid: ring"),
              std::string::npos)
        << e.what();
  }
}

TEST(CalibrationFile, RoundTripsAndRejectsMalformedLines) {
  const MachineCosts c = chosenCosts();
  std::string layout;
  auto back = parseCalibration(formatCalibration(c, "2x2"), "cal.txt", &layout);
  EXPECT_EQ(layout, "2x2");
  EXPECT_DOUBLE_EQ(back.interHost.betaSecondsPerByte, c.interHost.betaSecondsPerByte);
  EXPECT_DOUBLE_EQ(back.sameHost.alphaSeconds, c.sameHost.alphaSeconds);
  EXPECT_DOUBLE_EQ(back.interHost.roundFloorSeconds, c.interHost.roundFloorSeconds);
  MachineCosts gap = c;
  gap.interHost.gapSeconds = 9.5e-6;
  EXPECT_DOUBLE_EQ(parseCalibration(formatCalibration(gap, "2x2"), "cal.txt", nullptr).interHost.gapSeconds, 9.5e-6);
  EXPECT_DOUBLE_EQ(back.shmSyncSeconds, c.shmSyncSeconds);
  EXPECT_EQ(back.source, "file");
  MachineCosts factor = c;
  factor.shmByteFactor = 1.37;
  EXPECT_DOUBLE_EQ(parseCalibration(formatCalibration(factor, "1x4"), "cal.txt", nullptr).shmByteFactor, 1.37);
  // Files written before the factor existed have no line for it: 1.
  const std::string old = "same_host 1e-6 1e-10\ninter_host 1e-5 1e-9\ncopy 1e-10\nreduce 1e-10\nshm_sync 1e-6\n";
  EXPECT_DOUBLE_EQ(parseCalibration(old, "cal.txt", nullptr).shmByteFactor, 1.0);
  // ... nor a floor or a link gap: none.
  EXPECT_EQ(parseCalibration(old, "cal.txt", nullptr).interHost.gapSeconds, 0.0);
  EXPECT_EQ(parseCalibration(old, "cal.txt", nullptr).interHost.roundFloorSeconds, 0.0);
  auto failsWith = [](const std::string& text, const std::string& needle) {
    try {
      parseCalibration(text, "cal.txt", nullptr);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  failsWith("same_host 1e-6\n", "cal.txt line 1: 'same_host' takes 2 or 3 values (alpha, beta, loaded round floor), got 1");
  failsWith("same_host 1e-6 1e-10 1e-5 1\n", "takes 2 or 3 values");
  // The link gap is inter-host only.
  failsWith("inter_host 1e-6 1e-10 1e-5 1e-5 1e-5\n",
            "cal.txt line 1: 'inter_host' takes 2 to 4 values (alpha, beta, loaded round floor, link gap), got 5");
  failsWith("inter_host 1e-6 1e-10 1e-5 2\n", "cal.txt line 1: '2' is not a time in seconds");
  failsWith("layout 1x1\nsame_host 1e-6 fast\n", "cal.txt line 2: 'fast' is not a time in seconds");
  failsWith("bandwidth 3\n", "cal.txt line 1: unknown key 'bandwidth'");
  failsWith("shm_bytes 40\n", "cal.txt line 1: '40' is not a shared-memory byte factor between 0.25 and 16");
  failsWith("shm_bytes x2\n", "'x2' is not a shared-memory byte factor");
  failsWith("shm_bytes 1 2\n", "'shm_bytes' takes 1 value(s), got 2");
  failsWith("same_host 1e-6 1e-10\ninter_host 1e-5 1e-9\ncopy 1e-10\nreduce 1e-10\n", "no 'shm_sync' line");
}

TEST(CalibrationMode, ParsesOffRunAndPath) {
  EXPECT_EQ(CalibrationMode::parse("0").kind, CalibrationMode::Kind::kOff);
  EXPECT_EQ(CalibrationMode::parse("1").kind, CalibrationMode::Kind::kRun);
  auto f = CalibrationMode::parse(" /tmp/cal.txt ");
  EXPECT_EQ(f.kind, CalibrationMode::Kind::kFile);
  EXPECT_EQ(f.path, "/tmp/cal.txt");
  EXPECT_THROW(CalibrationMode::parse(""), ConfigError);
}

TEST(CalibrationMode, LocalCostsArePositive) {
  const MachineCosts c = measureLocalCosts();
  EXPECT_GT(c.copySecondsPerByte, 0);
  EXPECT_GT(c.reduceSecondsPerByte, 0);
}

TEST(StaticModel, ConstantsFollowTheHardwareAndNothingElse) {
  // A pure function: the same facts give the same numbers, bit for bit.
  const MachineCosts a = MachineCosts::forHardware(4, 2, 1e9), b = MachineCosts::forHardware(4, 2, 1e9);
  EXPECT_EQ(a.describe(), b.describe());
  EXPECT_EQ(a.source, "static");
  // The NIC's speed sets the inter-host bandwidth (payload about 0.95 of it);
  // unknown: 10 Gbit/s.
  EXPECT_NEAR(1 / MachineCosts::forHardware(1, 2, 1e9).interHost.betaSecondsPerByte, 0.95 * 1e9 / 8, 1);
  EXPECT_NEAR(1 / MachineCosts::forHardware(1, 2, 0).interHost.betaSecondsPerByte, 0.95 * 10e9 / 8, 1);
  // Ranks that share cores pay for every byte on the host in proportion,
  // and a round waits for a core; with a core each, neither.
  const MachineCosts own = MachineCosts::forHardware(2, 2, 0), shared = MachineCosts::forHardware(4, 2, 0);
  EXPECT_DOUBLE_EQ(shared.copySecondsPerByte, 2 * own.copySecondsPerByte);
  EXPECT_DOUBLE_EQ(shared.reduceSecondsPerByte, 2 * own.reduceSecondsPerByte);
  EXPECT_DOUBLE_EQ(shared.sameHost.betaSecondsPerByte, 2 * own.sameHost.betaSecondsPerByte);
  EXPECT_EQ(own.sameHost.roundFloorSeconds, 0.0);
  EXPECT_GT(shared.sameHost.roundFloorSeconds, shared.sameHost.alphaSeconds);
  EXPECT_GT(shared.shmSyncSeconds, own.shmSyncSeconds);
}

TEST(StaticModel, TheChoiceIsAFunctionOfTheAgreedInputs) {
  // Two selectors built apart from the same layout and hardware facts choose
  // the same algorithm for every collective and size.
  for (auto [hosts, perHost] : {std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 2}, std::pair{4, 1}}) {
    auto world = transport::InProcWorld::create(hosts * perHost, [&] {
      transport::InProcWorld::Settings s;
      s.ranksPerHost = perHost;
      return s;
    }());
    auto t = world->transport(0);
    auto build = [&] {
      auto sel = std::make_shared<algorithms::Selector>("auto", algorithms::DefaultRule{});
      sel->useModel(std::make_shared<CostModel>(detect(world->hostLayout(0)),
                                                MachineCosts::forHardware(perHost, 2, 1e9)));
      return sel;
    };
    const auto first = build(), second = build();
    const TopologyView view = detect(world->hostLayout(0));
    for (size_t bytes = 8; bytes <= (64u << 20); bytes *= 2) {
      const auto one = first->select(allreduce(bytes), {*t, view}, "");
      const auto two = second->select(allreduce(bytes), {*t, view}, "");
      EXPECT_STREQ(one.algorithm->name(), two.algorithm->name()) << hosts << "x" << perHost << " " << bytes << " B";
      EXPECT_EQ(one.why, two.why);
    }
  }
}

TEST(Selector, ModelChoosesByLayoutAndExplainsWhy) {
  transport::InProcWorld::Settings fourHosts;
  fourHosts.ranksPerHost = 1;
  auto world = transport::InProcWorld::create(4, fourHosts);
  auto t = world->transport(0);
  algorithms::Selector sel("auto", algorithms::DefaultRule{});
  sel.useModel(std::make_shared<CostModel>(detect(world->hostLayout(0)), chosenCosts()));
  auto small = sel.select(allreduce(64), {*t, topology::detect(world->hostLayout(0))}, "");
  EXPECT_STREQ(small.algorithm->name(), "rd");
  EXPECT_EQ(small.why.rfind("cost model (test): rd ", 0), 0u) << small.why;
  EXPECT_NE(small.why.find(" < "), std::string::npos) << small.why;
  auto mid = sel.select(allreduce(32 * 1024), {*t, topology::detect(world->hostLayout(0))}, "");
  EXPECT_STREQ(mid.algorithm->name(), "hd") << mid.why;
  auto ranked = sel.predictions(allreduce(kLarge), {*t, topology::detect(world->hostLayout(0))});
  ASSERT_GE(ranked.size(), 3u);
  for (size_t i = 1; i < ranked.size(); ++i) EXPECT_LE(ranked[i - 1].seconds, ranked[i].seconds);
  for (const auto& p : ranked) EXPECT_STRNE(p.algorithm->name(), "shm");  // cannot run across hosts

  auto local = transport::InProcWorld::create(4);
  auto lt = local->transport(0);
  algorithms::Selector one("auto", algorithms::DefaultRule{});
  one.useModel(std::make_shared<CostModel>(detect(local->hostLayout(0)), chosenCosts()));
  EXPECT_STREQ(one.select(allreduce(64), {*lt, topology::detect(local->hostLayout(0))}, "").algorithm->name(), "shm");
  EXPECT_STREQ(one.select(allreduce(kLarge), {*lt, topology::detect(local->hostLayout(0))}, "").algorithm->name(), "shm");
}

TEST(Selector, PrecedenceIsForcedThenRulesThenTuningFileThenModel) {
  transport::InProcWorld::Settings fourHosts;
  fourHosts.ranksPerHost = 1;
  auto world = transport::InProcWorld::create(4, fourHosts);
  auto t = world->transport(0);
  auto model = std::make_shared<CostModel>(detect(world->hostLayout(0)), chosenCosts());
  auto tuning = std::make_shared<TuningTable>(
      TuningTable::parse("allreduce 0-1M tree\nallreduce 1M-inf shm\n", "tune.txt"));

  algorithms::Selector sel("allreduce:0-1K:ring", algorithms::DefaultRule{});
  sel.useModel(model, tuning);
  // A GRADCOMM_ALGO rule beats the tuning file.
  auto ruled = sel.select(allreduce(512), {*t, topology::detect(world->hostLayout(0))}, "");
  EXPECT_STREQ(ruled.algorithm->name(), "ring");
  EXPECT_NE(ruled.why.find("GRADCOMM_ALGO"), std::string::npos) << ruled.why;
  // The per-call option beats the rule.
  EXPECT_STREQ(sel.select(allreduce(512), {*t, topology::detect(world->hostLayout(0))}, "hd").algorithm->name(), "hd");
  // The tuning file beats the model (which picks rd at 4 KiB).
  auto tuned = sel.select(allreduce(4096), {*t, topology::detect(world->hostLayout(0))}, "");
  EXPECT_STREQ(tuned.algorithm->name(), "tree");
  EXPECT_NE(tuned.why.find("tuning file tune.txt line 1"), std::string::npos) << tuned.why;
  // An entry that cannot run here leaves the call to the model, and says so.
  auto fallback = sel.select(allreduce(kLarge), {*t, topology::detect(world->hostLayout(0))}, "");
  EXPECT_STRNE(fallback.algorithm->name(), "shm");
  EXPECT_NE(fallback.why.find("cost model"), std::string::npos) << fallback.why;
  EXPECT_NE(fallback.why.find("'shm' (line 2) cannot run"), std::string::npos) << fallback.why;
  // Without the tuning file the model decides.
  algorithms::Selector plain("auto", algorithms::DefaultRule{});
  plain.useModel(model);
  EXPECT_STREQ(plain.select(allreduce(4096), {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "rd");
}

// 2 x 2: hier small (one signed rd round between hosts beside shared-memory
// hand-offs, where rd adds a same-host message round); large, hier or hd,
// the two that carry n per host link (hd takes its same-host distance
// first), priced within 1% of each other, against the flat ring's 1.5 n.
// Hosts of 1 and 3 ranks: hier small too (one slice: the lone rank's one
// exchange with the other host's first rank, against rd's two rounds),
// hier large (n per host link where the flat ring's carries 1.5 n).
TEST(Selector, TwoHostsOfTwoChooseHierarchicalAllreduces) {
  ASSERT_NE(algorithms::findAlgorithm(Collective::kAllreduce, "hier"), nullptr);
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, std::vector<int>{1, 3}}) {
    transport::InProcWorld::Settings layout;
    layout.hostSizes = sizes;
    auto world = transport::InProcWorld::create(4, layout);
    auto t = world->transport(0);
    const auto view = topology::detect(world->hostLayout(0));
    algorithms::Selector sel("auto", algorithms::DefaultRule{});
    sel.useModel(std::make_shared<CostModel>(view, chosenCosts()));
    auto small = sel.select(allreduce(kSmall), {*t, view}, "");
    EXPECT_STREQ(small.algorithm->name(), "hier") << small.why;
    auto large = sel.select(allreduce(kLarge), {*t, view}, "");
    const std::string chosen = large.algorithm->name();
    if (sizes[0] == 2) {
      EXPECT_TRUE(chosen == "hier" || chosen == "hd") << large.why;
      const CostModel m(view, chosenCosts());
      const double hier = *m.predict(Collective::kAllreduce, "hier", kLarge);
      const double hd = *m.predict(Collective::kAllreduce, "hd", kLarge);
      EXPECT_NEAR(hier / hd, 1.0, 0.01);
      EXPECT_GT(*m.predict(Collective::kAllreduce, "ring", kLarge), 1.3 * std::min(hier, hd));
    } else {
      EXPECT_EQ(chosen, "hier") << large.why;
    }
    EXPECT_EQ(large.why.rfind("cost model (test): " + chosen + " ", 0), 0u) << large.why;
  }
}

// Every layout the tests run (one host, even hosts, uneven hosts) is named
// in one word, and calibration and tuning files give back what they were
// written with.
TEST(LayoutName, EveryLayoutRoundTripsThroughCalibrationAndTuningFiles) {
  using topology::TopologyView;
  const std::vector<std::pair<std::vector<int>, std::string>> layouts = {
      {{0, 0, 0, 0}, "1x4"},    {{0}, "1x1"},         {{0, 1, 2, 3}, "4x1"},
      {{0, 0, 2, 2}, "2x2"},    {{0, 0, 0, 3, 3, 3}, "2x3"}, {{0, 1, 1, 1}, "1+3"},
      {{0, 0, 2, 3, 3, 3}, "2+1+3"}, {{0, 0, 0, 3}, "3+1"}};
  for (const auto& [leaders, name] : layouts) {
    SCOPED_TRACE(name);
    const TopologyView view(leaders);
    EXPECT_EQ(topology::layoutName(view), name);
    EXPECT_TRUE(topology::isLayoutName(name));

    std::string read;
    topology::parseCalibration(topology::formatCalibration(topology::MachineCosts::defaults(), name), "test", &read);
    EXPECT_EQ(read, name);

    topology::TuningTable t;
    t.layout = name;
    topology::TuningEntry e;
    e.algorithm = "tree";
    t.entries.push_back(e);
    const auto back = topology::TuningTable::parse(t.format(), "test");
    EXPECT_EQ(back.layout, name);
    EXPECT_EQ(back.format(), t.format());
  }
  for (const char* bad : {"", "x", "2x", "x2", "1+", "+1", "1++2", "3", "0x2", "a+b", "2x2x2", "1+0"}) {
    EXPECT_FALSE(topology::isLayoutName(bad)) << "'" << bad << "'";
    try {
      topology::TuningTable::parse(std::string("layout ") + bad + "\n", "test");
      if (*bad) ADD_FAILURE() << "'" << bad << "' was taken for a layout";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("test line 1"), std::string::npos) << e.what();
    }
  }
}
