// Bad input and broken peers: a clear error on every rank, never a hang or
// silently wrong numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <numeric>
#include <thread>
#include <utility>

#include "support/collective_check.hpp"
#include "support/forwarding_transport.hpp"
#include "support/inproc.hpp"
#include "support/per_rank.hpp"
#include "transport/group_transport.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;
using Clock = std::chrono::steady_clock;

namespace {


/// Every rank failed within 5 s, with a MismatchError or with the
/// RemoteError that carries a peer's.
void expectAMismatchOnEveryRank(const Outcome& out) {
  for (size_t r = 0; r < out.what.size(); ++r) {
    const int code = out.code[r];
    EXPECT_TRUE(code == static_cast<int>(ErrorCode::kMismatch) || code == static_cast<int>(ErrorCode::kRemote))
        << "rank " << r << ": " << out.what[r];
    EXPECT_LT(out.seconds[r], 5.0) << "rank " << r << ": " << out.what[r];
  }
}

}  // namespace

TEST(Errors, NullBufferWithCountIsRejectedOnEveryRank) {
  auto out = perRank(3, [](RankContext& ctx) {
    std::vector<float> buf(64, 1.0f);
    ctx.comm.allreduce(ctx.rank == 1 ? nullptr : buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                       ReduceOp::kSum)
        .wait();
  });
  EXPECT_EQ(out.code[1], static_cast<int>(ErrorCode::kInvalidArgument));
  EXPECT_TRUE(contains(out.what[1], "input buffer is null but count is 64")) << out.what[1];
  for (int r : {0, 2}) {
    EXPECT_EQ(out.code[static_cast<size_t>(r)], static_cast<int>(ErrorCode::kRemote)) << out.what[static_cast<size_t>(r)];
    EXPECT_TRUE(contains(out.what[static_cast<size_t>(r)], "rank 1 rejected its allreduce call")) << out.what[static_cast<size_t>(r)];
    EXPECT_LT(out.seconds[static_cast<size_t>(r)], 5.0);
  }
}

TEST(Errors, UnknownAlgorithmNameListsTheValidOnes) {
  auto out = perRank(2, [](RankContext& ctx) {
    std::vector<float> buf(8, 1.0f);
    CollectiveOptions o;
    o.algorithm = "rign";
    ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
  });
  for (int r = 0; r < 2; ++r) {
    const auto& w = out.what[static_cast<size_t>(r)];
    EXPECT_TRUE(contains(w, "unknown allreduce algorithm 'rign'; valid: ring, rd, hd, tree, shm, hier, native") ||
                contains(w, "rejected")) << w;
  }
}

TEST(Errors, AvgOnIntegersIsUnsupportedOnEveryRank) {
  auto out = perRank(2, [](RankContext& ctx) {
    std::vector<int32_t> buf(8, 3);
    ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kInt32, ReduceOp::kAvg).wait();
  });
  for (int r = 0; r < 2; ++r) {
    int code = out.code[static_cast<size_t>(r)];
    EXPECT_TRUE(code == static_cast<int>(ErrorCode::kUnsupported) || code == static_cast<int>(ErrorCode::kRemote));
    EXPECT_TRUE(contains(out.what[static_cast<size_t>(r)], "avg is not supported for integer type int32"))
        << out.what[static_cast<size_t>(r)];
  }
}

TEST(Errors, InvalidRootAndDataTypeAreRejected) {
  auto out = perRank(2, [](RankContext& ctx) {
    std::vector<float> buf(8, 1.0f);
    ctx.comm.broadcast(buf.data(), buf.data(), buf.size(), DataType::kFloat32, 5).wait();
  });
  EXPECT_TRUE(contains(out.what[0], "root 5 is not a rank of this communicator (size 2)")) << out.what[0];
  auto bad = perRank(2, [](RankContext& ctx) {
    std::vector<float> buf(8, 1.0f);
    ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), static_cast<DataType>(42), ReduceOp::kSum).wait();
  });
  EXPECT_TRUE(contains(bad.what[0], "invalid DataType value 42")) << bad.what[0];
}

