// Pure checks of the index patterns and of every planner's output, with no
// transport: plans are race-free on every rank, and every send has exactly
// one matching receive of the same size on its peer.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "algorithms/catalog.hpp"
#include "algorithms/hier_phases.hpp"
#include "algorithms/patterns/binomial_tree.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/selector.hpp"
#include "base/algo_rules.hpp"
#include "gradcomm/error.hpp"
#include "support/plan_hazards.hpp"
#include "topology/calibration.hpp"
#include "topology/cost_model.hpp"
#include "transport/inproc_transport.hpp"

using namespace gradcomm;
using namespace gradcomm::algorithms;
using gradcomm::testing::findHazard;

TEST(Patterns, PartitionCoversTheRangeWithBalancedChunks) {
  for (size_t count : {0, 1, 2, 5, 7, 100, 101}) {
    for (size_t parts : {1, 2, 3, 7, 8}) {
      patterns::Partition p{count, parts};
      size_t next = 0;
      for (size_t i = 0; i < parts; ++i) {
        EXPECT_EQ(p.offsetOf(i), next);
        EXPECT_LE(p.sizeOf(i), count / parts + 1);
        EXPECT_GE(p.sizeOf(i), count / parts);
        next += p.sizeOf(i);
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(Patterns, SegmentsCoverTheRange) {
  for (size_t count : {0, 1, 9, 10, 11, 1000}) {
    patterns::Segments s{count, 10};
    size_t total = 0;
    for (size_t i = 0; i < s.number(); ++i) {
      EXPECT_EQ(s.offsetOf(i), total);
      EXPECT_GT(s.sizeOf(i), 0u);
      total += s.sizeOf(i);
    }
    EXPECT_EQ(total, count);
  }
}

TEST(Patterns, BinomialTreeIsATreeForEveryRootAndSize) {
  for (int size = 1; size <= 13; ++size) {
    for (int root = 0; root < size; ++root) {
      std::map<int, int> parentOf;
      for (int r = 0; r < size; ++r) {
        auto t = patterns::binomialTree(r, size, root);
        EXPECT_EQ(t.parent < 0, r == root);
        for (int c : t.children) {
          EXPECT_FALSE(parentOf.count(c)) << "rank " << c << " has two parents";
          parentOf[c] = r;
          auto ct = patterns::binomialTree(c, size, root);
          EXPECT_EQ(ct.parent, r);
        }
      }
      EXPECT_EQ(parentOf.size(), static_cast<size_t>(size - 1));
    }
  }
}

TEST(Patterns, FoldMapsOntoAPowerOfTwoCore) {
  for (int size = 1; size <= 17; ++size) {
    std::set<int> core;
    for (int r = 0; r < size; ++r) {
      auto f = patterns::fold(r, size);
      EXPECT_EQ(f.p2 & (f.p2 - 1), 0);
      EXPECT_LE(f.p2, size);
      EXPECT_GT(2 * f.p2, size);
      if (f.newRank >= 0) {
        EXPECT_TRUE(core.insert(f.newRank).second);
        EXPECT_EQ(patterns::unfold(f.newRank, f), r);
      }
    }
    EXPECT_EQ(core.size(), static_cast<size_t>(patterns::floorPowerOfTwo(size)));
  }
}

namespace {

struct PlanCase {
  const PlannedAlgorithm* algo;
  Collective coll;
};

std::vector<PlanCase> plannedAlgorithms() {
  std::vector<PlanCase> out;
  for (const Algorithm* a : allAlgorithms()) {
    if (auto p = dynamic_cast<const PlannedAlgorithm*>(a)) out.push_back({p, a->collective()});
  }
  return out;
}

CollectiveCall makeCall(Collective coll, size_t count, bool inPlace, ReduceOp op, int root) {
  CollectiveCall c;
  c.collective = coll;
  c.type = DataType::kFloat32;
  c.op = op;
  c.count = count;
  c.root = root;
  c.inPlace = inPlace;
  return c;
}

long long inputShift(Collective coll, int rank, size_t count) {
  if (coll == Collective::kAllgather) return static_cast<long long>(rank) * static_cast<long long>(count);
  if (coll == Collective::kReduceScatter) return -static_cast<long long>(rank) * static_cast<long long>(count);
  return 0;
}

/// (sender, receiver, message index) -> elements.
using Messages = std::map<std::tuple<int, int, uint32_t>, size_t>;

/// Adds rank r's sends and receives to `sends` and `recvs`; fails on a send
/// to itself or a message index used twice between the same two ranks.
void recordMessages(const Plan& plan, int r, Messages* sends, Messages* recvs) {
  for (const Step& s : plan.steps) {
    if (s.kind == StepKind::kSend) {
      ASSERT_NE(s.peer, r);
      auto key = std::make_tuple(r, s.peer, s.message);
      ASSERT_FALSE(sends->count(key)) << "duplicate message id " << s.message;
      (*sends)[key] = s.a.count;
    } else if (s.kind == StepKind::kRecv) {
      auto key = std::make_tuple(s.peer, r, s.message);
      ASSERT_FALSE(recvs->count(key)) << "duplicate message id " << s.message;
      (*recvs)[key] = s.dst.count;
    }
  }
}

}  // namespace

TEST(Plans, EveryPlannerIsRaceFreeAndItsMessagesPairUp) {
  Tuning tuning;
  tuning.segmentBytes = 16;  // 4 floats per segment: many segments
  tuning.exchangeSegmentBytes = 16;
  tuning.pipelineDepth = 2;
  for (const auto& pc : plannedAlgorithms()) {
    for (int size = 1; size <= 9; ++size) {
      for (size_t count : {size_t{1}, size_t{2}, static_cast<size_t>(size), static_cast<size_t>(size + 1), size_t{37}, size_t{70}}) {
        for (bool inPlace : {false, true}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            const int root = size > 2 ? 2 : 0;
            auto call = makeCall(pc.coll, count, inPlace, op, root);
            Messages sends, recvs;
            for (int r = 0; r < size; ++r) {
              SCOPED_TRACE(std::string(toString(pc.coll)) + "/" + pc.algo->name() + " size=" + std::to_string(size) +
                           " count=" + std::to_string(count) + " rank=" + std::to_string(r) +
                           (inPlace ? " in-place" : "") + " op=" + toString(op));
              Plan plan = pc.algo->plan(call, r, size, tuning);
              std::string hazard = findHazard(plan, inPlace, inputShift(pc.coll, r, count));
              ASSERT_EQ(hazard, "");
              ASSERT_NO_FATAL_FAILURE(recordMessages(plan, r, &sends, &recvs));
            }
            ASSERT_EQ(sends, recvs) << toString(pc.coll) << "/" << pc.algo->name() << " size=" << size
                                    << " count=" << count;
          }
        }
      }
    }
  }
}

// The plans between hosts of the hierarchical algorithms, for every rank of
// equal, unequal and round-robin layouts: race-free, and every send has
// exactly one receive of the same size on its peer (the slices' rings and
// trees on one pair of ranks never reuse a message index).
TEST(Plans, HierInterHostPlansAreRaceFreeAndTheirMessagesPairUp) {
  // allreduce: rings between hosts (no slice small enough for rd) and
  // recursive doubling (every slice small enough); a slice per rank of the
  // largest host, or fewer where slices would be under 8 bytes.
  for (size_t rdSlice : {size_t{0}, size_t{1} << 20})
  for (size_t sliceMin : {size_t{0}, size_t{8}}) {
    SCOPED_TRACE("hierRdSliceBytes " + std::to_string(rdSlice) + " hierSliceMinBytes " + std::to_string(sliceMin));
    Tuning tuning;
    tuning.segmentBytes = 16;
    tuning.exchangeSegmentBytes = 16;
    tuning.pipelineDepth = 2;
    tuning.hierRdSliceBytes = rdSlice;
    tuning.hierSliceMinBytes = sliceMin;
    struct Layout {
      std::vector<int> sizes;
      std::vector<int> hostOfRank;
    };
    for (const Layout& layout : {Layout{{2, 2}, {}}, Layout{{2, 3}, {}}, Layout{{3, 2}, {}}, Layout{{1, 3}, {}},
                                 Layout{{2, 1, 3}, {}}, Layout{{2, 2, 2}, {}}, Layout{{4, 4}, {}},
                                 Layout{{3, 2}, {0, 1, 0, 1, 0}}}) {
      transport::InProcWorld::Settings settings;
      settings.hostSizes = layout.sizes;
      settings.hostOfRank = layout.hostOfRank;
      int size = 0;
      for (int n : layout.sizes) size += n;
      auto world = transport::InProcWorld::create(size, settings);
      std::vector<hier::Layout> ranks;
      for (int r = 0; r < size; ++r) ranks.push_back(hier::Layout::of(topology::detect(world->hostLayout(r)), r));
      for (Collective coll : {Collective::kAllreduce, Collective::kBroadcast, Collective::kAllgather}) {
        for (size_t count : {size_t{1}, size_t{2}, static_cast<size_t>(size + 1), size_t{37}, size_t{70}}) {
          for (int root : {0, size - 1}) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
              if (coll != Collective::kAllreduce && op == ReduceOp::kAvg) continue;
              const bool inPlace = coll != Collective::kAllgather || root == 0;
              auto call = makeCall(coll, count, inPlace, op, root);
              Messages sends, recvs;
              for (int r = 0; r < size; ++r) {
                SCOPED_TRACE(std::string(toString(coll)) + " hosts=" + std::to_string(layout.sizes.size()) +
                             " size=" + std::to_string(size) + " count=" + std::to_string(count) + " root=" +
                             std::to_string(root) + " rank=" + std::to_string(r) + " op=" + toString(op));
                const auto& l = ranks[static_cast<size_t>(r)];
                Plan plan = coll == Collective::kAllreduce   ? hier::allreduceInterHostPlan(call, l, tuning)
                            : coll == Collective::kBroadcast ? hier::broadcastInterHostPlan(call, l, tuning)
                                                             : hier::allgatherInterHostPlan(call, l);
                // allreduce and broadcast run in place in the output.
                ASSERT_EQ(findHazard(plan, inPlace, inputShift(coll, r, count)), "");
                for (const Step& s : plan.steps) {
                  if (s.kind == StepKind::kSend) {
                    ASSERT_NE(ranks[static_cast<size_t>(s.peer)].host, l.host) << "a message inside a host";
                  }
                }
                ASSERT_NO_FATAL_FAILURE(recordMessages(plan, r, &sends, &recvs));
              }
              ASSERT_EQ(sends, recvs) << toString(coll) << " size=" << size << " count=" << count;
              ASSERT_FALSE(sends.empty());
            }
          }
        }
      }
    }
  }
}

// Small hierarchical allreduces sign their messages (one tag for all of a
// call's messages) only where no two of a rank's messages go to the same
// peer. topology::hierSlicesPairOnce decides that from the host sizes; the
// plans must agree with it on every layout of 2 to 4 hosts of 1 to 4 ranks
// (both ways: where it says no, some pair of ranks does exchange twice).
TEST(Plans, HierSlicesPairTheirOwnersOnceExactlyWhereTheTopologySaysSo) {
  Tuning tuning;  // slices of 8 bytes go by recursive doubling
  tuning.hierSliceMinBytes = 0;  // a slice per rank of the largest host
  int signedLayouts = 0, unsignedLayouts = 0;
  std::vector<int> sizes;
  std::function<void(int)> each = [&](int hostsLeft) {
    if (sizes.size() >= 2) {
      std::vector<int> leaders;
      for (int n : sizes) {
        const int leader = static_cast<int>(leaders.size());
        for (int i = 0; i < n; ++i) leaders.push_back(leader);
      }
      const topology::TopologyView view(leaders);
      const int size = view.size();
      if (view.maxRanksPerHost() >= 2) {
        const auto call = makeCall(Collective::kAllreduce, 2 * static_cast<size_t>(view.maxRanksPerHost()), true,
                                   ReduceOp::kSum, 0);
        std::map<std::pair<int, int>, int> perPair;
        for (int r = 0; r < size; ++r) {
          for (const Step& st : hier::allreduceInterHostPlan(call, hier::Layout::of(view, r), tuning).steps) {
            if (st.kind == StepKind::kSend) ++perPair[{r, st.peer}];
          }
        }
        int most = 0;
        for (const auto& [pair, n] : perPair) most = std::max(most, n);
        const bool once = topology::hierSlicesPairOnce(view);
        EXPECT_EQ(most <= 1, once) << "hosts " << ::testing::PrintToString(sizes) << ": " << most
                                   << " messages between one pair";
        ++(once ? signedLayouts : unsignedLayouts);
      }
    }
    if (hostsLeft == 0) return;
    for (int n = 1; n <= 4; ++n) {
      sizes.push_back(n);
      each(hostsLeft - 1);
      sizes.pop_back();
    }
  };
  each(4);
  // Both kinds occur among the layouts enumerated.
  EXPECT_GT(signedLayouts, 10);
  EXPECT_GT(unsignedLayouts, 10);
}

// The hierarchy's exchange between hosts: slices of at most
// hierRdSliceBytes go by recursive doubling (log2 H rounds, one message per
// round), larger ones by a ring (2(H - 1) steps), except on 2 hosts, where
// recursive doubling sends the same bytes in one round at any size. 2 and
// 4 hosts of 2 ranks, 64 float32 (slices of 128 bytes).
TEST(Plans, HierExchangesSmallSlicesByRecursiveDoublingAndLargeOnesByARing) {
  for (int hosts : {2, 4}) {
    transport::InProcWorld::Settings settings;
    settings.hostSizes = std::vector<int>(static_cast<size_t>(hosts), 2);
    auto world = transport::InProcWorld::create(2 * hosts, settings);
    const auto l = hier::Layout::of(topology::detect(world->hostLayout(1)), 1);
    auto sendsOf = [&](size_t rdSliceBytes) {
      Tuning tuning;
      tuning.hierRdSliceBytes = rdSliceBytes;
      tuning.hierSliceMinBytes = 0;  // a slice per local rank, however small
      const auto call = makeCall(Collective::kAllreduce, 64, true, ReduceOp::kSum, 0);
      const Plan plan = hier::allreduceInterHostPlan(call, l, tuning);
      return std::count_if(plan.steps.begin(), plan.steps.end(),
                           [](const Step& s) { return s.kind == StepKind::kSend; });
    };
    const int log2Hosts = hosts == 2 ? 1 : 2;
    EXPECT_EQ(sendsOf(Tuning{}.hierRdSliceBytes), log2Hosts) << hosts << " hosts, default";
    EXPECT_EQ(sendsOf(128), log2Hosts) << hosts << " hosts, slice at the limit";
    EXPECT_EQ(sendsOf(124), hosts == 2 ? 1 : 2 * (hosts - 1)) << hosts << " hosts, slice above the limit";
    EXPECT_EQ(sendsOf(0), 2 * (hosts - 1)) << hosts << " hosts, GRADCOMM_HIER_RD_SIZE=0: always rings";
  }
}

// Calls smaller than a slice per local rank of GRADCOMM_HIER_SLICE_MIN
// bytes use fewer slices: on 2 hosts of 4 ranks, local rank j exchanges
// between hosts only where slice j is in use.
TEST(Plans, SmallHierCallsExchangeBetweenHostsFromTheFirstLocalRanksOnly) {
  transport::InProcWorld::Settings settings;
  settings.hostSizes = {4, 4};
  auto world = transport::InProcWorld::create(8, settings);
  auto sendsOf = [&](int rank, size_t count, size_t sliceMin) {
    const auto l = hier::Layout::of(topology::detect(world->hostLayout(rank)), rank);
    Tuning tuning;
    tuning.hierSliceMinBytes = sliceMin;
    const Plan plan = hier::allreduceInterHostPlan(makeCall(Collective::kAllreduce, count, true, ReduceOp::kSum, 0), l, tuning);
    return std::count_if(plan.steps.begin(), plan.steps.end(), [](const Step& s) { return s.kind == StepKind::kSend; });
  };
  // float32: 64 elements = 256 bytes.
  for (int rank : {0, 4}) {
    EXPECT_EQ(sendsOf(rank, 64, Tuning{}.hierSliceMinBytes), 1) << "rank " << rank << ", default";
    EXPECT_EQ(sendsOf(rank, 64, 0), 1) << "rank " << rank;
  }
  for (int rank : {1, 2, 3, 5, 6, 7}) {
    EXPECT_EQ(sendsOf(rank, 64, Tuning{}.hierSliceMinBytes), 0) << "rank " << rank << ", default: one slice";
    EXPECT_EQ(sendsOf(rank, 64, 0), 1) << "rank " << rank << ": a slice per local rank";
  }
  // Slices of at least 64 bytes: 64 elements (256 bytes) make 4, one per
  // local rank; 63 (252 bytes) make 3, on local ranks 0..2.
  EXPECT_EQ(sendsOf(3, 64, 64), 1);
  EXPECT_EQ(sendsOf(3, 63, 64), 0);
  EXPECT_EQ(sendsOf(2, 63, 64), 1);
}

// Ring and halving-doubling cut their exchanges by the exchange segment (the
// communicator puts GRADCOMM_NET_SEGMENT_SIZE there when it spans hosts),
// tree-shaped plans by the pipeline segment; each alone, so that a planner
// reading the wrong one fails here.
TEST(Plans, RingAndHalvingDoublingCutByTheExchangeSegmentTreesByThePipelineSegment) {
  Tuning tuning;
  tuning.segmentBytes = 16;          // 4 float32
  tuning.exchangeSegmentBytes = 64;  // 16 float32
  tuning.pipelineDepth = 2;
  struct Case {
    const Algorithm* algo;
    size_t expected;  // largest message, in elements
  };
  const Case cases[] = {{&ringAllreduce(), 16},     {&halvingDoublingAllreduce(), 16}, {&ringReduceScatter(), 16},
                        {&ringAllgather(), 16},     {&treeAllreduce(), 4},             {&treeBroadcast(), 4},
                        {&treeReduce(), 4}};
  const int p = 4;
  for (const Case& c : cases) {
    auto planned = dynamic_cast<const PlannedAlgorithm*>(c.algo);
    ASSERT_NE(planned, nullptr) << c.algo->name();
    auto call = makeCall(c.algo->collective(), 400, false, ReduceOp::kSum, 0);
    for (int r = 0; r < p; ++r) {
      Plan plan = planned->plan(call, r, p, tuning);
      size_t largest = 0;  // sent or received
      for (const Step& s : plan.steps) {
        if (s.kind == StepKind::kSend) largest = std::max(largest, s.a.count);
        if (s.kind == StepKind::kRecv) largest = std::max(largest, s.dst.count);
      }
      EXPECT_EQ(largest, c.expected) << toString(c.algo->collective()) << "/" << c.algo->name() << " rank " << r;
    }
  }
}

// A large exchange segment must not give a small call receive slots of the
// segment's size: the slots are as big as the largest piece of the data.
TEST(Plans, ReceiveSlotsOfRingAndHalvingDoublingAreNoLargerThanTheData) {
  Tuning tuning;
  tuning.exchangeSegmentBytes = size_t{64} << 20;  // 16 Mi float32
  tuning.pipelineDepth = 4;
  for (const Algorithm* algo : {&ringAllreduce(), &halvingDoublingAllreduce(), &ringReduceScatter()}) {
    auto planned = dynamic_cast<const PlannedAlgorithm*>(algo);
    ASSERT_NE(planned, nullptr);
    for (int p : {2, 3, 4, 5}) {
      for (size_t count : {size_t{1}, size_t{8}, size_t{1000}}) {
        auto call = makeCall(algo->collective(), count, false, ReduceOp::kSum, 0);
        for (int r = 0; r < p; ++r) {
          Plan plan = planned->plan(call, r, p, tuning);
          // Reduce-scatter's count is per rank; the others' is the whole vector.
          EXPECT_LE(plan.scratchCount, 4 * count)
              << toString(algo->collective()) << "/" << algo->name() << " p=" << p << " count=" << count << " rank " << r;
        }
      }
    }
  }
}

TEST(Plans, HazardCheckerFindsAMissingDependency) {
  // A receive into the region a send still reads, with no ordering.
  PlanBuilder b;
  b.send(1, out(0, 4), 0);
  b.recv(1, out(2, 4), 1);
  EXPECT_NE(findHazard(b.finish(), false), "");
  PlanBuilder ok;
  auto s = ok.send(1, out(0, 4), 0);
  ok.recv(1, out(2, 4), 1, {s});
  EXPECT_EQ(findHazard(ok.finish(), false), "");
  // Input and output alias only when in place.
  PlanBuilder alias;
  alias.send(1, in(0, 4), 0);
  alias.recv(1, out(0, 4), 1);
  auto plan = alias.finish();
  EXPECT_EQ(findHazard(plan, false), "");
  EXPECT_NE(findHazard(plan, true), "");
}

TEST(Selector, DefaultRuleUsesSharedMemoryWhenEveryRankIsLocal) {
  auto world = transport::InProcWorld::create(4);
  auto t = world->transport(0);
  Selector sel("auto", DefaultRule{16 * 1024, 0});
  auto call = makeCall(Collective::kAllreduce, 100, false, ReduceOp::kSum, 0);
  EXPECT_STREQ(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "shm");
  call.count = 1 << 20;
  EXPECT_STREQ(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "shm");
  transport::InProcWorld::Settings twoHosts;
  twoHosts.ranksPerHost = 2;
  auto split = transport::InProcWorld::create(4, twoHosts);
  auto t2 = split->transport(0);
  EXPECT_STREQ(sel.select(call, {*t2, topology::detect(split->hostLayout(0))}, "").algorithm->name(), "ring");
  auto forced = sel.select(call, {*t2, topology::detect(split->hostLayout(0))}, "shm");
  EXPECT_STREQ(forced.algorithm->name(), "ring");
  EXPECT_NE(forced.note.find("the ranks span several hosts"), std::string::npos) << forced.note;
}

TEST(Selector, DefaultRuleUsesRecursiveDoublingForSmallAndRingForLarge) {
  transport::InProcWorld::Settings noShm;
  noShm.shmChunkBytes = 0;
  auto world = transport::InProcWorld::create(4, noShm);
  auto t = world->transport(0);
  Selector sel("auto", DefaultRule{16 * 1024, 0});
  auto call = makeCall(Collective::kAllreduce, 100, false, ReduceOp::kSum, 0);
  EXPECT_STREQ(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "rd");
  call.count = 1 << 20;
  EXPECT_STREQ(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "ring");
  auto bc = makeCall(Collective::kBroadcast, 10, false, ReduceOp::kSum, 1);
  EXPECT_STREQ(sel.select(bc, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "tree");
}

TEST(Selector, RulesMatchCollectiveAndSizeRangeInOrder) {
  auto world = transport::InProcWorld::create(4);
  auto t = world->transport(0);
  Selector sel("allreduce:0-64K:tree, allreduce:hd, ring", DefaultRule{});
  auto call = makeCall(Collective::kAllreduce, 1000, false, ReduceOp::kSum, 0);  // 4000 bytes
  EXPECT_STREQ(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "tree");
  call.count = 1 << 20;
  EXPECT_STREQ(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "hd");
  auto ag = makeCall(Collective::kAllgather, 10, false, ReduceOp::kSum, 0);
  EXPECT_STREQ(sel.select(ag, {*t, topology::detect(world->hostLayout(0))}, "").algorithm->name(), "ring");
  EXPECT_STREQ(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "rd").algorithm->name(), "rd");  // per-call beats rules
}

TEST(Selector, UnknownNamesAreConfigErrorsListingValidNames) {
  try {
    Selector bad("allreduce:rign", DefaultRule{});
    FAIL();
  } catch (const ConfigError& e) {
    // "native" (MPI's own collective) only in a build with MPI.
    const std::string valid = GRADCOMM_HAVE_MPI ? "valid: ring, rd, hd, tree, shm, hier, native"
                                                : "valid: ring, rd, hd, tree, shm, hier";
    EXPECT_NE(std::string(e.what()).find(valid), std::string::npos) << e.what();
  }
  EXPECT_THROW(Selector("frobnicate", DefaultRule{}), ConfigError);
  EXPECT_THROW(Selector("allreduce:64K-1K:ring", DefaultRule{}), ConfigError);
  EXPECT_THROW(Selector("gather:ring", DefaultRule{}), ConfigError);
  auto world = transport::InProcWorld::create(2);
  auto t = world->transport(0);
  Selector sel("auto", DefaultRule{});
  auto call = makeCall(Collective::kAllreduce, 10, false, ReduceOp::kSum, 0);
  EXPECT_THROW(sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "bogus"), InvalidArgument);
}

