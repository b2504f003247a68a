// Communicators split from one another: light groups over one context
// (transport, progress engine, cost model), with their own ranks and tags.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>

#include "support/collective_check.hpp"
#include "support/inproc.hpp"
#include "support/per_rank.hpp"
#include "core/host_control.hpp"
#include "transport/group_transport.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

std::vector<int> allgatherRanks(Communicator& c, int value) {
  std::vector<int32_t> out(static_cast<size_t>(c.size()));
  int32_t mine = value;
  c.allgather(&mine, out.data(), 1, DataType::kInt32).wait();
  return std::vector<int>(out.begin(), out.end());
}


}  // namespace

TEST(Split, GroupsNumberTheirRanksByKeyAndReduceOverTheirMembersOnly) {
  runRanks(4, [](RankContext& ctx) {
    // Evens and odds; the key reverses each group's order.
    Communicator half = ctx.comm.split(ctx.rank % 2, -ctx.rank);
    ASSERT_TRUE(half.valid());
    EXPECT_EQ(half.size(), 2);
    EXPECT_EQ(half.rank(), ctx.rank < 2 ? 1 : 0);
    // Rank i of the group is the world rank the key put i-th.
    const std::vector<int> members = allgatherRanks(half, ctx.rank);
    const std::vector<int> want = ctx.rank % 2 ? std::vector<int>{3, 1} : std::vector<int>{2, 0};
    EXPECT_EQ(members, want);
    // Parent and group calls interleave; each sums over its own ranks.
    for (int round = 0; round < 20; ++round) {
      double w = ctx.rank + round, h = 10.0 * ctx.rank + round;
      ctx.comm.allreduce(&w, &w, 1, DataType::kFloat64, ReduceOp::kSum);
      half.allreduce(&h, &h, 1, DataType::kFloat64, ReduceOp::kSum).wait();
      ctx.comm.barrier().wait();
      EXPECT_EQ(w, 6.0 + 4 * round);
      EXPECT_EQ(h, (ctx.rank % 2 ? 40.0 : 20.0) + 2 * round);
    }
    // A broadcast from group rank 0 (world rank 3 or 2).
    int32_t v = ctx.rank * 100;
    half.broadcast(&v, &v, 1, DataType::kInt32, 0).wait();
    EXPECT_EQ(v, (ctx.rank % 2 ? 3 : 2) * 100);
  }, quick());
}

TEST(Split, EveryAlgorithmRunsCorrectlyOnADuplicate) {
  runRanks(3, [](RankContext& ctx) {
    Communicator copy = ctx.comm.dup();
    EXPECT_EQ(copy.rank(), ctx.rank);
    EXPECT_EQ(copy.size(), 3);
    int cases = 0;
    EXPECT_EQ(checkEveryAlgorithm(copy, &cases), "");
    EXPECT_GT(cases, 100);
  }, quick());
}

TEST(Split, SplitOfASplitAndNegativeColors) {
  runRanks(6, [](RankContext& ctx) {
    // Ranks 0..3 in one group, 4 and 5 in none.
    Communicator four = ctx.comm.split(ctx.rank < 4 ? 7 : -1, ctx.rank);
    if (ctx.rank >= 4) {
      EXPECT_FALSE(four.valid());
      return;
    }
    ASSERT_EQ(four.size(), 4);
    Communicator pair = four.split(four.rank() / 2, four.rank());
    ASSERT_EQ(pair.size(), 2);
    EXPECT_EQ(allgatherRanks(pair, ctx.rank), ctx.rank < 2 ? std::vector<int>({0, 1}) : std::vector<int>({2, 3}));
    // subgroup of the world, formed by its members only.
    if (ctx.rank == 1 || ctx.rank == 3) {
      Communicator odd = ctx.comm.subgroup({3, 1});
      EXPECT_EQ(odd.rank(), ctx.rank == 3 ? 0 : 1);
      EXPECT_EQ(allgatherRanks(odd, ctx.rank), std::vector<int>({3, 1}));
    }
  }, quick());
}

TEST(Split, GroupsOutliveTheCommunicatorTheyCameFrom) {
  runRanks(2, [](RankContext& ctx) {
    Communicator copy = ctx.comm.dup();
    ctx.comm.destroy();
    float x = 1.0f + static_cast<float>(ctx.rank);
    copy.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum).wait();
    EXPECT_EQ(x, 3.0f);
    EXPECT_THROW(ctx.comm.barrier(), InvalidUsage);
  }, quick());
}