TEST(Errors, OverlappingBuffersAreRejected) {
  auto out = perRank(2, [](RankContext& ctx) {
    std::vector<float> buf(16, 1.0f);
    ctx.comm.allreduce(buf.data(), buf.data() + 4, 8, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  EXPECT_TRUE(contains(out.what[0], "overlap")) << out.what[0];
}

TEST(Errors, OperationsAfterDestroyThrowInvalidUsage) {
  runRanks(2, [](RankContext& ctx) {
    Communicator copy = ctx.comm;
    std::vector<float> buf(4, 1.0f);
    ctx.comm.allreduce(buf.data(), buf.data(), 4, DataType::kFloat32, ReduceOp::kSum).wait();
    ctx.barrier->wait();
    ctx.comm.destroy();
    EXPECT_FALSE(copy.valid());
    try {
      copy.allreduce(buf.data(), buf.data(), 4, DataType::kFloat32, ReduceOp::kSum);
      ADD_FAILURE() << "expected InvalidUsage";
    } catch (const InvalidUsage& e) {
      EXPECT_TRUE(contains(e.what(), "destroyed")) << e.what();
    }
    EXPECT_THROW(copy.rank(), InvalidUsage);
    Communicator moved = std::move(copy);
    EXPECT_THROW(copy.barrier(), InvalidUsage);  // NOLINT(bugprone-use-after-move): the point of the test
  });
}

TEST(Errors, APeerThatNeverArrivesIsATimeoutNotAHang) {
  auto out = perRank(
      2,
      [](RankContext& ctx) {
        std::vector<float> buf(1000, 1.0f);
        if (ctx.rank == 0) {
          ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          // By now rank 0 has timed out and told us.
          ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
        }
      },
      // 1 s, not less: the timeout also bounds communicator creation, and a
      // fresh-clone run beside the sanitizer stages once stalled creation's
      // calibration exchange past a 300 ms timeout.
      quick("1s"));
  EXPECT_EQ(out.code[0], static_cast<int>(ErrorCode::kTimeout)) << out.what[0];
  EXPECT_TRUE(contains(out.what[0], "made no progress for")) << out.what[0];
  EXPECT_TRUE(contains(out.what[0], "rank 1")) << out.what[0];
  EXPECT_LT(out.seconds[0], 5.0);
  EXPECT_NE(out.code[1], -1) << "rank 1 must learn that the communicator failed";
}

// GRADCOMM_TIMEOUT=0 means no timeout, as in other libraries, not "fail at
// once": a peer that arrives late is waited for.
TEST(Errors, ATimeoutOfZeroMeansNoTimeout) {
  runRanks(
      3,
      [](RankContext& ctx) {
        for (const char* algo : {"", "ring"}) {  // shared memory and point-to-point
          std::vector<float> buf(1000, 1.0f);
          CollectiveOptions o;
          o.algorithm = algo;
          if (ctx.rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
          ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
          EXPECT_EQ(buf[0], 3.0f);
          EXPECT_EQ(buf[999], 3.0f);
        }
      },
      quick("0"));
  auto params = describeParameters(quick("0"));
  for (const auto& p : params) {
    if (p.name == "GRADCOMM_TIMEOUT") EXPECT_TRUE(contains(p.doc, "0: never")) << p.doc;
  }
}

TEST(Errors, MismatchedCallsFailOnEveryRankWellBeforeTheTimeout) {
  struct Variant {
    const char* name;
    std::function<Work(RankContext&, std::vector<float>&)> call;
  };
  std::vector<Variant> variants = {
      {"count", [](RankContext& c, std::vector<float>& b) {
         return c.comm.allreduce(b.data(), b.data(), c.rank == 0 ? 100 : 200, DataType::kFloat32, ReduceOp::kSum);
       }},
      {"dtype", [](RankContext& c, std::vector<float>& b) {
         return c.comm.allreduce(b.data(), b.data(), 100, c.rank == 0 ? DataType::kFloat32 : DataType::kInt32, ReduceOp::kSum);
       }},
      {"op", [](RankContext& c, std::vector<float>& b) {
         return c.comm.allreduce(b.data(), b.data(), 100, DataType::kFloat32, c.rank == 0 ? ReduceOp::kSum : ReduceOp::kMax);
       }},
      {"collective", [](RankContext& c, std::vector<float>& b) {
         return c.rank == 0 ? c.comm.allreduce(b.data(), b.data(), 100, DataType::kFloat32, ReduceOp::kSum)
                            : c.comm.broadcast(b.data(), b.data(), 100, DataType::kFloat32, 0);
       }},
      {"root", [](RankContext& c, std::vector<float>& b) {
         return c.comm.broadcast(b.data(), b.data(), 100, DataType::kFloat32, c.rank == 0 ? 0 : 1);
       }},
      {"empty vs non-empty", [](RankContext& c, std::vector<float>& b) {
         return c.comm.allreduce(b.data(), b.data(), c.rank == 1 ? 0 : 100, DataType::kFloat32, ReduceOp::kSum);
       }},
      {"algorithm", [](RankContext& c, std::vector<float>& b) {
         CollectiveOptions o;
         o.algorithm = c.rank == 0 ? "ring" : "tree";
         return c.comm.allreduce(b.data(), b.data(), 100, DataType::kFloat32, ReduceOp::kSum, o);
       }},
  };
  for (int p : {2, 3}) {
    for (const auto& v : variants) {
      // A rank whose own exchanges happened to agree (e.g. a broadcast leaf
      // under the root it expected) may finish its part; it learns of the
      // failure by its next call at the latest.
      auto out = perRank(p, [&](RankContext& ctx) {
        std::vector<float> buf(256, 1.0f);
        v.call(ctx, buf).wait();
        ctx.comm.barrier().wait();
      });
      bool sawMismatch = false;
      for (int r = 0; r < p; ++r) {
        SCOPED_TRACE(std::string(v.name) + " p=" + std::to_string(p) + " rank " + std::to_string(r));
        int code = out.code[static_cast<size_t>(r)];
        EXPECT_TRUE(code == static_cast<int>(ErrorCode::kMismatch) || code == static_cast<int>(ErrorCode::kRemote))
            << out.what[static_cast<size_t>(r)];
        sawMismatch = sawMismatch || code == static_cast<int>(ErrorCode::kMismatch);
        EXPECT_LT(out.seconds[static_cast<size_t>(r)], 5.0);
      }
      EXPECT_TRUE(sawMismatch) << v.name;
    }
  }
}

// The same after a signature was seen: rank 0 repeats a small
// shared-memory call (it runs with no operation object) while the others
// change its reduction; every rank fails, none hangs.
TEST(Errors, AMismatchOnARepeatedSmallSharedMemoryCallFailsOnEveryRank) {
  for (int p : {2, 3}) {
    auto out = perRank(p, [](RankContext& ctx) {
      std::vector<float> buf(8, 1.0f);
      ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
      EXPECT_EQ(buf[0], static_cast<float>(ctx.comm.size()));
      const ReduceOp op = ctx.rank == 0 ? ReduceOp::kSum : ReduceOp::kMax;
      ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, op).wait();
      ctx.comm.barrier().wait();
    });
    SCOPED_TRACE("p=" + std::to_string(p));
    expectAMismatchOnEveryRank(out);
    EXPECT_TRUE(contains(out.what[0], "op") || contains(out.what[0], "reduction")) << out.what[0];
  }
}

TEST(Errors, ZeroCountWorksWithNullPointersForEveryCollective) {
  runRanks(3, [](RankContext& ctx) {
    ctx.comm.allreduce(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum).wait();
    ctx.comm.broadcast(nullptr, nullptr, 0, DataType::kFloat32, 1).wait();
    ctx.comm.reduce(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kMax, 2).wait();
    ctx.comm.allgather(nullptr, nullptr, 0, DataType::kFloat32).wait();
    ctx.comm.reduceScatter(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum).wait();
    for (const char* a : {"ring", "rd", "hd", "tree"}) {
      CollectiveOptions o;
      o.algorithm = a;
      ctx.comm.allreduce(nullptr, nullptr, 0, DataType::kBFloat16, ReduceOp::kAvg, o).wait();
    }
  });
}

TEST(Work, WaitWithTimeoutReturnsFalseUntilThePeersArrive) {
  runRanks(2, [](RankContext& ctx) {
    std::vector<float> buf(100, static_cast<float>(ctx.rank + 1));
    if (ctx.rank == 0) {
      Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
      EXPECT_FALSE(w.wait(std::chrono::milliseconds(50)));
      EXPECT_FALSE(w.test());
      ctx.barrier->wait();
      w.wait();
      EXPECT_TRUE(w.test());
    } else {
      ctx.barrier->wait();
      ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    }
    EXPECT_EQ(buf[0], 3.0f);
    EXPECT_EQ(buf[99], 3.0f);
  });
}

// Ranks that wait by yielding (GRADCOMM_WAIT=yield, as where ranks
// outnumber cores), with a timeout that fails rather than hangs a test.
static Options yieldingRanks() {
  Options o;
  o.set("WAIT", "yield");
  o.set("TIMEOUT", "30s");
  return o;
}

// `calls` waited allreduces of `buf` through forced `rd` (the engine, not
// the shared-memory inline path), each waited for as soon as it is submitted.
static void waitedRdCalls(Communicator& comm, std::vector<float>& buf, int calls) {
  CollectiveOptions rd;
  rd.algorithm = "rd";
  for (int i = 0; i < calls; ++i) {
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, rd).wait();
  }
}

// Watches `w` without driving it (endTime() only reads) until the
// communicator's background thread has finished it: 10 s at most.
static void expectTheBackgroundThreadFinishes(Work& w) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (w.endTime() == Clock::time_point{} && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NE(w.endTime(), Clock::time_point{}) << "the background thread never finished it";
  w.wait();
}

// With GRADCOMM_WAIT=yield the background thread sleeps while a caller
// waits (and drives). A caller whose wait times out leaves the operation
// to that thread: it must wake and finish it with nobody driving.
TEST(Work, AfterATimedOutWaitTheBackgroundThreadFinishesTheCallWhenRanksOutnumberCores) {
  const Options o = yieldingRanks();
  runRanks(
      2,
      [](RankContext& ctx) {
        std::vector<float> buf(1 << 16, static_cast<float>(ctx.rank + 1));  // 256 KiB: not an inline call
        if (ctx.rank == 0) {
          Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
          EXPECT_FALSE(w.wait(std::chrono::milliseconds(5)));  // rank 1 has not called yet
          ctx.barrier->wait();
          expectTheBackgroundThreadFinishes(w);
        } else {
          ctx.barrier->wait();
          ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
        }
        EXPECT_EQ(buf.front(), 3.0f);
        EXPECT_EQ(buf.back(), 3.0f);
      },
      o);
}

// With GRADCOMM_WAIT=yield, a caller that waits for its call as soon as it
// submits it drives the call itself: waking the background thread for it
// would only take a core from a peer rank (on 4 emulated hosts on 2 cores,
// that wake-up per call made an 8-byte allreduce 1.4-1.6x MPI's time). The
// thread naps and is not woken per call.
TEST(Work, CallsWaitedForAtOnceDoNotWakeTheBackgroundThreadWhenRanksOutnumberCores) {
  const Options o = yieldingRanks();
  constexpr int kCalls = 300;
  runRanks(
      2,
      [](RankContext& ctx) {
        CollectiveOptions rd;
        rd.algorithm = "rd";  // through the engine, not the shared-memory inline path
        std::vector<float> buf(16);
        waitedRdCalls(ctx.comm, buf, 20);  // warm up: plans, the thread settles
        const uint64_t before = ctx.comm.impl()->engine().threadWakeups();
        const auto start = Clock::now();
        for (int i = 0; i < kCalls; ++i) {
          std::fill(buf.begin(), buf.end(), static_cast<float>(ctx.rank + i));
          ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, rd).wait();
          ASSERT_EQ(buf[0], static_cast<float>(1 + 2 * i));
        }
        const uint64_t wakeups = ctx.comm.impl()->engine().threadWakeups() - before;
        const auto elapsed = Clock::now() - start;
        // The thread's own looks: a nap ends every kNap, a thread that
        // blocked after `linger` (5 ms) idle is woken by the next call, and
        // a caller descheduled for over 1 ms (a loaded machine) lets the
        // thread drive once and wake once more. So a few per kNap; a
        // wake-up per call is what this guards against (112 in a 24 ms run
        // without it; 78 in 780 ms with it beside a parallel build).
        const auto naps = static_cast<uint64_t>(elapsed / core::ProgressEngine::kNap);
        std::printf("rank %d: %llu background-thread wake-ups over %d waited calls in %.1f ms\n", ctx.rank,
                    static_cast<unsigned long long>(wakeups), kCalls,
                    std::chrono::duration<double, std::milli>(elapsed).count());
        EXPECT_LE(wakeups, 3 * naps + 10) << "about a wake-up per call";
      },
      o);
}

// The other side of the same: a small call whose caller does not wait is
// finished by the napping background thread (within a nap), even after a
// long run of calls whose callers waited at once.
TEST(Work, ASmallCallNobodyWaitsForIsFinishedByTheThreadWhenRanksOutnumberCores) {
  const Options o = yieldingRanks();
  runRanks(
      2,
      [](RankContext& ctx) {
        CollectiveOptions rd;
        rd.algorithm = "rd";
        std::vector<float> buf(16);
        waitedRdCalls(ctx.comm, buf, 100);
        std::fill(buf.begin(), buf.end(), static_cast<float>(ctx.rank + 1));
        if (ctx.rank == 0) {
          Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, rd);
          ctx.barrier->wait();  // only now does rank 1 call: rank 0's first step cannot have finished it
          expectTheBackgroundThreadFinishes(w);
        } else {
          ctx.barrier->wait();
          ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, rd).wait();
        }
        EXPECT_EQ(buf.front(), 3.0f);
        EXPECT_EQ(buf.back(), 3.0f);
      },
      o);
}

