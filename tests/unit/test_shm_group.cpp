// The shared-memory group's flags, on memory of the test's own (two ranks'
// views of one segment; no processes, no threads).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

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

namespace gradcomm::transport {
namespace {

/// Runs `fn` in a grandchild of this process that lives in a PID namespace
/// of its own; its exit status, or -1 with `why` set where no PID namespace
/// can be made here.
int runInOwnPidNamespace(const std::function<int()>& fn, std::string* why) {
  int pipefd[2];
  if (pipe(pipefd) != 0) {
    *why = "pipe failed";
    return -1;
  }
  const pid_t child = fork();
  if (child == 0) {
    close(pipefd[0]);
    if (unshare(CLONE_NEWPID) != 0) {
      const std::string e = std::string("unshare(CLONE_NEWPID): ") + std::strerror(errno);
      if (write(pipefd[1], e.data(), e.size()) < 0) _exit(2);
      _exit(1);
    }
    const pid_t grandchild = fork();  // the namespace's first process
    if (grandchild == 0) _exit(fn());
    int status = 0;
    waitpid(grandchild, &status, 0);
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 100);
  }
  close(pipefd[1]);
  char buf[256] = {0};
  const ssize_t n = read(pipefd[0], buf, sizeof buf - 1);
  close(pipefd[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (n > 0) {
    *why = buf;
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

bool nameExists(const std::string& name) { return access(("/dev/shm" + name).c_str(), F_OK) == 0; }

// Stale-segment cleanup run by a job in another PID namespace (sharing
// /dev/shm and IPC, as a pod's containers do) must leave a live creator's
// segment alone: its process id does not exist over there.
TEST(ShmSegment, CleanupInAnotherPidNamespaceLeavesALiveCreatorsSegment) {
  auto seg = ShmSegment::create(1 << 16);
  ASSERT_TRUE(nameExists(seg->name()));
  std::string why;
  const int rc = runInOwnPidNamespace(
      [] {
        ShmSegment::removeStale();
        return 0;
      },
      &why);
  if (rc < 0) GTEST_SKIP() << why;
  ASSERT_EQ(rc, 0);
  EXPECT_TRUE(nameExists(seg->name())) << seg->name() << " was removed while its creator lives";
}

// ...and a dead creator's segment still goes, whatever namespace looks.
TEST(ShmSegment, CleanupRemovesASegmentWhoseCreatorIsGone) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto seg = ShmSegment::create(1 << 16);
    const std::string& n = seg->name();
    if (write(pipefd[1], n.data(), n.size()) < 0) _exit(2);
    _exit(0);  // no destructor: the name stays, as after a crash
  }
  close(pipefd[1]);
  char buf[256] = {0};
  ASSERT_GT(read(pipefd[0], buf, sizeof buf - 1), 0);
  close(pipefd[0]);
  int status = 0;
  waitpid(child, &status, 0);
  const std::string name = buf;
  ASSERT_TRUE(nameExists(name));
  // A segment is only taken for stale once it is a second old: its creator
  // may not have marked it as its own yet.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // > the 1 s grace
  std::string why;
  const int rc = runInOwnPidNamespace(
      [] {
        ShmSegment::removeStale();
        return 0;
      },
      &why);
  if (rc < 0) {
    ShmSegment::removeStale();
  } else {
    ASSERT_EQ(rc, 0);
  }
  EXPECT_FALSE(nameExists(name));
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace gradcomm::transport

namespace gradcomm::transport {
namespace {

// A rank's liveness lock goes with the rank even where a child it forked
// (a data-loader worker) lives on with the segment's descriptor.
TEST(ShmSegment, ALockGoesWithItsProcessThoughAForkedChildLivesOn) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t rank = fork();
  if (rank == 0) {
    auto seg = ShmSegment::create(1 << 16);
    // The child's fork handler (which drops its share of the lock) runs
    // before fork() returns in the child, but not necessarily before it
    // returns here: the worker says when it runs, so that on a loaded
    // machine the rank does not die while the worker still holds the lock.
    int ready[2];
    if (pipe(ready) != 0) _exit(3);
    const pid_t worker = fork();
    if (worker == 0) {
      if (write(ready[1], "r", 1) != 1) _exit(4);
      sleep(30);  // outlives the rank; killed by the test
      _exit(0);
    }
    char r = 0;
    if (read(ready[0], &r, 1) != 1) _exit(5);
    const std::string msg = seg->name() + " " + std::to_string(worker);
    if (write(pipefd[1], msg.data(), msg.size()) < 0) _exit(2);
    _exit(0);  // the rank dies, its worker lives
  }
  close(pipefd[1]);
  char buf[256] = {0};
  ASSERT_GT(read(pipefd[0], buf, sizeof buf - 1), 0);
  close(pipefd[0]);
  int status = 0;
  waitpid(rank, &status, 0);
  char name[200] = {0};
  int worker = 0;
  ASSERT_EQ(std::sscanf(buf, "%199s %d", name, &worker), 2);
  auto peer = ShmSegment::open(name, 1 << 16);
  EXPECT_EQ(::kill(worker, 0), 0) << "the worker should still run";
  EXPECT_FALSE(peer->lockHeld(0)) << "the dead rank's lock is still held (by its worker)";
  ::kill(worker, SIGKILL);
  shm_unlink(name);
}

}  // namespace
}  // namespace gradcomm::transport
