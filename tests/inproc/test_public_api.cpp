// The public calls the frontends use: send/recv and pointToPoint batches,
// Communicator::abort, Work::onComplete and the resolved parameters.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "support/inproc.hpp"
#include "support/per_rank.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

std::vector<float> pattern(int rank, size_t n, int salt = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 1000 + salt * 7 + static_cast<int>(i % 997));
  return v;
}

}  // namespace

// ---- send / recv ----------------------------------------------------------------------

TEST(PointToPoint, BothRanksSendFirstAndNeitherWaitsForTheOther) {
  // Large enough to need the receiver on every transport.
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    runRanks(2, [&](RankContext& ctx) {
      const int peer = 1 - ctx.rank;
      auto mine = pattern(ctx.rank, n);
      std::vector<float> got(n, -1.0f);
      Work s = ctx.comm.send(mine.data(), n, DataType::kFloat32, peer);
      Work r = ctx.comm.recv(got.data(), n, DataType::kFloat32, peer);
      r.wait();
      s.wait();
      EXPECT_EQ(got, pattern(peer, n)) << "n=" << n;
      EXPECT_EQ(s.algorithm(), "p2p");
      EXPECT_EQ(s.bytes(), n * sizeof(float));
    }, quick());
  }
}

TEST(PointToPoint, MessagesMatchInIssueOrderPerTag) {
  runRanks(2, [](RankContext& ctx) {
    constexpr int kMessages = 5;
    if (ctx.rank == 0) {
      std::vector<std::vector<int32_t>> out;
      std::vector<Work> works;
      for (int m = 0; m < kMessages; ++m) {
        for (int tag : {0, 3}) out.push_back(std::vector<int32_t>(16, m * 10 + tag));
      }
      // Tag 3's messages first: tags are matched separately.
      for (int m = 0; m < kMessages; ++m) works.push_back(ctx.comm.send(out[2 * m + 1].data(), 16, DataType::kInt32, 1, 3));
      for (int m = 0; m < kMessages; ++m) works.push_back(ctx.comm.send(out[2 * m].data(), 16, DataType::kInt32, 1, 0));
      for (auto& w : works) w.wait();
    } else {
      for (int m = 0; m < kMessages; ++m) {
        for (int tag : {0, 3}) {
          std::vector<int32_t> in(16, -1);
          ctx.comm.recv(in.data(), 16, DataType::kInt32, 0, tag).wait();
          EXPECT_EQ(in, std::vector<int32_t>(16, m * 10 + tag)) << "message " << m << " tag " << tag;
        }
      }
    }
  });
}

TEST(PointToPoint, ACollectiveIssuedBetweenTransfersRunsBetweenThem) {
  // Rank 0: send, allreduce, recv; rank 1: recv, allreduce, send. Rank 0's
  // recv must not join the channel of its send (it would wait for rank 1's
  // send, which comes after the allreduce that rank 0 could not start).
  runRanks(2, [](RankContext& ctx) {
    std::vector<double> a(8, 1.0), b(8, 0.0);
    std::vector<float> sum(100, static_cast<float>(ctx.rank + 1));
    Work first = ctx.rank == 0 ? ctx.comm.send(a.data(), 8, DataType::kFloat64, 1)
                               : ctx.comm.recv(b.data(), 8, DataType::kFloat64, 0);
    Work mid = ctx.comm.allreduce(sum.data(), sum.data(), sum.size(), DataType::kFloat32, ReduceOp::kSum);
    Work last = ctx.rank == 0 ? ctx.comm.recv(b.data(), 8, DataType::kFloat64, 1)
                              : ctx.comm.send(b.data(), 8, DataType::kFloat64, 0);
    last.wait();
    mid.wait();
    first.wait();
    EXPECT_EQ(b, std::vector<double>(8, 1.0));
    EXPECT_EQ(sum, std::vector<float>(100, 3.0f));
  });
}

