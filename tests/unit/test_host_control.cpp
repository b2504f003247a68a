// Core's control plane between the ranks of one host (announcements, the
// call check's slots, failure flags), on two ranks' views of memory of the
// test's own.
#include <gtest/gtest.h>

#include "core/host_control.hpp"
#include "support/two_shm_ranks.hpp"

namespace gradcomm::core {
namespace {

transport::CallSignature call(uint64_t seq, size_t count) {
  return transport::CallSignature::make(seq, Collective::kAllreduce, DataType::kFloat32, ReduceOp::kSum, count, 0, "",
                                        "");
}

TEST(HostControl, APeerReadsTheAnnouncedCallOfThatOperationOnly) {
  testing::TwoShmRanks g;
  HostControl r0(g.rank0.get()), r1(g.rank1.get());
  transport::CallSignature seen;
  EXPECT_FALSE(r1.announced(0, 0, &seen));  // nothing yet
  r0.announce(call(3, 100));
  ASSERT_TRUE(r1.announced(0, 3, &seen));
  EXPECT_TRUE(seen.sameCall(call(3, 100)));
  EXPECT_EQ(seen.seq, 3u);
  EXPECT_FALSE(r1.announced(0, 2, &seen));
  EXPECT_FALSE(r1.announced(0, 4, &seen));
  EXPECT_FALSE(r0.announced(1, 3, &seen));  // rank 1 announced nothing
  r0.announce(call(4, 7));
  EXPECT_FALSE(r1.announced(0, 3, &seen));  // replaced
  ASSERT_TRUE(r1.announced(0, 4, &seen));
  EXPECT_FALSE(seen.sameCall(call(4, 100)));
}

TEST(HostControl, ACheckSlotIsReusedOnlyAfterTheNextRankTookWhatItHeld) {
  testing::TwoShmRanks g;
  HostControl r0(g.rank0.get()), r1(g.rank1.get());
  const uint64_t slots = HostControlBlock::kCheckSlots;
  for (uint64_t s = 0; s < slots; ++s) ASSERT_TRUE(r0.putCheck(1, call(s, s + 1))) << s;
  // Slot 0 still holds operation 0, which rank 1 has not taken.
  EXPECT_FALSE(r0.putCheck(1, call(slots, 1)));
  transport::CallSignature got;
  EXPECT_FALSE(r1.takeCheck(0, slots, &got));  // not published
  ASSERT_TRUE(r1.takeCheck(0, 0, &got));
  EXPECT_TRUE(got.sameCall(call(0, 1)));
  EXPECT_EQ(got.seq, 0u);
  ASSERT_TRUE(r0.putCheck(1, call(slots, 42)));
  EXPECT_FALSE(r1.takeCheck(0, 0, &got));  // overwritten by a later operation
  for (uint64_t s = 1; s < slots; ++s) ASSERT_TRUE(r1.takeCheck(0, s, &got)) << s;
  ASSERT_TRUE(r1.takeCheck(0, slots, &got));
  EXPECT_TRUE(got.sameCall(call(slots, 42)));
  EXPECT_FALSE(got.sameCall(call(slots, 41)));
}

TEST(HostControl, AFailedRankIsSeenByItsPeerByCommunicatorRank) {
  testing::TwoShmRanks g;
  // Renumbered: the host's local ranks are communicator ranks 5 and 9.
  auto a = g.rank0->renumbered({5, 9});
  auto b = g.rank1->renumbered({5, 9});
  HostControl r0(a.get()), r1(b.get());
  EXPECT_EQ(r0.failedPeer(), -1);
  EXPECT_EQ(r1.failedPeer(), -1);
  r1.markFailed();
  EXPECT_EQ(r0.failedPeer(), 9);
  EXPECT_EQ(r1.failedPeer(), -1);  // its own flag is not a peer's
}

TEST(HostControl, AViewWithoutHostPeersAnnouncesNothingAndSeesNoFailure) {
  HostControl none;
  none.announce(call(1, 1));
  none.markFailed();
  transport::CallSignature seen;
  EXPECT_FALSE(none.announced(0, 1, &seen));
  EXPECT_EQ(none.failedPeer(), -1);
}

// The transport's data plane and the communicator's control areas share
// each rank's block; writing one must leave the other alone.
TEST(HostControl, TheControlAreaDoesNotOverlapTheTransportsFlags) {
  testing::TwoShmRanks g;
  HostControl r0(g.rank0.get());
  r0.markFailed();
  r0.announce(call(8, 8));
  for (uint64_t s = 0; s < HostControlBlock::kCheckSlots; ++s) ASSERT_TRUE(r0.putCheck(1, call(s, s + 1)));
  const transport::ShmRankBlock& b = g.rank0->block(0);
  EXPECT_EQ(b.consumed.load(), 0u);
  EXPECT_EQ(b.reduced[0].load() | b.reduced[1].load(), 0u);
  EXPECT_EQ(b.mailbox[0].ready.load() | b.mailbox[1].ready.load(), 0u);
  EXPECT_EQ(b.pid, 0);
  const char* area = static_cast<const char*>(g.rank0->control(0));
  const char* block = reinterpret_cast<const char*>(&b);
  EXPECT_GE(area, block);
  EXPECT_LE(area + sizeof(HostControlBlock), block + transport::ShmGroup::kBlockBytes);
}

}  // namespace
}  // namespace gradcomm::core