// GRADCOMM_ALGO is checked in src/base (below the algorithms) against a
// list of names; it must name exactly the registered algorithms, in order.
TEST(AlgorithmRegistry, NamesEqualTheListThatGradcommAlgoIsCheckedAgainst) {
  for (int c = 0; c < kNumCollectives; ++c) {
    const auto coll = static_cast<Collective>(c);
    std::vector<std::string> registered;
    for (const Algorithm* a : allAlgorithms()) {
      // Without MPI, "native" stays registered (a per-call request for it
      // falls back loudly) but GRADCOMM_ALGO does not accept it.
      if (a->collective() == coll && (GRADCOMM_HAVE_MPI || std::string(a->name()) != "native")) {
        registered.push_back(a->name());
      }
    }
    EXPECT_EQ(registered, core::algorithmNamesOf(coll)) << toString(coll);
  }
}

TEST(Selector, HierIsForcedOnlyAndSaysWhyItCannotRun) {
  auto call = makeCall(Collective::kAllreduce, 1 << 20, false, ReduceOp::kSum, 0);
  Selector sel("auto", DefaultRule{16 * 1024, 0});
  auto pick = [&](transport::InProcWorld::Settings s, int size, const char* forced) {
    auto world = transport::InProcWorld::create(size, s);
    auto t = world->transport(0);
    return sel.select(call, {*t, topology::detect(world->hostLayout(0))}, forced);
  };
  transport::InProcWorld::Settings twoByTwo;
  twoByTwo.hostSizes = {2, 2};
  EXPECT_STREQ(pick(twoByTwo, 4, "hier").algorithm->name(), "hier");
  EXPECT_STREQ(pick(twoByTwo, 4, "").algorithm->name(), "ring");  // never chosen by default
  struct Case {
    const char* what;
    std::vector<int> hosts;
    size_t shmChunk;
    const char* reason;
  };
  for (const Case& c : {Case{"one host", {4}, 4096, "all ranks share one host"},
                        Case{"one rank per host", {1, 1, 1}, 4096, "every host has one rank"},
                        Case{"no shared memory", {2, 2}, 0, "no shared memory"},
                        Case{"a chunk below 8 bytes per slice", {2, 3}, 16, "chunk is too small"}}) {
    transport::InProcWorld::Settings s;
    s.hostSizes = c.hosts;
    s.shmChunkBytes = c.shmChunk;
    int size = 0;
    for (int n : c.hosts) size += n;
    auto choice = pick(s, size, "hier");
    EXPECT_STRNE(choice.algorithm->name(), "hier") << c.what;
    EXPECT_NE(choice.note.find("cannot run this call"), std::string::npos) << c.what << ": " << choice.note;
    EXPECT_NE(choice.note.find(c.reason), std::string::npos) << c.what << ": " << choice.note;
  }
}