TEST(PointToPoint, ABatchShiftsARingAndCopiesToItself) {
  constexpr int kRanks = 4;
  runRanks(kRanks, [](RankContext& ctx) {
    const size_t n = 3001;
    const int right = (ctx.rank + 1) % kRanks, left = (ctx.rank + kRanks - 1) % kRanks;
    auto mine = pattern(ctx.rank, n);
    std::vector<float> fromLeft(n, -1.0f), fromSelf(n, -1.0f);
    using T = Communicator::Transfer;
    Work w = ctx.comm.pointToPoint({T::recv(fromLeft.data(), n, DataType::kFloat32, left),
                                    T::send(mine.data(), n, DataType::kFloat32, right),
                                    T::recv(fromSelf.data(), n, DataType::kFloat32, ctx.rank),
                                    T::send(mine.data(), n, DataType::kFloat32, ctx.rank)});
    w.wait();
    EXPECT_EQ(fromLeft, pattern(left, n));
    EXPECT_EQ(fromSelf, mine);
    EXPECT_EQ(w.bytes(), 4 * n * sizeof(float));
    // An empty batch completes at once.
    EXPECT_TRUE(ctx.comm.pointToPoint({}).test());
    // Zero elements with a null buffer are fine.
    Work z = ctx.comm.pointToPoint({T::send(nullptr, 0, DataType::kFloat32, right),
                                    T::recv(nullptr, 0, DataType::kFloat32, left)});
    z.wait();
  });
}

TEST(PointToPoint, ASendAndRecvOfDifferentSizesFailBothRanksNamingBoth) {
  auto out = perRank(2, [](RankContext& ctx) {
    std::vector<float> buf(100, 1.0f);
    if (ctx.rank == 0) {
      ctx.comm.send(buf.data(), 100, DataType::kFloat32, 1).wait();
    } else {
      ctx.comm.recv(buf.data(), 50, DataType::kFloat32, 0).wait();
    }
  });
  EXPECT_EQ(out.code[1], static_cast<int>(ErrorCode::kInvalidArgument)) << out.what[1];
  EXPECT_TRUE(contains(out.what[1], "sent 100 elements of float32")) << out.what[1];
  EXPECT_TRUE(contains(out.what[1], "takes 50 elements of float32")) << out.what[1];
  EXPECT_EQ(out.code[0], static_cast<int>(ErrorCode::kRemote)) << out.what[0];
  EXPECT_TRUE(contains(out.what[0], "sent 100 elements")) << out.what[0];
}

