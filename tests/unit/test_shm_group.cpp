// The shared-memory group's flags, on memory of the test's own (two ranks'
// views of one segment; no processes, no threads).
#include <gtest/gtest.h>

#include "support/two_shm_ranks.hpp"

namespace gradcomm::transport {
namespace {

using TwoRanks = testing::TwoShmRanks;

// Round r uses mailbox r & 1. Rank 1 finished reading round 4, then staged
// round 5: rank 0 learns that from the mailbox of round 5 alone.
TEST(ShmGroup, AStagedRoundTellsPeersWhichRoundItsRankFinishedReading) {
  TwoRanks g;
  ShmRankBlock& peer = g.rank1->block(1);
  peer.consumed.store(4);
  g.rank1->publish(5 & 1, 5, 0xabcd);
  EXPECT_EQ(peer.mailbox[1].ready.load(), 5u);
  EXPECT_EQ(peer.mailbox[1].fingerprint, 0xabcdu);
  EXPECT_EQ(peer.mailbox[1].consumedAtStage.load(), 4u);
  EXPECT_TRUE(g.rank0->finishedReading(1, 4));
  EXPECT_TRUE(g.rank0->finishedReading(1, 3));
  // Round 5 is not finished: the mailbox says 4, and `consumed` says 4.
  EXPECT_FALSE(g.rank0->finishedReading(1, 5));
  // The mailbox's value is a lower bound: `consumed` answers beyond it.
  peer.consumed.store(5);
  EXPECT_TRUE(g.rank0->finishedReading(1, 5));
  EXPECT_FALSE(g.rank0->finishedReading(1, 6));
}

TEST(ShmGroup, AMailboxOfAnotherRoundIsNotTakenForTheAnswer) {
  TwoRanks g;
  ShmRankBlock& peer = g.rank1->block(1);
  // Mailbox 1 holds round 3, staged when rank 1 had read round 2: asked
  // about round 8, the mailbox of round 9 (also mailbox 1) is not there yet.
  peer.consumed.store(2);
  g.rank1->publish(1, 3, 1);
  peer.consumed.store(7);
  EXPECT_TRUE(g.rank0->finishedReading(1, 7));   // from `consumed`
  EXPECT_FALSE(g.rank0->finishedReading(1, 8));  // neither says so
  // A mailbox written without the value (zero) is a lower bound too.
  peer.mailbox[0].ready.store(10);
  peer.mailbox[0].consumedAtStage.store(0);
  EXPECT_FALSE(g.rank0->finishedReading(1, 9));
  EXPECT_TRUE(g.rank0->finishedReading(1, 7));
}

// Round numbers pass 2^32 in a long job: the low 32 bits still compare.
TEST(ShmGroup, TheStagedValueComparesAcrossTheThirtyTwoBitWrap) {
  TwoRanks g;
  ShmRankBlock& peer = g.rank1->block(1);
  const uint64_t wrap = uint64_t{1} << 32;
  // Staged after reading round 2^32 - 1 (low bits all ones): round 2^32
  // (low bits 0) is not finished, whatever an unsigned compare would say.
  peer.consumed.store(wrap - 1);
  g.rank1->publish(1, wrap + 1, 1);
  peer.consumed.store(0);  // so only the mailbox can answer
  EXPECT_FALSE(g.rank0->finishedReading(1, wrap));
  peer.consumed.store(wrap);
  g.rank1->publish(1, wrap + 1, 1);
  peer.consumed.store(0);
  EXPECT_TRUE(g.rank0->finishedReading(1, wrap));
}

// Before reusing a buffer, a rank asks which peer still reads the round two
// before: the first such peer, none for the first two rounds.
TEST(ShmGroup, PeerStillReadingNamesTheFirstPeerBehindTheRoundTwoBefore) {
  TwoRanks g;
  EXPECT_EQ(g.rank0->peerStillReading(1), -1);
  EXPECT_EQ(g.rank0->peerStillReading(2), -1);
  EXPECT_EQ(g.rank0->peerStillReading(3), 1);  // rank 1 has read nothing
  g.rank1->block(1).consumed.store(1);
  EXPECT_EQ(g.rank0->peerStillReading(3), -1);
  EXPECT_EQ(g.rank0->peerStillReading(4), 1);
  // A rank never waits for itself.
  EXPECT_EQ(g.rank1->peerStillReading(4), 0);
  g.rank0->block(0).consumed.store(2);
  EXPECT_EQ(g.rank1->peerStillReading(4), -1);
}

}  // namespace
}  // namespace gradcomm::transport