TEST(Work, ManyOutstandingOperationsCompleteInIssueOrder) {
  runRanks(4, [](RankContext& ctx) {
    const int n = 40;
    std::vector<std::vector<double>> bufs(n);
    std::vector<Work> works;
    for (int i = 0; i < n; ++i) {
      bufs[static_cast<size_t>(i)].assign(static_cast<size_t>(50 + 977 * i), static_cast<double>(i + ctx.rank));
      auto& b = bufs[static_cast<size_t>(i)];
      works.push_back(ctx.comm.allreduce(b.data(), b.data(), b.size(), DataType::kFloat64, ReduceOp::kSum));
    }
    for (int i = n - 1; i >= 0; --i) works[static_cast<size_t>(i)].wait();  // wait in reverse
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(works[static_cast<size_t>(i)].sequence(), static_cast<uint64_t>(i));
      double want = 4.0 * i + 6.0;
      for (double v : bufs[static_cast<size_t>(i)]) ASSERT_EQ(v, want);
    }
  });
}

TEST(Work, TestPollingAloneDrivesAnOperationToCompletion) {
  runRanks(3, [](RankContext& ctx) {
    std::vector<float> buf(5000, 1.0f);
    Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!w.test()) ASSERT_LT(Clock::now(), deadline);
    EXPECT_EQ(buf[4999], 3.0f);
  });
}

// Repeated calls with one signature skip validation of the signature and the
// algorithm choice (a per-communicator cache); the buffers are still checked
// on every call.
TEST(Errors, NullBufferIsRejectedAfterTheSameSignatureSucceeded) {
  auto out = perRank(3, [](RankContext& ctx) {
    std::vector<float> buf(64, 1.0f);
    for (int i = 0; i < 3; ++i) {
      ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    }
    EXPECT_EQ(buf[0], 27.0f);
    ctx.comm.allreduce(ctx.rank == 2 ? nullptr : buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                       ReduceOp::kSum)
        .wait();
  });
  EXPECT_EQ(out.code[2], static_cast<int>(ErrorCode::kInvalidArgument)) << out.what[2];
  EXPECT_TRUE(contains(out.what[2], "input buffer is null but count is 64")) << out.what[2];
  for (int r : {0, 1}) {
    EXPECT_EQ(out.code[static_cast<size_t>(r)], static_cast<int>(ErrorCode::kRemote)) << out.what[static_cast<size_t>(r)];
  }
}

// The compression option is part of a cached signature: the same call with
// "none", then fp16, then a malformed spec behaves as each asks.
TEST(Errors, CompressionOptionIsHonouredOnRepeatedSignatures) {
  auto out = perRank(2, [](RankContext& ctx) {
    const float x = 1.0f + 1.0f / 4096.0f;  // exact in float32, rounds to 1.0 in fp16
    std::vector<float> buf(16);
    CollectiveOptions o;
    for (const char* c : {"none", "", "fp16", "none"}) {
      o.compression = c;
      std::fill(buf.begin(), buf.end(), x);
      ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
      const float want = std::string(c) == "fp16" ? 2.0f : 2.0f * x;
      EXPECT_EQ(buf[0], want) << "compression '" << c << "'";
    }
    o.compression = "fp17";
    ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
  });
  for (int r : {0, 1}) {
    EXPECT_EQ(out.code[static_cast<size_t>(r)], static_cast<int>(ErrorCode::kInvalidArgument)) << out.what[static_cast<size_t>(r)];
    EXPECT_TRUE(contains(out.what[static_cast<size_t>(r)], "CollectiveOptions::compression")) << out.what[static_cast<size_t>(r)];
  }
}