TEST(PointToPoint, BadArgumentsThrowAClearInvalidArgumentAndFailThePeer) {
  struct Case {
    const char* name;
    std::function<Work(Communicator&, float*)> call;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"negative peer", [](Communicator& c, float* b) { return c.send(b, 4, DataType::kFloat32, -1); },
       "peer -1 is not a rank of this communicator (ranks 0 to 1)"},
      {"peer too large", [](Communicator& c, float* b) { return c.recv(b, 4, DataType::kFloat32, 2); },
       "peer 2 is not a rank of this communicator"},
      {"self", [](Communicator& c, float* b) { return c.send(b, 4, DataType::kFloat32, 0); },
       "is this rank itself"},
      {"negative count",
       [](Communicator& c, float* b) { return c.send(b, static_cast<size_t>(int64_t{-4}), DataType::kFloat32, 1); },
       "a negative count converted to size_t?"},
      {"huge count",
       [](Communicator& c, float* b) {
         return c.recv(b, std::numeric_limits<size_t>::max() / 2, DataType::kFloat32, 1);
       },
       "is too large"},
      {"null buffer", [](Communicator& c, float*) { return c.send(nullptr, 4, DataType::kFloat32, 1); },
       "the buffer is null but count is 4"},
      {"tag", [](Communicator& c, float* b) { return c.send(b, 4, DataType::kFloat32, 1, 8); },
       "tag 8 is not in [0, 7]"},
      {"type", [](Communicator& c, float* b) { return c.send(b, 4, static_cast<DataType>(42), 1); },
       "data type #42 is not a DataType"},
      {"unpaired self",
       [](Communicator& c, float* b) {
         return c.pointToPoint({Communicator::Transfer::send(b, 4, DataType::kFloat32, 0)});
       },
       "need receives from itself"},
      {"self of another size",
       [](Communicator& c, float* b) {
         return c.pointToPoint({Communicator::Transfer::send(b, 4, DataType::kFloat32, 0),
                                Communicator::Transfer::recv(b, 2, DataType::kFloat32, 0)});
       },
       "of the same type and count"},
  };
  for (const auto& c : cases) {
    auto out = perRank(2, [&](RankContext& ctx) {
      std::vector<float> buf(4, 1.0f);
      if (ctx.rank == 0) {
        c.call(ctx.comm, buf.data()).wait();
      } else {
        ctx.comm.barrier().wait();  // fails with rank 0's error, never hangs
      }
    });
    EXPECT_EQ(out.code[0], static_cast<int>(ErrorCode::kInvalidArgument)) << c.name << ": " << out.what[0];
    EXPECT_TRUE(contains(out.what[0], c.expected)) << c.name << ": " << out.what[0];
    EXPECT_EQ(out.code[1], static_cast<int>(ErrorCode::kRemote)) << c.name << ": " << out.what[1];
    EXPECT_TRUE(contains(out.what[1], c.expected)) << c.name << ": " << out.what[1];
  }
}

TEST(PointToPoint, ARecvThatNoSendMatchesTimesOut) {
  auto out = perRank(2, [](RankContext& ctx) {
    std::vector<float> buf(4, 1.0f);
    if (ctx.rank == 0) ctx.comm.recv(buf.data(), 4, DataType::kFloat32, 1).wait();
  }, quick("1s"));
  EXPECT_EQ(out.code[0], static_cast<int>(ErrorCode::kTimeout)) << out.what[0];
  EXPECT_TRUE(contains(out.what[0], "recv from rank 1")) << out.what[0];
}

// ---- abort ------------------------------------------------------------------------------

TEST(Abort, FailsEveryRankWithTheReason) {
  auto out = perRank(3, [](RankContext& ctx) {
    std::vector<float> buf(64, 1.0f);
    if (ctx.rank == 1) {
      // Pending when the abort comes: a recv no one sends.
      Work pending = ctx.comm.recv(buf.data(), buf.size(), DataType::kFloat32, 2);
      EXPECT_FALSE(ctx.comm.failure());
      ctx.comm.abort("the loss became NaN");
      ASSERT_TRUE(ctx.comm.failure());
      try {
        std::rethrow_exception(ctx.comm.failure());
      } catch (const InvalidUsage& e) {
        EXPECT_TRUE(contains(e.what(), "rank 1 aborted the communicator: the loss became NaN")) << e.what();
      }
      ctx.comm.abort("a second abort does nothing");
      EXPECT_TRUE(ctx.comm.valid());
      try {
        pending.wait();
        ADD_FAILURE() << "the pending recv completed";
      } catch (const InvalidUsage& e) {
        EXPECT_TRUE(contains(e.what(), "rank 1 aborted the communicator: the loss became NaN")) << e.what();
      }
      ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    } else {
      try {
        ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum).wait();
      } catch (const RemoteError&) {
        EXPECT_TRUE(ctx.comm.failure());  // the peer's notice, as the operations saw it
        throw;
      }
    }
  }, quick("30s"));
  EXPECT_EQ(out.code[1], static_cast<int>(ErrorCode::kInvalidUsage)) << out.what[1];
  EXPECT_TRUE(contains(out.what[1], "the loss became NaN")) << out.what[1];
  EXPECT_FALSE(contains(out.what[1], "second")) << out.what[1];
  for (int r : {0, 2}) {
    EXPECT_EQ(out.code[static_cast<size_t>(r)], static_cast<int>(ErrorCode::kRemote)) << out.what[static_cast<size_t>(r)];
    EXPECT_TRUE(contains(out.what[static_cast<size_t>(r)], "rank 1 aborted the communicator: the loss became NaN"))
        << out.what[static_cast<size_t>(r)];
  }
}