TEST(Split, GroupIdsAreReusedOnceGroupsAreDestroyed) {
  // More groups than ids over a job's life: each destroyed group's id
  // returns, so forming never runs out while few are alive at once.
  runRanks(2, [](RankContext& ctx) {
    for (int i = 0; i < 1500; ++i) {
      Communicator g = ctx.comm.dup();
      if (i % 250 == 0) {
        int32_t x = 1;
        g.allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum).wait();
        EXPECT_EQ(x, 2);
      }
    }
  }, quick());
}

TEST(Split, HundredsOfGroupsAliveAtOnceKeepTheirMessagesApart) {
  runRanks(2, [](RankContext& ctx) {
    std::vector<Communicator> groups;
    for (int i = 0; i < 300; ++i) groups.push_back(ctx.comm.dup());
    // Issue on every group, then wait: each result is its own group's.
    std::vector<int32_t> x(groups.size());
    std::vector<Work> works;
    for (size_t i = 0; i < groups.size(); ++i) {
      x[i] = static_cast<int32_t>(i) * (ctx.rank + 1);
      works.push_back(groups[i].allreduce(&x[i], &x[i], 1, DataType::kInt32, ReduceOp::kSum));
    }
    for (auto& w : works) w.wait();
    for (size_t i = 0; i < groups.size(); ++i) EXPECT_EQ(x[i], static_cast<int32_t>(3 * i));
  }, quick());
}

TEST(Split, ABadListFailsOnTheRankThatPassedItAndTheOthersHearWhy) {
  for (const auto& [list, words] : std::vector<std::pair<std::vector<int>, std::string>>{
           {{}, "is empty"}, {{0, 0, 1}, "listed twice"}, {{0, 5}, "not a rank of this communicator"}}) {
    std::vector<std::string> what(2);
    runRanks(2, [&](RankContext& ctx) {
      try {
        ctx.comm.subgroup(ctx.rank == 0 ? list : std::vector<int>{0, 1});
      } catch (const Error& e) {
        what[static_cast<size_t>(ctx.rank)] = e.what();
      }
    }, quick());
    EXPECT_TRUE(contains(what[0], words)) << what[0];
    EXPECT_TRUE(contains(what[1], "rank 0")) << what[1];
  }
  std::string what;
  runRanks(2, [&](RankContext& ctx) {
    if (ctx.rank == 1) return;
    try {
      ctx.comm.subgroup({1});
    } catch (const InvalidArgument& e) {
      what = e.what();
    }
  }, quick());
  EXPECT_TRUE(contains(what, "is not in the list")) << what;
}

TEST(Split, MembersThatListTheGroupDifferentlyFailOnEveryMember) {
  std::vector<std::string> what(2);
  runRanks(2, [&](RankContext& ctx) {
    try {
      ctx.comm.subgroup(ctx.rank == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0});
    } catch (const Error& e) {
      what[static_cast<size_t>(ctx.rank)] = e.what();
    }
  }, quick());
  for (const auto& w : what) EXPECT_TRUE(contains(w, "subgroup")) << w;
}

TEST(Split, AGroupsMessagesMatchOnlyReceivesOfTheSameGroup) {
  // Two groups over one transport, the same tag in both: a receive of group
  // 2 posted first must get group 2's message, not the one sent first.
  auto world = transport::InProcWorld::create(2);
  auto base0 = world->transport(0), base1 = world->transport(1);
  transport::GroupTransport a0(*base0, {0, 1}, 1), b0(*base0, {0, 1}, 2);
  transport::GroupTransport a1(*base1, {1, 0}, 1), b1(*base1, {1, 0}, 2);
  EXPECT_EQ(a1.rank(), 0);
  EXPECT_EQ(a1.baseRank(1), 0);
  transport::Tag tag;
  tag.seq = 3;
  tag.fingerprint = 9;
  const int32_t sentA = 111, sentB = 222;
  int32_t gotA = 0, gotB = 0;
  auto sa = a0.isend(1, &sentA, 4, tag);  // to group rank 1 = base rank 1
  auto sb = b0.isend(1, &sentB, 4, tag);
  auto rb = b1.irecv(1, &gotB, 4, tag);  // from group rank 1 = base rank 0
  auto ra = a1.irecv(1, &gotA, 4, tag);
  for (int i = 0; i < 1000 && !(sa->test() & sb->test() & rb->test() & ra->test()); ++i) std::this_thread::yield();
  EXPECT_EQ(gotB, 222);
  EXPECT_EQ(gotA, 111);
}