// A small call takes its first step inside allreduce(); when the peers are
// not there yet, the progress thread must finish it without any wait() or
// test() from the caller.
TEST(Work, ASmallCallStartedEagerlyCompletesWithoutWaiting) {
  runRanks(3, [](RankContext& ctx) {
    std::vector<float> buf(8, static_cast<float>(ctx.rank + 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(30 * ctx.rank));
    Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    // endTime() only reads the state; it does not drive progress.
    while (w.endTime() == Clock::time_point{}) {
      ASSERT_LT(Clock::now(), deadline) << "rank " << ctx.rank << ": nothing finished the call";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    w.wait();
    EXPECT_EQ(buf[0], 6.0f);
    EXPECT_EQ(buf[7], 6.0f);
    // Back-to-back calls from a rank that never waits in between.
    std::vector<Work> works;
    std::vector<std::vector<float>> bufs(20, std::vector<float>(4, 1.0f));
    for (auto& b : bufs) works.push_back(ctx.comm.allreduce(b.data(), b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum));
    for (auto& wk : works) wk.wait();
    for (auto& b : bufs) EXPECT_EQ(b[3], 3.0f);
  });
}

// A repeated small shared-memory allreduce runs in the calling thread with
// no operation object when the engine is idle, and its Work carries the
// record itself; the record reads the same whichever path the call took.
TEST(Work, RepeatedSmallSharedMemoryCallsKeepTheirRecords) {
  runRanks(2, [](RankContext& ctx) {
    std::vector<float> buf(8);
    CollectiveOptions shm;  // the default may be rd on a busy machine
    shm.algorithm = "shm";
    for (int i = 0; i < 300; ++i) {
      std::fill(buf.begin(), buf.end(), static_cast<float>(i + ctx.rank));
      const auto before = Clock::now();
      Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, shm);
      w.wait();
      const auto after = Clock::now();
      SCOPED_TRACE("call " + std::to_string(i) + ", rank " + std::to_string(ctx.rank));
      ASSERT_EQ(buf[7], static_cast<float>(2 * i + 1));
      Work copy = w;
      for (const Work* x : {&w, &copy}) {
        ASSERT_TRUE(x->valid());
        ASSERT_EQ(x->algorithm(), "shm");
        ASSERT_EQ(x->sequence(), static_cast<uint64_t>(i));
        ASSERT_EQ(x->bytes(), 32u);
        ASSERT_LE(before, x->startTime());
        ASSERT_LE(x->startTime(), x->endTime());
        ASSERT_LE(x->endTime(), after);
        ASSERT_TRUE(x->phases().empty());
      }
      ASSERT_TRUE(w.test());
      ASSERT_TRUE(w.wait(std::chrono::milliseconds(0)));
    }
  }, quick());
}

// A repeated small call whose peers are late: the call that began in the
// submitting thread carries on as an operation, which the engine's thread
// finishes while the caller does not wait. Shared memory, and signed rd
// (3 ranks: a fold, an exchange and the hand-back).
TEST(Work, ARepeatedSmallCallWhosePeersAreLateCarriesOnAsAnOperation) {
  for (const char* algo : {"shm", "rd"}) {
  SCOPED_TRACE(algo);
  runRanks(3, [algo](RankContext& ctx) {
    std::vector<float> buf(8, 1.0f);
    CollectiveOptions shm;
    shm.algorithm = algo;
    ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, shm).wait();
    std::fill(buf.begin(), buf.end(), static_cast<float>(ctx.rank + 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(30 * ctx.rank));
    Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, shm);
    EXPECT_EQ(w.sequence(), 1u);
    EXPECT_EQ(w.algorithm(), algo);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    // endTime() only reads the state; it does not drive progress.
    while (w.endTime() == Clock::time_point{}) {
      ASSERT_LT(Clock::now(), deadline) << "rank " << ctx.rank << ": nothing finished the call";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_LE(w.startTime(), w.endTime());
    w.wait();
    EXPECT_EQ(buf[0], 6.0f);
    EXPECT_EQ(buf[7], 6.0f);
  }, quick());
  }
}

// Every field of a call is part of what the ranks agree on, whatever the
// algorithm and size: when one differs, every rank fails (the ranks that see
// the difference with a MismatchError, the others with a RemoteError that
// carries it) and the message names the field and both values.
TEST(Errors, MismatchedCallsNameTheFieldThatDiffers) {
  struct Variant {
    const char* field;
    std::string rank0Value;  // as the message prints them, with the verb
    std::string otherValue;
    std::function<Work(RankContext&, std::vector<float>&, const CollectiveOptions&)> call;
  };
  const std::vector<Variant> variants = {
      {"root", "passed root 0", "passed root 1",
       [](RankContext& c, std::vector<float>& b, const CollectiveOptions& o) {
         return c.comm.broadcast(b.data(), b.data(), 1000, DataType::kFloat32, c.rank == 0 ? 0 : 1, o);
       }},
      {"count", "passed count 100", "passed count 200",
       [](RankContext& c, std::vector<float>& b, const CollectiveOptions& o) {
         return c.comm.allreduce(b.data(), b.data(), c.rank == 0 ? 100 : 200, DataType::kFloat32, ReduceOp::kSum, o);
       }},
      {"data type", "passed float32", "passed int32",
       [](RankContext& c, std::vector<float>& b, const CollectiveOptions& o) {
         return c.comm.allreduce(b.data(), b.data(), 100, c.rank == 0 ? DataType::kFloat32 : DataType::kInt32,
                                 ReduceOp::kSum, o);
       }},
      {"op", "passed sum", "passed max",
       [](RankContext& c, std::vector<float>& b, const CollectiveOptions& o) {
         return c.comm.allreduce(b.data(), b.data(), 100, DataType::kFloat32, c.rank == 0 ? ReduceOp::kSum : ReduceOp::kMax,
                                 o);
       }},
      {"root", "passed root 0", "passed root 1",  // reduce: the ranks that think they are the root only receive
       [](RankContext& c, std::vector<float>& b, const CollectiveOptions& o) {
         return c.comm.reduce(b.data(), b.data(), 1000, DataType::kFloat32, ReduceOp::kSum, c.rank == 0 ? 0 : 1, o);
       }},
      {"algorithm", "runs ring", "runs tree",
       [](RankContext& c, std::vector<float>& b, const CollectiveOptions&) {
         CollectiveOptions o;
         o.algorithm = c.rank == 0 ? "ring" : "tree";
         return c.comm.allreduce(b.data(), b.data(), 1000, DataType::kFloat32, ReduceOp::kSum, o);
       }},
      {"compression", "uses fp16", "uses none",
       [](RankContext& c, std::vector<float>& b, const CollectiveOptions& given) {
         CollectiveOptions o = given;
         o.compression = c.rank == 0 ? "fp16" : "none";
         return c.comm.allreduce(b.data(), b.data(), 1000, DataType::kFloat32, ReduceOp::kSum, o);
       }},
  };
  // "" is the default choice (shm for allreduce on one host, tree for
  // broadcast and reduce). On one host the call check goes through shared
  // memory, with a rank per host as messages.
  for (int ranksPerHost : {0, 1}) {
    for (const char* algo : {"", "ring", "rd", "tree"}) {
      for (int p : {2, 3}) {
        for (const auto& v : variants) {
          if (v.field == std::string("root") && algo != std::string() && algo != std::string("tree")) continue;
          if (v.field == std::string("algorithm") && algo != std::string()) continue;  // it forces its own
          CollectiveOptions o;
          o.algorithm = algo;
          transport::InProcWorld::Settings layout;
          layout.ranksPerHost = ranksPerHost;
          auto out = perRank(
              p,
              [&](RankContext& ctx) {
                std::vector<float> buf(1000, 1.0f);
                v.call(ctx, buf, o).wait();
                ctx.comm.barrier().wait();
              },
              quick(), layout);
          SCOPED_TRACE(std::string(v.field) + " with algorithm '" + algo + "' on " + std::to_string(p) + " ranks, " +
                       (ranksPerHost ? "one per host" : "one host"));
          expectAMismatchOnEveryRank(out);
          bool named = false;
          for (int r = 0; r < p; ++r) {
            const std::string& w = out.what[static_cast<size_t>(r)];
            EXPECT_TRUE(contains(w, std::string(v.field) + " differs: this rank ")) << "rank " << r << ": " << w;
            // Both values, whichever pair of ranks saw the difference first.
            named = named || (contains(w, v.rank0Value) && contains(w, v.otherValue));
          }
          EXPECT_TRUE(named) << out.what[0] << "\n" << out.what[1];
        }
      }
    }
  }
}

namespace {

/// A transport that reports a failed peer the way a real network may: the
/// peer's abandoned transfer fails here before its abort notice arrives.
/// A notice that arrives stays hidden until a transfer has failed: the
/// next transfer tested then fails, and only after that is the notice
/// reported.
class NoticeAfterAbandon : public ForwardingTransport {
 public:
  explicit NoticeAfterAbandon(std::unique_ptr<transport::Transport> inner) : ForwardingTransport(std::move(inner)) {}
  std::string name() const override { return "notice-after-abandon"; }
  transport::RequestPtr isend(int peer, const void* data, size_t bytes, const transport::Tag& tag) override {
    return std::make_unique<Req>(*this, inner().isend(peer, data, bytes, tag));
  }
  transport::RequestPtr irecv(int peer, void* data, size_t bytes, const transport::Tag& tag) override {
    return std::make_unique<Req>(*this, inner().irecv(peer, data, bytes, tag));
  }
  transport::RequestPtr irecvAny(void* data, size_t capacity, const transport::Tag& tag) override {
    return std::make_unique<Notice>(*this, inner().irecvAny(data, capacity, tag));
  }

 private:
  struct Req : transport::Request {
    Req(NoticeAfterAbandon& t, transport::RequestPtr inner) : t_(t), inner_(std::move(inner)) {}
    bool test() override {
      if (t_.noticeHeld_ && !t_.abandoned_) {
        t_.abandoned_ = true;
        throw TransportError("the other side abandoned the transfer");
      }
      return inner_->test();
    }
    size_t received() const override { return inner_->received(); }
    NoticeAfterAbandon& t_;
    transport::RequestPtr inner_;
  };
  struct Notice : transport::Request {
    Notice(NoticeAfterAbandon& t, transport::RequestPtr inner) : t_(t), inner_(std::move(inner)) {}
    bool test() override {
      if (!arrived_) arrived_ = inner_->test();
      if (arrived_ && !t_.abandoned_) t_.noticeHeld_ = true;
      return arrived_ && t_.abandoned_;
    }
    size_t received() const override { return inner_->received(); }
    int source() const override { return inner_->source(); }
    NoticeAfterAbandon& t_;
    transport::RequestPtr inner_;
    bool arrived_ = false;
  };
  bool noticeHeld_ = false;
  bool abandoned_ = false;
};

}  // namespace

// Abort notices over the data plane alone: every other rank hears a
// failed rank once, named, with its reason cut to the channel's limit; in a
// group the sender is named by its group rank; nobody hears its own.
TEST(AbortChannel, EveryOtherRankHearsTheNoticeOnceWithItsSender) {
  auto world = transport::InProcWorld::create(3);
  std::vector<std::unique_ptr<transport::Transport>> t;
  std::vector<std::unique_ptr<core::AbortChannel>> ch;
  for (int r = 0; r < 3; ++r) t.push_back(world->transport(r));
  for (int r = 0; r < 3; ++r) ch.push_back(std::make_unique<core::AbortChannel>(*t[static_cast<size_t>(r)]));
  const std::string longReason(5000, 'x');
  ch[2]->broadcast("disk full");
  ch[2]->broadcast(longReason);
  for (int r : {0, 1}) {
    auto& c = *ch[static_cast<size_t>(r)];
    EXPECT_EQ(c.poll().value_or("(none)"), "rank 2: disk full") << "rank " << r;
    EXPECT_EQ(c.poll().value_or("(none)"), "rank 2: " + longReason.substr(0, core::AbortChannel::kMaxText))
        << "rank " << r;
    EXPECT_FALSE(c.poll().has_value()) << "rank " << r << " heard a notice twice";
  }
  EXPECT_FALSE(ch[2]->poll().has_value()) << "a rank heard its own notice";

  // A group of base ranks {2, 0}: base rank 2 is group rank 0, and the
  // group's notices stay apart from the base's.
  transport::GroupTransport g0(*t[2], {2, 0}, 5), g1(*t[0], {2, 0}, 5);
  core::AbortChannel a0(g0), a1(g1);
  a0.broadcast("in the group");
  EXPECT_EQ(a1.poll().value_or("(none)"), "rank 0: in the group");
  EXPECT_FALSE(ch[0]->poll().has_value()) << "the base heard a group's notice";
}

// A peer that fails cancels its transfers before its notice goes out, so a
// rank may see the abandoned transfer first: it must still report the
// peer's reason (the cause), not the abandoned transfer (a symptom).
TEST(Errors, APeersReasonWinsOverTheTransferItAbandoned) {
  auto world = transport::InProcWorld::create(2);
  std::string what[2];
  int code[2] = {-1, -1};
  ThreadBarrier created(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<detail::CommunicatorImpl> impl;
      try {
        std::unique_ptr<transport::Transport> t = world->transport(r);
        if (r == 1) t = std::make_unique<NoticeAfterAbandon>(std::move(t));
        impl = std::make_shared<detail::CommunicatorImpl>(std::move(t), world->hostLayout(r),
                                                          core::Config::resolve(quick()));
      } catch (const Error& e) {
        what[r] = std::string("creation failed: ") + e.what();
      }
      // Both ranks are past creation (its calibration exchange) before
      // rank 0's notice goes out: the transfer it abandons is the
      // allreduce's, not creation's (a slow TSan run once raced them).
      created.wait();
      if (!impl) return;
      try {
        Communicator comm(impl);
        std::vector<float> buf(1000, 1.0f);
        CollectiveOptions o;
        if (r == 0) o.compression = "fp17";  // rejected on rank 0, which tells rank 1
        comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
      } catch (const Error& e) {
        what[r] = e.what();
        code[r] = static_cast<int>(e.code());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(code[0], static_cast<int>(ErrorCode::kInvalidArgument)) << what[0];
  EXPECT_EQ(code[1], static_cast<int>(ErrorCode::kRemote)) << what[1];
  EXPECT_TRUE(contains(what[1], "CollectiveOptions::compression")) << what[1];
}

// The hierarchical algorithms compare calls inside a host (shared-memory
// fingerprints) and across hosts (the call check and message sizes): a rank
// with another count, on either host, is an error on every rank, not a hang
// or wrong numbers.
TEST(Errors, HierWithDifferentCountsFailsOnEveryRank) {
  for (const char* coll : {"allreduce", "broadcast", "allgather"}) {
    for (int odd : {1, 2}) {  // same host as rank 0, or the other host
      transport::InProcWorld::Settings layout;
      layout.hostSizes = {2, 2};
      auto out = perRank(
          4,
          [&](RankContext& ctx) {
            std::vector<float> buf(4 * 1001, 1.0f), in(1001, 2.0f);
            const size_t n = ctx.rank == odd ? 1001 : 1000;
            CollectiveOptions o;
            o.algorithm = "hier";
            Work w;
            if (coll == std::string("allreduce")) {
              w = ctx.comm.allreduce(buf.data(), buf.data(), n, DataType::kFloat32, ReduceOp::kSum, o);
            } else if (coll == std::string("broadcast")) {
              w = ctx.comm.broadcast(buf.data(), buf.data(), n, DataType::kFloat32, 0, o);
            } else {
              w = ctx.comm.allgather(in.data(), buf.data(), n, DataType::kFloat32, o);
            }
            w.wait();
            ctx.comm.barrier().wait();
          },
          quick(), layout);
      bool named = false;  // some rank says which count differs
      for (int r = 0; r < 4; ++r) {
        named = named || out.code[static_cast<size_t>(r)] == static_cast<int>(ErrorCode::kMismatch) ||
                contains(out.what[static_cast<size_t>(r)], "size mismatch");
      }
      EXPECT_TRUE(named) << coll << ", odd rank " << odd << ": " << out.what[0] << "\n" << out.what[odd];
      for (int r = 0; r < 4; ++r) {
        const auto& w = out.what[static_cast<size_t>(r)];
        const int code = out.code[static_cast<size_t>(r)];
        SCOPED_TRACE(std::string(coll) + ", odd rank " + std::to_string(odd) + ", rank " + std::to_string(r));
        EXPECT_TRUE(code == static_cast<int>(ErrorCode::kMismatch) || code == static_cast<int>(ErrorCode::kRemote) ||
                    code == static_cast<int>(ErrorCode::kTransport))
            << w;
        EXPECT_LT(out.seconds[static_cast<size_t>(r)], 10.0) << w;
      }
    }
  }
}

// Small hierarchical calls sign their messages between hosts instead of
// running the engine's call check: calls that differ in count (one side
// with an empty slice, the other without; one side signed, the other not),
// type or op still fail on every rank, wherever the odd rank is. On hosts
// of equal size, and the same mismatches on uneven hosts (1 and 3 ranks:
// the lone rank owns all three slices; 3 and 2), which sign too (their
// slices pair their owners once).
TEST(Errors, SmallHierCallsThatDifferFailOnEveryRankWithoutTheCallCheck) {
  struct Case {
    const char* what;
    size_t count, oddCount;
    DataType type, oddType;
    ReduceOp op, oddOp;
  };
  const Case cases[] = {
      {"count 1 against 3", 1, 3, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, ReduceOp::kSum},
      {"count 64 against 65", 64, 65, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, ReduceOp::kSum},
      {"float32 against int32", 64, 64, DataType::kFloat32, DataType::kInt32, ReduceOp::kSum, ReduceOp::kSum},
      {"sum against max", 64, 64, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, ReduceOp::kMax},
      // One side signed, the other with the engine's call check: slices
      // that go by rings, and an empty call.
      {"count 64 against 16384", 64, 16384, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, ReduceOp::kSum},
      {"count 64 against 0", 64, 0, DataType::kFloat32, DataType::kFloat32, ReduceOp::kSum, ReduceOp::kSum},
  };
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, {1, 3}, {3, 2}}) {
  transport::InProcWorld::Settings layout;
  layout.hostSizes = sizes;
  const int size = std::accumulate(sizes.begin(), sizes.end(), 0);
  for (const Case& c : cases) {
    for (int odd = 0; odd < size; ++odd) {
      SCOPED_TRACE(std::string(c.what) + ", odd rank " + std::to_string(odd) + " of hosts " +
                   ::testing::PrintToString(sizes));
      auto out = perRank(
          size,
          [&](RankContext& ctx) {
            std::vector<float> buf(16384, 1.0f);
            const bool isOdd = ctx.rank == odd;
            CollectiveOptions o;
            o.algorithm = "hier";
            ctx.comm.allreduce(buf.data(), buf.data(), isOdd ? c.oddCount : c.count, isOdd ? c.oddType : c.type,
                               isOdd ? c.oddOp : c.op, o)
                .wait();
            ctx.comm.barrier().wait();
          },
          quick(), layout);
      expectAMismatchOnEveryRank(out);
    }
  }
  }
}

namespace {

/// Counts the messages a rank sends on the call-check channel (and of those
/// the plain call checks: a signature alone) and on the data channel.
/// With `keepSharedMemory` the rank keeps its host's shared memory, else
/// every peer is reached by messages.
class CountingTransport : public ForwardingTransport {
 public:
  explicit CountingTransport(std::unique_ptr<transport::Transport> inner, bool keepSharedMemory = false)
      : ForwardingTransport(std::move(inner)), keepSharedMemory_(keepSharedMemory) {}
  transport::RequestPtr isend(int peer, const void* data, size_t bytes, const transport::Tag& tag) override {
    const bool check = tag.message == transport::Tag::kCallCheck;
    ++(check ? checkSends : dataSends);
    if (check && bytes == sizeof(transport::CallSignature)) ++plainChecks;
    return inner().isend(peer, data, bytes, tag);
  }
  transport::ShmGroup* sharedMemory() override { return keepSharedMemory_ ? inner().sharedMemory() : nullptr; }
  // Without its group the rank still knows the configured chunk, like a
  // rank whose host's shared memory failed to set up.
  size_t sharedMemoryChunkBytes() const override {
    return const_cast<CountingTransport*>(this)->inner().sharedMemoryChunkBytes();
  }
  std::atomic<int> checkSends{0}, dataSends{0}, plainChecks{0};

 private:
  const bool keepSharedMemory_;
};

}  // namespace

// On 2 x 2, the call check crosses hosts from ranks 1 and 3 (their next
// ranks live on the other host). Small hier calls sign their messages and
// send no call check; an empty call and one whose slices go by rings do.
// By default a call under 32 KiB per rank of the largest host is one slice
// (GRADCOMM_HIER_SLICE_MIN) and signs on any layout. With a slice per rank
// (0), hosts of different sizes sign where their slices pair their owners
// once (1 and 3 ranks), and keep the call check where two slices of one
// rank meet the same owner (2, 1 and 3: slices 0 and 2 of host 0's first
// rank both go to the lone rank).
TEST(Errors, SmallHierCallsSendNoCallCheckBetweenHosts) {
  for (const char* sliceMin : {"32K", "0"})
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, {1, 3}, {2, 1, 3}}) {
    SCOPED_TRACE("hosts " + ::testing::PrintToString(sizes) + ", GRADCOMM_HIER_SLICE_MIN " + sliceMin);
    const bool signs = std::string(sliceMin) != "0" || sizes.size() == 2;
    Options options = quick();
    options.set("HIER_SLICE_MIN", sliceMin);
    transport::InProcWorld::Settings layout;
    layout.hostSizes = sizes;
    const int size = std::accumulate(sizes.begin(), sizes.end(), 0);
    std::vector<int> hostOf;
    for (size_t h = 0; h < sizes.size(); ++h) hostOf.insert(hostOf.end(), static_cast<size_t>(sizes[h]), static_cast<int>(h));
    auto world = transport::InProcWorld::create(size, layout);
    struct Sent {
      int small = -1, empty = -1, large = -1;
    };
    std::vector<Sent> sent(static_cast<size_t>(size));
    std::vector<std::string> failed(static_cast<size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto counting = std::make_unique<CountingTransport>(world->transport(r), true);
          CountingTransport* c = counting.get();
          auto impl = std::make_shared<detail::CommunicatorImpl>(std::move(counting), world->hostLayout(r),
                                                                 core::Config::resolve(options));
          Communicator comm(impl);
          CollectiveOptions o;
          o.algorithm = "hier";
          // 4096 floats: slices of at most 16 KiB, rd between hosts; 16384
          // floats: 32 KiB slices or more, rings.
          std::vector<float> buf(16384, 1.0f);
          auto checksDuring = [&](size_t count, int calls) {
            const int before = c->plainChecks.load();
            for (int i = 0; i < calls; ++i) {
              std::fill(buf.begin(), buf.end(), 1.0f);
              Work w = comm.allreduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, o);
              w.wait();
              EXPECT_EQ(w.algorithm(), "hier");
              if (count) EXPECT_EQ(buf[count - 1], static_cast<float>(size));
            }
            return c->plainChecks.load() - before;
          };
          sent[static_cast<size_t>(r)] = {checksDuring(4096, 5), checksDuring(0, 1), checksDuring(16384, 1)};
        } catch (const Error& e) {
          failed[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int r = 0; r < size; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(failed[static_cast<size_t>(r)], "");
      const bool crosses = hostOf[static_cast<size_t>(r)] != hostOf[static_cast<size_t>((r + 1) % size)];
      EXPECT_EQ(sent[static_cast<size_t>(r)].small, signs ? 0 : (crosses ? 5 : 0));
      EXPECT_EQ(sent[static_cast<size_t>(r)].empty, crosses ? 1 : 0);
      EXPECT_EQ(sent[static_cast<size_t>(r)].large, crosses ? 1 : 0);
    }
  }
}

