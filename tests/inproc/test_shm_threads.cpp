// The shared-memory group's round protocol with two ranks as threads: what
// ThreadSanitizer checks (scripts/sanitize-test runs this suite), beside the
// single-threaded flag tests in tests/unit/test_shm_group.cpp.
#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "support/two_shm_ranks.hpp"

namespace gradcomm::transport {
namespace {

// Each rank stages two rounds, then reads the peer's two, wave after wave:
// the pattern of the hierarchical allreduce's reduce-scatter, whose rounds
// restart at every wave. A rank that finished a wave stages the next wave's
// two rounds at once; its peer, one wave behind, may at that moment be asking
// whether it may reuse a buffer, and read the answer from the mailbox being
// rewritten. Whatever the answer, the peer must see every read it stands for
// (data race otherwise: seen as a wrong byte on a weakly ordered CPU, and as
// a report by ThreadSanitizer on any).
TEST(ShmGroupThreads, WavesOfTwoRoundsReuseABufferOnlyAfterThePeerReadIt) {
  constexpr size_t kBytes = 256;
  constexpr int kWaves = 20000;
  testing::TwoShmRanks ranks(kBytes);
  ShmGroup &g0 = *ranks.rank0, &g1 = *ranks.rank1;
  std::string failure[2];
  auto run = [&](ShmGroup& g) {
    const int me = g.localRank(), peer = 1 - me;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto waitUntil = [&](auto&& ready, const char* what, uint64_t r) {
      while (!ready()) {
        if (std::chrono::steady_clock::now() > deadline) {
          failure[me] = std::string("timed out waiting for the peer to ") + what + " round " + std::to_string(r);
          return false;
        }
        sched_yield();
      }
      return true;
    };
    for (uint64_t first = 1; first < 2 * kWaves; first += 2) {
      for (uint64_t r = first; r < first + 2; ++r) {
        if (!waitUntil([&] { return g.peerStillReading(r) < 0; }, "finish reading two before", r)) return;
        std::memset(g.buffer(me, static_cast<int>(r & 1)), static_cast<int>(r & 0xff), kBytes);
        g.publish(static_cast<int>(r & 1), r, static_cast<uint32_t>(r));
      }
      for (uint64_t r = first; r < first + 2; ++r) {
        const ShmRankBlock::Mailbox& box = g.block(peer).mailbox[r & 1];
        if (!waitUntil([&] { return box.ready.load(std::memory_order_acquire) >= r; }, "stage", r)) return;
        const char* data = g.buffer(peer, static_cast<int>(r & 1));
        bool intact = box.fingerprint == static_cast<uint32_t>(r);
        for (size_t i = 0; i < kBytes; ++i) intact = intact && static_cast<unsigned char>(data[i]) == (r & 0xff);
        if (!intact) {
          failure[me] = "round " + std::to_string(r) + ": the peer's buffer was rewritten before this rank read it";
          return;
        }
        g.block(me).consumed.store(r, std::memory_order_release);
      }
    }
  };
  std::thread t0(run, std::ref(g0)), t1(run, std::ref(g1));
  t0.join();
  t1.join();
  EXPECT_EQ(failure[0], "");
  EXPECT_EQ(failure[1], "");
  EXPECT_EQ(g0.block(0).consumed.load(), 2u * kWaves);
  EXPECT_EQ(g1.block(1).consumed.load(), 2u * kWaves);
}

}  // namespace
}  // namespace gradcomm::transport