TEST(Split, GroupsOfWholeHostsShareTheHostsMemoryAndStayInStepWithTheirParent) {
  transport::InProcWorld::Settings two;
  two.hostSizes = {2, 2};
  runRanks(4, [](RankContext& ctx) {
    Communicator copy = ctx.comm.dup();
    Communicator host = ctx.comm.split(ctx.rank / 2, ctx.rank);                 // a whole host each
    Communicator across = ctx.comm.split(ctx.rank % 2, ctx.rank);               // one rank per host
    Communicator reversed = ctx.comm.split(ctx.rank / 2, -ctx.rank);            // a whole host, other order
    EXPECT_NE(copy.impl()->transport().sharedMemory(), nullptr);
    EXPECT_NE(host.impl()->transport().sharedMemory(), nullptr);
    EXPECT_EQ(across.impl()->transport().sharedMemory(), nullptr);
    EXPECT_EQ(reversed.impl()->transport().sharedMemory(), nullptr);
    EXPECT_EQ(host.impl()->transport().sharedMemory()->ranks(), std::vector<int>({0, 1}));
    // Shared-memory calls of the parent and of two groups, interleaved and of
    // several sizes: one sequence of rounds on each host.
    CollectiveOptions shm;
    shm.algorithm = "shm";
    for (int round = 0; round < 30; ++round) {
      const size_t n = round % 3 == 0 ? 3000 : 7;
      std::vector<float> a(n, 1.0f + ctx.rank), b(n, 2.0f * ctx.rank), c(n, 1.0f);
      Work wa = host.allreduce(a.data(), a.data(), n, DataType::kFloat32, ReduceOp::kSum, shm);
      Work wb = ctx.comm.allreduce(b.data(), b.data(), n, DataType::kFloat32, ReduceOp::kSum);
      Work wc = copy.allreduce(c.data(), c.data(), n, DataType::kFloat32, ReduceOp::kSum);
      wa.wait();
      wb.wait();
      wc.wait();
      EXPECT_EQ(wa.algorithm(), "shm");
      EXPECT_EQ(a[n - 1], ctx.rank < 2 ? 3.0f : 7.0f);
      EXPECT_EQ(b[0], 12.0f);
      EXPECT_EQ(c[n / 2], 4.0f);
    }
  }, quick(), two);
}

// Only the context's own communicator numbers the shared memory: a dup's
// operations (here ring, which takes the engine's call check) neither
// announce themselves there nor use the check slots, or a peer would read
// the dup's operation numbers as the parent's.
TEST(Split, AGroupSharingTheHostsMemoryLeavesItsAnnouncementsAndCheckSlotsToTheParent) {
  runRanks(2, [](RankContext& ctx) {
    Communicator copy = ctx.comm.dup();
    const transport::ShmGroup* shm = ctx.comm.impl()->transport().sharedMemory();
    ASSERT_NE(shm, nullptr);
    ASSERT_NE(copy.impl()->transport().sharedMemory(), nullptr);
    const auto& mine = core::HostControl(shm).block(shm->localRank());
    CollectiveOptions ring;
    ring.algorithm = "ring";
    std::vector<float> x(1000, 1.0f);
    Work w = ctx.comm.allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, ring);
    w.wait();
    const uint64_t announced = mine.announcedSeq.load();
    const uint64_t taken = mine.checkTaken.load();
    EXPECT_EQ(announced, w.sequence() + 1);
    EXPECT_EQ(taken, w.sequence() + 1);
    for (int i = 0; i < 5; ++i) {
      Work g = copy.allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, ring);
      g.wait();
      EXPECT_EQ(g.algorithm(), "ring");
    }
    EXPECT_EQ(mine.announcedSeq.load(), announced);
    EXPECT_EQ(mine.checkTaken.load(), taken);
    EXPECT_EQ(x[0], 64.0f);  // 1, doubled by the parent and then by each of five group calls
  }, quick());
}

TEST(Split, ACollectiveOnAnyCommunicatorOfTheContextOrdersLaterTransfersOfTheOthers) {
  // Rank 0 sends on a group, reduces on the parent, sends again; rank 1
  // receives late. The parent's allreduce must close the group's open
  // transfers, or the second send would join them ahead of the allreduce,
  // which rank 1 reaches only before its second receive: a deadlock.
  Options o;
  o.set("TIMEOUT", "5s");
  runRanks(2, [](RankContext& ctx) {
    Communicator g = ctx.comm.dup();
    int32_t a = 11, b = 22, x = ctx.rank;
    if (ctx.rank == 0) {
      Work s1 = g.send(&a, 1, DataType::kInt32, 1);
      Work r = ctx.comm.allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum);
      Work s2 = g.send(&b, 1, DataType::kInt32, 1);
      s1.wait();
      r.wait();
      s2.wait();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      int32_t ga = 0, gb = 0;
      g.recv(&ga, 1, DataType::kInt32, 0).wait();
      ctx.comm.allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum).wait();
      g.recv(&gb, 1, DataType::kInt32, 0).wait();
      EXPECT_EQ(ga, 11);
      EXPECT_EQ(gb, 22);
    }
    EXPECT_EQ(x, 1);
  }, o);
}