// ---- onComplete ---------------------------------------------------------------------------

TEST(OnComplete, RunsOnceWithNoErrorAfterSuccessAndAtOnceWhenAlreadyDone) {
  runRanks(2, [](RankContext& ctx) {
    std::vector<float> buf(1 << 16, 1.0f);
    std::atomic<int> calls{0};
    std::atomic<bool> failed{false};
    Work w = ctx.comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    w.onComplete([&](std::exception_ptr e) {
      ++calls;
      if (e) failed = true;
    });
    w.wait();
    // The callback ran before wait() returned or runs on the thread that
    // completed the operation, at most shortly after.
    for (int i = 0; i < 1000 && calls.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(calls.load(), 1);
    EXPECT_FALSE(failed.load());
    EXPECT_EQ(buf[0], 2.0f);
    // Already complete: at once, on this thread.
    const auto me = std::this_thread::get_id();
    bool here = false;
    w.onComplete([&](std::exception_ptr e) { here = std::this_thread::get_id() == me && !e; });
    EXPECT_TRUE(here);
    EXPECT_EQ(calls.load(), 1);
    // A default-constructed Work, and point-to-point Works.
    bool empty = false;
    Work().onComplete([&](std::exception_ptr e) { empty = !e; });
    EXPECT_TRUE(empty);
    std::atomic<int> p2p{0};
    float x = static_cast<float>(ctx.rank), y = -1.0f;
    Work s = ctx.comm.send(&x, 1, DataType::kFloat32, 1 - ctx.rank);
    Work r = ctx.comm.recv(&y, 1, DataType::kFloat32, 1 - ctx.rank);
    s.onComplete([&](std::exception_ptr e) { p2p += e ? 100 : 1; });
    r.onComplete([&](std::exception_ptr e) { p2p += e ? 100 : 1; });
    r.wait();
    s.wait();
    for (int i = 0; i < 1000 && p2p.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(p2p.load(), 2);
    EXPECT_EQ(y, static_cast<float>(1 - ctx.rank));
    // A callback that throws is ignored.
    Work t = ctx.comm.barrier();
    t.onComplete([](std::exception_ptr) { throw std::runtime_error("ignored"); });
    t.wait();
  });
}

TEST(OnComplete, ReceivesTheErrorOfAFailedOperationWithoutAWait) {
  // The error outlives the ranks' threads. Were rank 0's copy dropped first, the progress
  // thread's copy would free the exception after rank 0 read it, ordered only by the reference
  // count inside libstdc++, which ThreadSanitizer cannot see (it reported that as a race).
  std::exception_ptr error;
  runRanks(2, [&error](RankContext& ctx) {
    std::vector<float> buf(16, 1.0f);
    if (ctx.rank == 0) {
      std::mutex mu;
      std::condition_variable cv;
      int calls = 0;
      Work w = ctx.comm.recv(buf.data(), buf.size(), DataType::kFloat32, 1);
      w.onComplete([&](std::exception_ptr e) {
        std::lock_guard<std::mutex> lock(mu);
        error = e;
        ++calls;
        cv.notify_all();
      });
      ctx.barrier->wait();  // rank 1 aborts now
      ctx.barrier->wait();
      // No wait() on w: the progress thread fails it and calls back.
      std::unique_lock<std::mutex> lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return calls > 0; }));
      ASSERT_TRUE(error);
      try {
        std::rethrow_exception(error);
      } catch (const RemoteError& e) {
        EXPECT_TRUE(contains(e.what(), "rank 1 aborted the communicator: stop")) << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not a RemoteError: " << e.what();
      }
      EXPECT_EQ(calls, 1);
      lock.unlock();
      // Added after the failure: at once, with the error.
      bool got = false;
      w.onComplete([&](std::exception_ptr e) { got = e != nullptr; });
      EXPECT_TRUE(got);
    } else {
      ctx.barrier->wait();
      ctx.comm.abort("stop");
      ctx.barrier->wait();
    }
  }, quick("30s"));
}