// Forced where it cannot run (one host), hier falls back to the default and
// still computes the right numbers, as every forced algorithm does.
TEST(Errors, HierForcedOnOneHostFallsBackAndStaysCorrect) {
  runRanks(3, [](RankContext& ctx) {
    CollectiveCase c{Collective::kAllreduce, "", DataType::kFloat32, ReduceOp::kSum, 1000, 0, false, 7};
    std::vector<float> in(1000, static_cast<float>(ctx.rank + 1)), out(1000, 0.0f);
    // What the default runs for this call (the cost model's choice).
    Work byDefault = ctx.comm.allreduce(in.data(), out.data(), in.size(), DataType::kFloat32, ReduceOp::kSum);
    byDefault.wait();
    CollectiveOptions o;
    o.algorithm = "hier";
    std::fill(out.begin(), out.end(), 0.0f);
    Work w = ctx.comm.allreduce(in.data(), out.data(), in.size(), DataType::kFloat32, ReduceOp::kSum, o);
    w.wait();
    EXPECT_EQ(w.algorithm(), byDefault.algorithm());
    EXPECT_NE(w.algorithm(), "hier");
    for (float v : out) ASSERT_EQ(v, 6.0f);
  });
}

// Whether a host has shared memory is only known on that host: a rank alone
// on its host can run hier while the ranks of a host without shared memory
// fall back. The call check then names the differing algorithm on every
// rank instead of letting the two sides wait for each other.
TEST(Errors, HierOnSomeRanksAndAFallbackOnOthersIsAMismatchEverywhere) {
  // Rank 0 alone on its host; ranks 1 and 2 share a host whose shared
  // memory failed (no group, the chunk configured as everywhere).
  transport::InProcWorld::Settings layout;
  layout.hostSizes = {1, 2};
  auto world = transport::InProcWorld::create(3, layout);
  std::vector<std::string> what(3);
  std::vector<int> code(3, -1);
  std::vector<double> seconds(3, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const auto start = std::chrono::steady_clock::now();
      try {
        auto t = std::make_unique<CountingTransport>(world->transport(r), r == 0);
        auto impl = std::make_shared<detail::CommunicatorImpl>(std::move(t), world->hostLayout(r),
                                                               core::Config::resolve(quick()));
        Communicator comm(impl);
        std::vector<float> buf(1000, 1.0f);
        CollectiveOptions o;
        o.algorithm = "hier";
        comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
        comm.barrier().wait();
      } catch (const Error& e) {
        what[static_cast<size_t>(r)] = e.what();
        code[static_cast<size_t>(r)] = static_cast<int>(e.code());
      }
      seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (auto& th : threads) th.join();
  bool named = false;
  for (int r = 0; r < 3; ++r) {
    const auto& w = what[static_cast<size_t>(r)];
    const int c = code[static_cast<size_t>(r)];
    EXPECT_TRUE(c == static_cast<int>(ErrorCode::kMismatch) || c == static_cast<int>(ErrorCode::kRemote))
        << "rank " << r << ": " << w;
    EXPECT_LT(seconds[static_cast<size_t>(r)], 10.0) << "rank " << r;
    named = named || (contains(w, "algorithm differs") && contains(w, "hier"));
  }
  EXPECT_TRUE(named) << what[0] << "\n" << what[1] << "\n" << what[2];
}

// A shared-memory chunk too small for hier (below 8 bytes per rank) is the
// same on every rank, so a rank alone on its host falls back as the ranks
// of the other hosts do: the default (which the cost model would make hier
// for a large call on hosts of 1 and 3 ranks) and a forced hier run the
// same algorithm everywhere and sum right. Before, the lone rank ran hier
// and the others fell back: a mismatch of the default's choice (found by
// the property test, seed 1795718977821024985).
TEST(Errors, AChunkTooSmallForHierFallsBackOnEveryRankAlike) {
  for (size_t chunk : {size_t{0}, size_t{8}, size_t{4096}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    transport::InProcWorld::Settings layout;
    layout.hostSizes = {1, 3};
    layout.shmChunkBytes = chunk;
    std::vector<std::string> ran(4);
    runRanks(
        4,
        [&](RankContext& ctx) {
          std::vector<float> in(1 << 16, static_cast<float>(ctx.rank + 1)), out(in.size(), 0.0f);
          Work byDefault = ctx.comm.allreduce(in.data(), out.data(), in.size(), DataType::kFloat32, ReduceOp::kSum);
          byDefault.wait();
          for (float v : out) ASSERT_EQ(v, 10.0f);
          CollectiveOptions o;
          o.algorithm = "hier";
          std::fill(out.begin(), out.end(), 0.0f);
          Work forced = ctx.comm.allreduce(in.data(), out.data(), in.size(), DataType::kFloat32, ReduceOp::kSum, o);
          forced.wait();
          for (float v : out) ASSERT_EQ(v, 10.0f);
          ran[static_cast<size_t>(ctx.rank)] = byDefault.algorithm() + "/" + forced.algorithm();
        },
        quick(), layout);
    for (int r = 1; r < 4; ++r) EXPECT_EQ(ran[static_cast<size_t>(r)], ran[0]) << "rank " << r;
    const bool hierRuns = chunk >= 8 * 4;
    EXPECT_EQ(ran[0].substr(ran[0].find('/') + 1) == "hier", hierRuns) << ran[0];
  }
}

namespace {

/// A transport whose abort notices never arrive (a network that lost them):
/// host-local peers must still learn of a failure through shared memory.
class LostNotices : public transport::Transport {
 public:
  explicit LostNotices(std::unique_ptr<transport::Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "lost-notices"; }
  transport::RequestPtr isend(int peer, const void* data, size_t bytes, const transport::Tag& tag) override {
    return inner_->isend(peer, data, bytes, tag);
  }
  transport::RequestPtr irecv(int peer, void* data, size_t bytes, const transport::Tag& tag) override {
    return inner_->irecv(peer, data, bytes, tag);
  }
  bool probeMismatch(int peer, const transport::Tag& expected) override { return inner_->probeMismatch(peer, expected); }
  /// A receive that never completes: no notice ever arrives.
  transport::RequestPtr irecvAny(void*, size_t, const transport::Tag&) override {
    struct Never : transport::Request {
      bool test() override { return false; }
      size_t received() const override { return 0; }
    };
    return std::make_unique<Never>();
  }
  transport::ShmGroup* sharedMemory() override { return inner_->sharedMemory(); }
  size_t sharedMemoryChunkBytes() const override { return inner_->sharedMemoryChunkBytes(); }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

}  // namespace

// A rank that timed out on one host leaves its staged shared-memory data
// behind; a late peer must not complete the same allreduce from it (its
// result would say success while the other rank failed), even when no
// abort notice ever reaches it.
TEST(Errors, ALatePeerOnTheHostFailsAfterTheOtherTimedOutEvenWithoutItsNotice) {
  auto world = transport::InProcWorld::create(2);
  ThreadBarrier barrier(2);
  std::string what[2];
  int code[2] = {-1, -1};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto impl = std::make_shared<detail::CommunicatorImpl>(std::make_unique<LostNotices>(world->transport(r)),
                                                             world->hostLayout(r), core::Config::resolve(quick("1s")));
      Communicator comm(impl);
      std::vector<float> buf(100, 1.0f);
      CollectiveOptions o;
      o.algorithm = "shm";
      try {
        if (r == 1) barrier.wait();  // late: after rank 0 gave up
        comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
      } catch (const Error& e) {
        what[r] = e.what();
        code[r] = static_cast<int>(e.code());
      }
      if (r == 0) barrier.wait();
      comm.destroy();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(code[0], static_cast<int>(ErrorCode::kTimeout)) << what[0];
  EXPECT_EQ(code[1], static_cast<int>(ErrorCode::kRemote)) << what[1];
  EXPECT_TRUE(contains(what[1], "rank 0 on this host failed")) << what[1];
}

// A small rd call carries its signature in its messages (no call check of
// its own); a larger one does not. Ranks that pass different counts across
// that limit run one each: every rank must still fail, naming the count,
// not hang until the timeout.
// Both sides signed (100 and 101 floats: each runs in its caller's
// thread, without an operation object, when the engine is idle), and one
// side signed, the other not.
TEST(Errors, SignedAndUnsignedRdCallsThatDifferFailOnEveryRankAndNameTheCount) {
  for (const size_t large : {size_t{101}, transport::kSignedPayloadLimit}) {  // floats: 404 B or 64 KiB
  const size_t small = 100;
  for (int p : {2, 3, 4, 5}) {
    for (int odd : {0, p - 1}) {
      transport::InProcWorld::Settings layout;
      layout.ranksPerHost = 1;
      auto out = perRank(
          p,
          [&](RankContext& ctx) {
            std::vector<float> buf(large, 1.0f);
            CollectiveOptions o;
            o.algorithm = "rd";
            const size_t n = ctx.rank == odd ? small : large;
            ctx.comm.allreduce(buf.data(), buf.data(), n, DataType::kFloat32, ReduceOp::kSum, o).wait();
            ctx.comm.barrier().wait();
          },
          quick(), layout);
      SCOPED_TRACE(std::to_string(p) + " ranks, rank " + std::to_string(odd) + " passes the small count");
      expectAMismatchOnEveryRank(out);
      bool named = false;
      for (int r = 0; r < p; ++r) {
        const std::string& w = out.what[static_cast<size_t>(r)];
        named = named || (contains(w, "count differs") && contains(w, "count " + std::to_string(small)) &&
                          contains(w, "count " + std::to_string(large)) && contains(w, "allreduce #"));
      }
      EXPECT_TRUE(named) << out.what[0] << "\n" << out.what[1];
    }
  }
  }
}


// The call check costs a message per operation: a small rd call puts the
// signature in front of its data instead, so it sends exactly its plan's
// messages (one per round on two ranks); above the limit the check is back.
TEST(Work, ASmallRdCallSendsItsSignatureWithItsDataAndNoCallCheck) {
  transport::InProcWorld::Settings layout;
  layout.ranksPerHost = 1;
  auto world = transport::InProcWorld::create(2, layout);
  int checks[2][2] = {}, data[2][2] = {};
  float result[2][2] = {};
  ThreadBarrier created(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto counting = std::make_unique<CountingTransport>(world->transport(r));
      CountingTransport* c = counting.get();
      auto impl = std::make_shared<detail::CommunicatorImpl>(std::move(counting), world->hostLayout(r),
                                                             core::Config::resolve(quick()));
      created.wait();
      Communicator comm(impl);
      CollectiveOptions o;
      o.algorithm = "rd";
      const size_t sizes[2] = {100, transport::kSignedPayloadLimit / sizeof(float) + 1};
      for (int k = 0; k < 2; ++k) {
        std::vector<float> buf(sizes[k], static_cast<float>(r + 1));
        const int c0 = c->checkSends, d0 = c->dataSends;
        comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum, o).wait();
        checks[r][k] = c->checkSends - c0;
        data[r][k] = c->dataSends - d0;
        result[r][k] = buf.back();
      }
      comm.barrier().wait();
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(checks[r][0], 1) << "rank " << r << ": the signed exchange";
    EXPECT_EQ(data[r][0], 0) << "rank " << r;
    EXPECT_EQ(checks[r][1], 1) << "rank " << r << ": the call check";
    EXPECT_EQ(data[r][1], 1) << "rank " << r << ": the exchange";
    EXPECT_EQ(result[r][0], 3.0f);
    EXPECT_EQ(result[r][1], 3.0f);
  }
}

// ---- the engine and a schedule that finished before the call check --------

namespace {

/// Finished by its first advance; counts every advance.
class DoneAtOnce final : public algorithms::Schedule {
 public:
  explicit DoneAtOnce(std::atomic<int>* advances) : advances_(advances) {}
  bool advance() override {
    ++*advances_;
    return true;
  }
  bool done() const override { return advances_->load() > 0; }
  std::string waitingFor() const override { return "nothing"; }

 private:
  std::atomic<int>* advances_;
};

}  // namespace

// A schedule done before the ranks' calls are checked (a peer is late) waits
// for the check without being advanced again: a finished algorithm may not
// redo its last step (a reduction into an output a device copy is reading).
TEST(Engine, AScheduleDoneBeforeTheCallCheckIsNotAdvancedAgain) {
  std::atomic<int> advances[2] = {0, 0};
  runRanks(2, [&](RankContext& ctx) {
    if (ctx.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto impl = ctx.comm.impl();
    algorithms::CollectiveCall none;
    none.collective = Collective::kBarrier;
    auto op = detail::OperationState::create();
    op->algorithm = "done-at-once";
    op->signature = detail::callSignature(none, "done-at-once", {});
    op->seq = 1000000;  // a number no call of the communicator takes
    op->signature.seq = op->seq;
    op->fingerprint = op->signature.fingerprint();
    transport::Tag tag;
    tag.seq = op->seq;
    tag.fingerprint = op->fingerprint;
    op->ctx = impl->runContext(none, tag);
    op->call = none;
    std::atomic<int>* mine = &advances[ctx.rank];
    op->custom = [mine](const algorithms::RunContext&) {
      return algorithms::makeSchedule<DoneAtOnce>(nullptr, mine);
    };
    op->customWhat = "done-at-once";
    impl->engine().submit(op);
    impl->engine().waitFor(*op, std::chrono::steady_clock::now() + std::chrono::seconds(30));
    ASSERT_TRUE(op->finished());
    op->rethrowIfFailed();
  });
  EXPECT_EQ(advances[0].load(), 1) << "rank 0 waited about 100 ms for rank 1's call";
  EXPECT_EQ(advances[1].load(), 1);
}