TEST(InProcWorld, HostSizesMustCoverTheWorld) {
  transport::InProcWorld::Settings s;
  s.hostSizes = {2, 2};
  EXPECT_THROW(transport::InProcWorld::create(5, s), InvalidArgument);
  s.hostSizes = {3, 0, 2};
  EXPECT_THROW(transport::InProcWorld::create(5, s), InvalidArgument);
  s.hostSizes = {1, 3};
  auto world = transport::InProcWorld::create(4, s);
  EXPECT_EQ(world->hosts()[static_cast<size_t>(world->hostOf(2))], (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(world->hostLayout(0).hosts, (std::vector<std::vector<int>>{{0}, {1, 2, 3}}));
  EXPECT_EQ(world->transport(0)->sharedMemory(), nullptr);  // alone on its host
  transport::InProcWorld::Settings roundRobin;
  roundRobin.hostOfRank = {0, 1, 0};
  EXPECT_THROW(transport::InProcWorld::create(4, roundRobin), InvalidArgument);
  auto rr = transport::InProcWorld::create(3, roundRobin);
  EXPECT_EQ(rr->hosts()[static_cast<size_t>(rr->hostOf(2))], (std::vector<int>{0, 2}));
  EXPECT_EQ(rr->hostLayout(1).hosts, (std::vector<std::vector<int>>{{0, 2}, {1}}));
}

TEST(Selector, NativeFallsBackLoudlyWithoutMpi) {
  if (!GRADCOMM_HAVE_MPI) GTEST_SKIP() << "built without MPI: GRADCOMM_ALGO=native is a ConfigError (next test)";
  auto world = transport::InProcWorld::create(2);
  auto t = world->transport(0);
  Selector sel("native", DefaultRule{});
  auto call = makeCall(Collective::kAllreduce, 10, false, ReduceOp::kSum, 0);
  auto choice = sel.select(call, {*t, topology::detect(world->hostLayout(0))}, "");
  EXPECT_STREQ(choice.algorithm->name(), "shm");  // the default for two local ranks
  EXPECT_NE(choice.note.find("cannot run this call"), std::string::npos) << choice.note;
}

// A build without MPI cannot run MPI's own collectives: GRADCOMM_ALGO=native
// is refused when the configuration is read, saying why.
TEST(Selector, NativeIsNoGradcommAlgoChoiceInABuildWithoutMpi) {
  if (GRADCOMM_HAVE_MPI) {
    EXPECT_NO_THROW(Selector("native", DefaultRule{}));
    return;
  }
  for (const char* spec : {"native", "allreduce:native", "0-4K:native"}) {
    try {
      Selector sel(spec, DefaultRule{});
      ADD_FAILURE() << "GRADCOMM_ALGO=" << spec << " was accepted in a build without MPI";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("built without MPI"), std::string::npos) << e.what();
    }
  }
}

// What a stalled shared-memory step reports in a timeout: the awaited peer
// by its rank in the whole group, and the step it has not done.
TEST(ShmStall, NamesTheAwaitedPeerByItsGroupRankOrSaysRunning) {
  const std::vector<int> ranks{4, 9};
  const size_t stride = transport::ShmGroup::strideFor(4096);
  std::vector<char> memory(2 * stride + 4096);
  char* base = memory.data() + (4096 - reinterpret_cast<uintptr_t>(memory.data()) % 4096) % 4096;
  transport::ShmGroup g(ranks, 0, 4096, base, nullptr);
  hier::ShmStall stall;
  EXPECT_EQ(stall.describe(&g), "running");
  EXPECT_FALSE(stall.set(1, "stage its data"));  // the step did not move
  EXPECT_EQ(stall.describe(&g), "waiting for rank 9 to stage its data");
  EXPECT_EQ(stall.describe(nullptr), "running");
  stall.rank = -1;
  EXPECT_EQ(stall.describe(&g), "running");
}