// ---- parameters ------------------------------------------------------------------------------

TEST(Parameters, TheCommunicatorShowsWhatItResolved) {
  Options o = quick("17s");
  o.set("STATS", "5");
  runRanks(2, [](RankContext& ctx) {
    EXPECT_EQ(ctx.comm.parameter("GRADCOMM_STATS"), "5");
    EXPECT_EQ(ctx.comm.parameter("stats"), "5");
    const auto all = ctx.comm.parameters();
    EXPECT_EQ(all.size(), describeParameters().size());
    bool found = false;
    for (const auto& p : all) {
      if (p.name == "GRADCOMM_STATS") {
        found = true;
        EXPECT_EQ(p.origin, ParamOrigin::kExplicit);
      }
    }
    EXPECT_TRUE(found);
    try {
      ctx.comm.parameter("NO_SUCH_PARAMETER");
      ADD_FAILURE() << "no error for an unknown name";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), "unknown parameter 'NO_SUCH_PARAMETER'")) << e.what();
    }
  }, o);
}

// ---- localCommunicators ------------------------------------------------------------------

TEST(LocalCommunicators, OneThreadIssuesEveryRanksCallsAndWaitsForThemAll) {
  for (int n : {1, 3}) {
    Options o = quick();
    std::vector<Communicator> comms = localCommunicators(n, o);
    ASSERT_EQ(comms.size(), static_cast<size_t>(n));
    const size_t count = 10000;
    std::vector<std::vector<float>> bufs;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(comms[static_cast<size_t>(r)].rank(), r);
      EXPECT_EQ(comms[static_cast<size_t>(r)].size(), n);
      bufs.push_back(pattern(r, count));
    }
    // Every rank's call first, then the waits: no rank's call waits for
    // the thread that issues the others'.
    std::vector<Work> works;
    for (int r = 0; r < n; ++r) {
      float* b = bufs[static_cast<size_t>(r)].data();
      works.push_back(comms[static_cast<size_t>(r)].allreduce(b, b, count, DataType::kFloat32, ReduceOp::kSum));
    }
    for (Work& w : works) w.wait();
    std::vector<float> want(count, 0.0f);
    for (int r = 0; r < n; ++r) {
      const std::vector<float> p = pattern(r, count);
      for (size_t i = 0; i < count; ++i) want[i] += p[i];
    }
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(bufs[static_cast<size_t>(r)][i], want[i]) << r << " " << i;
    }
    // And from a thread per rank, a split included.
    std::vector<std::thread> threads;
    std::vector<int> sums(static_cast<size_t>(n), -1);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Communicator half = comms[static_cast<size_t>(r)].split(r % 2, r);
        int v = r;
        half.allreduce(&v, &v, 1, DataType::kInt32, ReduceOp::kSum).wait();
        sums[static_cast<size_t>(r)] = v;
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      int want = 0;
      for (int q = r % 2; q < n; q += 2) want += q;
      EXPECT_EQ(sums[static_cast<size_t>(r)], want) << r;
    }
  }
}

TEST(LocalCommunicators, ACountOutsideItsRangeOrABadOptionIsAClearError) {
  for (int n : {0, -1, 1025}) {
    try {
      localCommunicators(n);
      FAIL() << n << " ranks were formed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("n must be in [1, 1024], got " + std::to_string(n)), std::string::npos)
          << e.what();
    }
  }
  Options bad;
  bad.set("GRADCOMM_TIMEOUT", "soon");
  EXPECT_THROW(localCommunicators(2, bad), ConfigError);
}
