// Collectives on device buffers, run on the test runtime (support/
// fake_device.hpp): device memory is host memory with a device number and
// streams are threads, so the staging pipeline (copies in, host algorithm,
// copies back, in chunks), its ordering against the caller's stream and
// the checks of bad input run here without a GPU. The same calls on a real
// GPU run in tests/cuda (scripts/gpu-check).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>

#include "support/collective_check.hpp"
#include "support/compression_reference.hpp"
#include "core/device_staging.hpp"
#include "support/fake_device.hpp"
#include "support/per_rank.hpp"

using namespace gradcomm;
using namespace gradcomm::testing;

namespace {

/// Small chunks, so a few thousand elements make several.
Options smallChunks() {
  Options o = quick();
  o.set("DEVICE_CHUNK_SIZE", "4K");
  return o;
}

}  // namespace

TEST(Device, EveryCollectiveOnDeviceBuffersMatchesTheReference) {
  FakeDevice::Installed fake;
  fake->setCopyDelay(std::chrono::microseconds(5));
  for (int p : {1, 2, 3}) {
    runRanks(p, [&](RankContext& ctx) {
      int cases = 0;
      // 0, 1, a part of a chunk, several chunks and a ragged last one.
      const std::string err = checkEveryCollectiveOn(
          ctx.comm, [&](size_t bytes) { return fake->allocate(0, bytes); }, {0, 1, 700, 5000}, &cases);
      EXPECT_EQ(err, "") << "ranks " << p;
      EXPECT_GT(cases, 500);
    }, smallChunks());
  }
}

TEST(Device, AWorkSaysItRanOnTheDeviceAndItsChunksRunOnTheCallersAlgorithm) {
  FakeDevice::Installed fake;
  runRanks(2, [&](RankContext& ctx) {
    float* d = fake->allocate<float>(0, 4096);
    float h[4] = {1, 2, 3, 4};
    CollectiveOptions ring;
    ring.algorithm = "ring";
    Work dw = ctx.comm.allreduce(d, d, 4096, DataType::kFloat32, ReduceOp::kSum, ring);
    Work hw = ctx.comm.allreduce(h, h, 4, DataType::kFloat32, ReduceOp::kSum);
    dw.wait();
    hw.wait();
    EXPECT_TRUE(dw.onDevice());
    EXPECT_FALSE(hw.onDevice());
    EXPECT_EQ(dw.algorithm(), "ring");
    EXPECT_EQ(h[3], 8.0f);
  }, smallChunks());
}

TEST(Device, TheCallReadsTheInputOnlyAfterTheWorkQueuedOnTheCallersStream) {
  FakeDevice::Installed fake;
  // Slow copies back: the second call's copies in would overtake the
  // first call's copies back if nothing ordered them.
  fake->setCopyDelay(std::chrono::microseconds(0), std::chrono::milliseconds(20));
  runRanks(2, [&](RankContext& ctx) {
    const size_t n = 3000;  // three chunks
    float* d = fake->allocate<float>(0, n);
    void* stream = fake->createStream(0);
    // A slow "kernel" writes the input; the call is issued before it ran.
    fake->launch(stream, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(i + ctx.rank);
    });
    CollectiveOptions o;
    o.stream = stream;
    Work w = ctx.comm.allreduce(d, d, n, DataType::kFloat32, ReduceOp::kSum, o);
    // A second call on the first one's output, issued before the first
    // finished: it must read the reduced values.
    Work w2 = ctx.comm.allreduce(d, d, n, DataType::kFloat32, ReduceOp::kSum, o);
    w.wait();
    w2.wait();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], 2.0f * (2.0f * i + 1)) << i;
    fake->drain(stream);
    fake->destroyStream(stream);
  }, smallChunks());
}

TEST(Device, SynchronizeOrdersAStreamAfterTheResultWithoutWaitingForTheCopyBack) {
  FakeDevice::Installed fake;
  fake->setCopyDelay(std::chrono::milliseconds(30));
  runRanks(2, [&](RankContext& ctx) {
    const size_t n = 2048;  // two chunks
    int32_t* d = fake->allocate<int32_t>(0, n);
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(i);
    void* stream = fake->createStream(0);
    Work w = ctx.comm.allreduce(d, d, n, DataType::kInt32, ReduceOp::kSum, {});
    w.synchronize(stream);
    // The copy back takes 30 ms a chunk: synchronize returned before it ended.
    std::atomic<bool> seen{false};
    std::vector<int32_t> later(n);
    fake->launch(stream, [&] {
      std::memcpy(later.data(), d, n * sizeof(int32_t));
      seen = true;
    });
    EXPECT_FALSE(seen.load());
    fake->drain(stream);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(later[i], 2 * static_cast<int32_t>(i)) << i;
    EXPECT_TRUE(w.test());
    fake->destroyStream(stream);
  }, smallChunks());
}

// Pinned memory, device memory and events of finished calls serve the next
// ones: after the first step, a step allocates nothing (cudaFree and
// cudaFreeHost would wait for the whole device, in the middle of backward).
TEST(Device, RepeatedCallsReuseTheirPinnedMemoryDeviceMemoryAndEvents) {
  FakeDevice::Installed fake;
  int pinned = 0, device = 0, events = 0;
  runRanks(2, [&](RankContext& ctx) {
    double* d = fake->allocate<double>(0, 10000);
    float* g = fake->allocate<float>(0, 1000);
    ErrorFeedback ef;
    CollectiveOptions compressed;
    compressed.compression = "fp16";
    compressed.errorFeedback = &ef;
    auto step = [&] {
      ctx.comm.allreduce(d, d, 10000, DataType::kFloat64, ReduceOp::kSum).wait();
      ctx.comm.allreduce(g, g, 1000, DataType::kFloat32, ReduceOp::kAvg, compressed).wait();
    };
    step();
    ctx.barrier->wait();
    if (ctx.rank == 0) {
      pinned = fake->pinnedAllocations();
      device = fake->deviceAllocations();
      events = fake->eventsCreated();
    }
    ctx.barrier->wait();
    for (int i = 0; i < 30; ++i) step();
  }, smallChunks());
  // The first step's: per rank two pinned blocks (one per call), the
  // payload's device block and the residual, and its events (about 25 a
  // step: one per 4 KiB chunk and two per call). A call may start before
  // the engine let go of the previous one (its waiter wakes first) and
  // take one more: a few at most, never a step's worth.
  EXPECT_GE(pinned, 2);
  EXPECT_LE(pinned, 4);
  EXPECT_GE(device, 2);
  EXPECT_GT(events, 20);
  EXPECT_LE(fake->pinnedAllocations(), pinned + 2);
  EXPECT_LE(fake->deviceAllocations(), device + 2);
  EXPECT_LE(fake->eventsCreated(), events + 6);
}

// The engine may drive a finished chunk again while its call check is still
// under way: neither the chunk nor the algorithm in it may then redo their
// last step (a shared-memory allreduce reduced again into the pinned output
// while the copy back was reading it: the sum before an average's division
// could reach the device).
namespace {

/// Doubles the chunk's pinned values in one step; counts its advances.
class DoubleOnce final : public algorithms::Schedule {
 public:
  DoubleOnce(float* host, size_t n, int* advances) : host_(host), n_(n), advances_(advances) {}
  bool advance() override {
    ++*advances_;
    for (size_t i = 0; i < n_; ++i) host_[i] *= 2;
    done_ = true;
    return true;
  }
  bool done() const override { return done_; }
  std::string waitingFor() const override { return "nothing"; }

 private:
  float* host_;
  size_t n_;
  int* advances_;
  bool done_ = false;
};

}  // namespace

TEST(Device, AFinishedChunkIsNotAdvancedAgainNorCopiedBackTwice) {
  FakeDevice::Installed fake;
  auto staging = std::make_shared<detail::DeviceStaging>(fake.fake, 0);
  constexpr size_t n = 256;
  float* d = fake->allocate<float>(0, n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(i);
  auto call = std::make_shared<detail::StagedCall>(staging, n * sizeof(float));
  auto* host = reinterpret_cast<float*>(call->host());
  call->chunks().push_back({d, host, n * sizeof(float), host, d, n * sizeof(float)});
  call->start(nullptr);
  int advances = 0;
  auto schedule = detail::stagedSchedule(
      call, 0, [&] { return algorithms::makeSchedule<DoubleOnce>(nullptr, host, n, &advances); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!schedule->done() && std::chrono::steady_clock::now() < deadline) schedule->advance();
  ASSERT_TRUE(schedule->done());
  const int copies = fake->copies();  // in and back
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(schedule->advance());
  call->wait();
  EXPECT_EQ(advances, 1);
  EXPECT_EQ(fake->copies(), copies);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], 2.0f * static_cast<float>(i)) << i;
}

// A call dropped while its copies still run (a Work dropped unwaited, a
// failed call) must neither wait for them on the dropping thread (often the
// progress thread) nor lend its pinned block to the next call before the
// copies are done with it.
TEST(Device, ADroppedCallNeitherWaitsForItsCopiesNorLendsItsBlockBeforeThem) {
  FakeDevice::Installed fake;
  const auto slow = std::chrono::milliseconds(300);
  fake->setCopyDelay(slow, slow);
  auto staging = std::make_shared<detail::DeviceStaging>(fake.fake, 0);
  constexpr size_t n = 256;
  constexpr size_t bytes = n * sizeof(float);
  float* d = fake->allocate<float>(0, n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(i);
  auto newCall = [&] {
    auto call = std::make_shared<detail::StagedCall>(staging, bytes);
    auto* host = reinterpret_cast<float*>(call->host());
    call->chunks().push_back({d, host, bytes, host, d, bytes});
    call->start(nullptr);
    return call;
  };
  const double halfSlowMs = slow.count() / 2.0;
  auto dropTimed = [](std::shared_ptr<detail::StagedCall>& call) {  // in ms
    const auto t0 = std::chrono::steady_clock::now();
    call.reset();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };

  // 1. Copied back, the copy back still running.
  auto call = newCall();
  char* first = call->host();
  int advances = 0;
  auto schedule = detail::stagedSchedule(call, 0, [&] {
    return algorithms::makeSchedule<DoubleOnce>(nullptr, reinterpret_cast<float*>(first), n, &advances);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!schedule->done() && std::chrono::steady_clock::now() < deadline) schedule->advance();
  ASSERT_TRUE(schedule->done());
  schedule.reset();
  EXPECT_LT(dropTimed(call), halfSlowMs);
  const int pinned = fake->pinnedAllocations();
  auto next = newCall();
  EXPECT_NE(next->host(), first) << "the block was lent while its copy back read it";
  EXPECT_EQ(fake->pinnedAllocations(), pinned + 1);
  next.reset();
  fake->drain(staging->toDevice());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], 2.0f * static_cast<float>(i)) << i;

  // 2. Inputs queued, never copied back (a call that failed mid-way).
  call = newCall();
  call->copyInputs();
  char* second = call->host();
  EXPECT_LT(dropTimed(call), halfSlowMs);
  next = newCall();
  EXPECT_NE(next->host(), second) << "the block was lent while the copy to the host wrote it";
  next.reset();

  // Once the copies ran, the retired blocks serve later calls again.
  fake->drain(staging->toHost());
  fake->drain(staging->toDevice());
  const int settled = fake->pinnedAllocations();
  for (int i = 0; i < 3; ++i) newCall();
  EXPECT_EQ(fake->pinnedAllocations(), settled);
}

// ---- bad input: an error that names the problem on the caller, and a
// RemoteError (never a hang) on the others ---------------------------------

namespace {

void expectOnCallerAndRemoteElsewhere(const Outcome& out, int caller, ErrorCode code, const std::string& text) {
  for (size_t r = 0; r < out.what.size(); ++r) {
    if (static_cast<int>(r) == caller) {
      EXPECT_EQ(out.code[r], static_cast<int>(code)) << out.what[r];
      EXPECT_TRUE(contains(out.what[r], text)) << out.what[r];
    } else {
      EXPECT_EQ(out.code[r], static_cast<int>(ErrorCode::kRemote)) << r << ": " << out.what[r];
    }
    EXPECT_LT(out.seconds[r], 10.0) << r;
  }
}

/// Two ranks, one device failure: the rank that met it has a DeviceError
/// naming `cuda`, the other a RemoteError naming it too; both within 6 s.
void expectOneDeviceErrorAndItsRemote(const Outcome& out, const std::string& cuda) {
  int device = 0, remote = 0;
  for (size_t r = 0; r < 2; ++r) {
    device += out.code[r] == static_cast<int>(ErrorCode::kDevice) && contains(out.what[r], cuda);
    remote += out.code[r] == static_cast<int>(ErrorCode::kRemote) && contains(out.what[r], cuda);
    EXPECT_LT(out.seconds[r], 6.0) << r;
  }
  EXPECT_EQ(device, 1) << out.what[0] << "\n" << out.what[1];
  EXPECT_EQ(remote, 1) << out.what[0] << "\n" << out.what[1];
}

}  // namespace

TEST(DeviceErrors, HostAndDeviceBuffersMixedInOneCall) {
  FakeDevice::Installed fake;
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* d = fake->allocate<float>(0, 16);
    std::vector<float> h(16, 1.0f);
    if (ctx.rank == 1) ctx.comm.allreduce(h.data(), d, 16, DataType::kFloat32, ReduceOp::kSum);
    ctx.comm.allreduce(d, d, 16, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  expectOnCallerAndRemoteElsewhere(out, 1, ErrorCode::kInvalidArgument,
                                   "the input is host memory but the output is device memory (device 0)");
}

TEST(DeviceErrors, BuffersOnTwoDevicesInOneCallOrOnAnotherDeviceThanTheFirstCall) {
  FakeDevice::Installed fake;
  Outcome out = perRank(2, [&](RankContext& ctx) {
    float* a = fake->allocate<float>(0, 16);
    float* b = fake->allocate<float>(1, 16);
    if (ctx.rank == 0) ctx.comm.allreduce(a, b, 16, DataType::kFloat32, ReduceOp::kSum);
    ctx.comm.allreduce(a, a, 16, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  expectOnCallerAndRemoteElsewhere(out, 0, ErrorCode::kInvalidArgument,
                                   "the input is device memory (device 0) but the output is device memory (device 1)");
  out = perRank(2, [&](RankContext& ctx) {
    float* a = fake->allocate<float>(0, 16);
    float* b = fake->allocate<float>(1, 16);
    ctx.comm.allreduce(a, a, 16, DataType::kFloat32, ReduceOp::kSum).wait();
    if (ctx.rank == 1) ctx.comm.allreduce(b, b, 16, DataType::kFloat32, ReduceOp::kSum);
    ctx.comm.allreduce(a, a, 16, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  expectOnCallerAndRemoteElsewhere(out, 1, ErrorCode::kInvalidArgument,
                                   "this communicator serves device 0 (the device of its first call on device memory");
}

TEST(DeviceErrors, AStreamOfAnotherDevice) {
  FakeDevice::Installed fake;
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* a = fake->allocate<float>(0, 16);
    void* other = fake->createStream(1);
    CollectiveOptions o;
    if (ctx.rank == 0) o.stream = other;
    try {
      ctx.comm.allreduce(a, a, 16, DataType::kFloat32, ReduceOp::kSum, o).wait();
    } catch (...) {
      fake->destroyStream(other);
      throw;
    }
    fake->destroyStream(other);
  });
  expectOnCallerAndRemoteElsewhere(out, 0, ErrorCode::kInvalidArgument,
                                   "CollectiveOptions::stream belongs to device 1 but the buffers are on device 0");
}

// A null stream is the default stream of the buffers' device, not of the
// device the calling thread has current (a PyTorch script that moves its
// tensors to cuda:N without torch.cuda.set_device). The call runs with the
// buffers' device current and leaves the thread's device as it found it.
TEST(Device, ANullStreamIsTheDefaultStreamOfTheBuffersDevice) {
  FakeDevice::Installed fake;
  runRanks(2, [&](RankContext& ctx) {
    ASSERT_EQ(fake->currentDevice(), 0);
    float* a = fake->allocate<float>(1, 1000);
    for (size_t i = 0; i < 1000; ++i) a[i] = static_cast<float>(ctx.rank + i % 5);
    Work w = ctx.comm.allreduce(a, a, 1000, DataType::kFloat32, ReduceOp::kSum, {});
    EXPECT_EQ(fake->currentDevice(), 0);
    w.wait();
    fake->setCurrentDevice(1);
    fake->drain(nullptr);  // device 1's default stream
    fake->setCurrentDevice(0);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(a[i], 1.0f + 2.0f * static_cast<float>(i % 5)) << i;
  }, quick());
}

// A staged call's result is copied back once the caller's work before
// that call is done, not once the caller's stream reached a later call:
// here the caller's stream is held (a gate kernel) after the first call and
// before the second, and the first still completes.
TEST(Device, AStagedCallCompletesWhileTheCallersStreamHoldsALaterCall) {
  FakeDevice::Installed fake;
  runRanks(2, [&](RankContext& ctx) {
    auto stream = fake->ownedStream(0);
    CollectiveOptions o;
    o.stream = stream.get();
    float* a = fake->allocate<float>(0, 64);
    float* b = fake->allocate<float>(0, 64);
    std::fill(a, a + 64, 1.0f);
    std::fill(b, b + 64, 2.0f);
    Work first = ctx.comm.allreduce(a, a, 64, DataType::kFloat32, ReduceOp::kSum, o);
    std::atomic<bool> open{false};
    fake->launch(stream.get(), [&open] {
      while (!open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    Work second = ctx.comm.allreduce(b, b, 64, DataType::kFloat32, ReduceOp::kSum, o);
    const bool done = first.wait(std::chrono::seconds(20));
    open = true;
    ASSERT_TRUE(done) << "the first call waited for the caller's stream to reach the second";
    second.wait();
    fake->drain(stream.get());
    EXPECT_EQ(a[0], 2.0f);
    EXPECT_EQ(b[63], 4.0f);
  }, quick());
}

// A device send copies its buffer out after the work already queued on the
// device's default stream (a kernel that produces the data), not before it.
TEST(Device, ADeviceSendReadsItsBufferAfterTheDefaultStreamsEarlierWork) {
  FakeDevice::Installed fake;
  runRanks(2, [&](RankContext& ctx) {
    float* d = fake->allocate<float>(0, 256);
    if (ctx.rank == 0) {
      std::fill(d, d + 256, -1.0f);
      fake->launch(nullptr, [d] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        for (size_t i = 0; i < 256; ++i) d[i] = static_cast<float>(i);
      });
      ctx.comm.send(d, 256, DataType::kFloat32, 1).wait();
    } else {
      ctx.comm.recv(d, 256, DataType::kFloat32, 0).wait();
      for (size_t i = 0; i < 256; ++i) ASSERT_EQ(d[i], static_cast<float>(i)) << i;
    }
  }, quick());
}

// Calls of ever-changing sizes (each too small for the blocks cached
// before) must not grow the pinned cache without bound.
TEST(Device, ThePinnedBlockCacheStaysBoundedWhenSizesVary) {
  FakeDevice::Installed fake;
  detail::DeviceStaging staging(device::sharedRuntime(), 0);
  const int before = fake->pinnedHeld();
  size_t bytes = size_t{1} << 24;
  for (int k = 0; k < 12; ++k, bytes = bytes * 2 / 5) {
    size_t capacity = 0;
    void* block = staging.acquire(bytes, &capacity);
    ASSERT_NE(block, nullptr);
    staging.release(block, capacity);
  }
  EXPECT_GT(fake->pinnedAllocations(), static_cast<int>(detail::DeviceStaging::kMaxCachedBlocks));
  EXPECT_LE(fake->pinnedHeld() - before, static_cast<int>(detail::DeviceStaging::kMaxCachedBlocks));
}

// Point-to-point takes device buffers: they move through host memory, a
// send's data copied out when the call is made (so the caller may reuse
// the buffer at once), a receive's copied in before the Work is done; one
// batch may mix device and host buffers, and either side of a transfer
// may be on the device.
TEST(Device, PointToPointMovesDeviceBuffersThroughHostMemory) {
  FakeDevice::Installed fake;
  fake->setCopyDelay(std::chrono::microseconds(200));
  constexpr size_t n = 1000;
  runRanks(2, [&](RankContext& ctx) {
    using T = Communicator::Transfer;
    const int me = ctx.rank, peer = 1 - ctx.rank;
    float* dsend = fake->allocate<float>(0, n);
    float* drecv = fake->allocate<float>(0, n);
    std::vector<float> hsend(n), hrecv(n, -1.0f), hrecv2(n, -1.0f);
    for (size_t i = 0; i < n; ++i) {
      dsend[i] = static_cast<float>(me * 10000 + static_cast<int>(i));
      hsend[i] = -dsend[i];
    }
    Work w = ctx.comm.pointToPoint({T::send(dsend, n, DataType::kFloat32, peer, 0),
                                    T::recv(drecv, n, DataType::kFloat32, peer, 0),
                                    T::send(hsend.data(), n, DataType::kFloat32, peer, 1),
                                    T::recv(hrecv.data(), n, DataType::kFloat32, peer, 1),
                                    T::send(dsend, n, DataType::kFloat32, peer, 2),
                                    T::recv(hrecv2.data(), n, DataType::kFloat32, peer, 2)});
    std::fill(dsend, dsend + n, 7.0f);  // copied out already
    EXPECT_TRUE(w.onDevice());
    w.wait();
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(peer * 10000 + static_cast<int>(i));
      ASSERT_EQ(drecv[i], want) << "device to device, element " << i;
      ASSERT_EQ(hrecv[i], -want) << "host to host, element " << i;
      ASSERT_EQ(hrecv2[i], want) << "device to host, element " << i;
    }
    // A host send into a device receive, through send and recv.
    std::vector<float> back(n);
    for (size_t i = 0; i < n; ++i) back[i] = static_cast<float>(i) + 0.5f;
    if (me == 0) {
      ctx.comm.send(back.data(), n, DataType::kFloat32, 1, 3).wait();
    } else {
      std::fill(drecv, drecv + n, 0.0f);
      Work r = ctx.comm.recv(drecv, n, DataType::kFloat32, 0, 3);
      auto landed = std::make_shared<std::promise<bool>>();
      std::future<bool> seen = landed->get_future();
      r.onComplete([landed, last = drecv + n - 1, want = back[n - 1]](std::exception_ptr e) {
        landed->set_value(!e && *last == want);
      });
      (void)r.test();  // asking before the data arrived is allowed
      r.wait();
      ASSERT_EQ(seen.wait_for(std::chrono::seconds(10)), std::future_status::ready);
      EXPECT_TRUE(seen.get()) << "onComplete ran before the data was in device memory";
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(drecv[i], back[i]) << "host to device, element " << i;
    }
  });
}

TEST(DeviceErrors, PointToPointOnDeviceMemoryWithoutCudaIsRefusedOnEveryRank) {
  FakeDevice::Installed fake(/*cuda=*/false);
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* d = fake->allocate<float>(0, 16);
    std::vector<float> h(16);
    if (ctx.rank == 0) {
      ctx.comm.send(d, 16, DataType::kFloat32, 1).wait();
    } else {
      ctx.comm.recv(h.data(), 16, DataType::kFloat32, 0).wait();
    }
  });
  expectOnCallerAndRemoteElsewhere(out, 0, ErrorCode::kInvalidArgument,
                                   "the buffer is device memory, but this gradcomm was built without CUDA");
}

TEST(DeviceErrors, DeviceBuffersOnABuildWithoutCuda) {
  FakeDevice::Installed fake(/*cuda=*/false);
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* a = fake->allocate<float>(0, 16);
    std::vector<float> h(16);
    if (ctx.rank == 0) ctx.comm.allreduce(a, a, 16, DataType::kFloat32, ReduceOp::kSum).wait();
    ctx.comm.allreduce(h.data(), h.data(), 16, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  expectOnCallerAndRemoteElsewhere(out, 0, ErrorCode::kUnsupported, "this gradcomm was built without CUDA");
}

TEST(Device, CompressedAllreduceOfDeviceBuffersMatchesTheReference) {
  FakeDevice::Installed fake;
  for (int p : {2, 3}) {
    runRanks(p, [&](RankContext& ctx) {
      int cases = 0;
      for (const char* compression : {"fp16", "bf16", "topk:50:exact:ef=0"}) {
        for (size_t count : {size_t{700}, size_t{5000}}) {
          for (bool inPlace : {false, true}) {
            CollectiveCase c;
            c.type = DataType::kFloat32;
            c.count = count;
            c.inPlace = inPlace;
            c.compression = compression;
            c.seed = 3 + cases++;
            c.allocate = [&](size_t bytes) { return fake->allocate(0, bytes); };
            ASSERT_EQ(runAndCheck(ctx.comm, c), "") << "ranks " << p;
          }
        }
      }
    }, smallChunks());
  }
}

TEST(DeviceErrors, RanksMixingHostAndDeviceCallsFailWithAMismatchThatNamesTheMemory) {
  FakeDevice::Installed fake;
  const Outcome out = perRank(3, [&](RankContext& ctx) {
    float* a = fake->allocate<float>(0, 256);
    std::vector<float> h(256);
    void* buf = ctx.rank == 2 ? static_cast<void*>(h.data()) : static_cast<void*>(a);
    ctx.comm.allreduce(buf, buf, 256, DataType::kFloat32, ReduceOp::kSum).wait();
  });
  bool named = false;
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(out.code[r] == static_cast<int>(ErrorCode::kMismatch) ||
                out.code[r] == static_cast<int>(ErrorCode::kRemote))
        << r << ": " << out.what[r];
    named = named || contains(out.what[r], "memory differs");
    EXPECT_LT(out.seconds[r], 10.0);
  }
  EXPECT_TRUE(named) << out.what[0] << "\n" << out.what[2];
}

TEST(DeviceErrors, ADeviceErrorFailsTheCallOnEveryRankWithoutAHang) {
  FakeDevice::Installed fake;
  std::atomic<int> armed{0};
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* a = fake->allocate<float>(0, 4096);
    ctx.comm.allreduce(a, a, 4096, DataType::kFloat32, ReduceOp::kSum).wait();
    ctx.comm.barrier().wait();
    if (ctx.rank == 0 && armed.exchange(1) == 0) fake->failNextQuery();
    ctx.comm.barrier().wait();
    ctx.comm.allreduce(a, a, 4096, DataType::kFloat32, ReduceOp::kSum).wait();
  }, quick("8s"));
  expectOneDeviceErrorAndItsRemote(out, "cudaErrorIllegalAddress");
}

// ---- the NCCL engine ----------------------------------------------------------

#include "support/fake_nccl.hpp"

namespace {

Options engine(const std::string& choice) {
  Options o = quick();
  o.set("DEVICE_ENGINE", choice);
  return o;
}

/// Sums n ones over the ranks, each on a device of its own (device = rank)
/// and a stream of it; waits, and returns the Work and the result's last value.
std::pair<Work, float> sumOnesOnOwnDevice(FakeDevice& fake, RankContext& ctx, size_t n) {
  auto stream = fake.ownedStream(ctx.rank);
  CollectiveOptions o;
  o.stream = stream.get();
  float* d = fake.allocate<float>(ctx.rank, n);
  std::fill(d, d + n, 1.0f);
  Work w = ctx.comm.allreduce(d, d, n, DataType::kFloat32, ReduceOp::kSum, o);
  w.wait();
  return {w, d[n - 1]};
}

}  // namespace

TEST(DeviceEngine, RanksOnDevicesOfTheirOwnRunEveryCollectiveOnNccl) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  int expectJoined = 0;
  for (int p : {1, 2, 3}) {
    runRanks(p, [&](RankContext& ctx) {
      const int device = ctx.rank;  // a device each
      auto stream = fake->ownedStream(device);
      float* d = fake->allocate<float>(device, 64);
      CollectiveOptions o;
      o.stream = stream.get();
      Work w = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, o);
      w.wait();
      EXPECT_EQ(w.algorithm(), "nccl");
      EXPECT_TRUE(w.onDevice());
      // Its event goes back to the pool with the Work: the next calls
      // create none (but for one a rank may take before the engine let go
      // of the previous call).
      w = Work();
      ctx.barrier->wait();
      const int events = fake->eventsCreated();
      ctx.barrier->wait();
      for (int i = 0; i < 10; ++i) ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, o).wait();
      ctx.barrier->wait();
      EXPECT_LE(fake->eventsCreated(), events + p);
      int cases = 0;
      const std::string err = checkEveryCollectiveOn(
          ctx.comm, [&](size_t bytes) { return fake->allocate(device, bytes); }, {0, 1, 700}, &cases, stream.get());
      EXPECT_EQ(err, "") << "ranks " << p;
      EXPECT_GT(cases, 300);
    }, engine("auto"));
    expectJoined += p;
    EXPECT_EQ(nccl->joined(), expectJoined) << "ranks " << p;
  }
  EXPECT_GT(nccl->calls(), 900);
}

// A collective issued after a device receive runs after it, on the NCCL
// engine too (where the collective goes to the caller's stream at once):
// here it reads the received buffer, whose copy in is slow.
TEST(DeviceEngine, ACollectiveAfterADeviceReceiveReadsTheReceivedData) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  fake->setCopyDelay(std::chrono::microseconds(0), std::chrono::milliseconds(50));
  runRanks(2, [&](RankContext& ctx) {
    const int device = ctx.rank;
    auto stream = fake->ownedStream(device);
    CollectiveOptions o;
    o.stream = stream.get();
    float* d = fake->allocate<float>(device, 64);
    std::fill(d, d + 64, 1.0f);
    ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, o).wait();  // forms the NCCL engine
    Work w;
    if (ctx.rank == 0) {
      std::fill(d, d + 64, 5.0f);
      w = ctx.comm.send(d, 64, DataType::kFloat32, 1);
    } else {
      w = ctx.comm.recv(d, 64, DataType::kFloat32, 0);
    }
    Work sum = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, o);
    EXPECT_EQ(sum.algorithm(), "nccl");
    sum.wait();
    w.wait();
    fake->drain(stream.get());
    EXPECT_EQ(d[0], 10.0f);
    EXPECT_EQ(d[63], 10.0f);
  }, engine("auto"));
}

TEST(DeviceEngine, RanksSharingADeviceAreStagedAndForcingNcclFailsOnEveryRankWithTheReason) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  runRanks(2, [&](RankContext& ctx) {
    float* d = fake->allocate<float>(0, 64);  // both on device 0
    std::fill(d, d + 64, 1.0f + ctx.rank);
    Work w = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum);
    w.wait();
    EXPECT_NE(w.algorithm(), "nccl");
    EXPECT_EQ(d[63], 3.0f);
  }, engine("auto"));
  EXPECT_EQ(nccl->joined(), 0);
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* d = fake->allocate<float>(0, 64);
    ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum).wait();
  }, engine("nccl"));
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(out.code[r] == static_cast<int>(ErrorCode::kUnsupported) ||
                out.code[r] == static_cast<int>(ErrorCode::kRemote))
        << r << ": " << out.what[r];
    EXPECT_TRUE(contains(out.what[r], "ranks 0 and 1 share one device")) << r << ": " << out.what[r];
    EXPECT_LT(out.seconds[r], 10.0) << r;
  }
  EXPECT_EQ(nccl->joined(), 0);
}

TEST(DeviceEngine, ARankThatCannotOpenNcclStagesEveryRankOrNamesItselfWhenNcclIsForced) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  runRanks(3, [&](RankContext& ctx) {
    nccl->unavailableOnThisThread(ctx.rank == 1 ? "libnccl.so.2: cannot open shared object file" : "");
    const auto [w, last] = sumOnesOnOwnDevice(*fake.fake, ctx, 32);
    EXPECT_NE(w.algorithm(), "nccl");
    EXPECT_EQ(last, 3.0f);
  }, engine("auto"));
  EXPECT_EQ(nccl->joined(), 0);
  const Outcome out = perRank(3, [&](RankContext& ctx) {
    nccl->unavailableOnThisThread(ctx.rank == 1 ? "libnccl.so.2: cannot open shared object file" : "");
    auto stream = fake->ownedStream(ctx.rank);
    CollectiveOptions o;
    o.stream = stream.get();
    float* d = fake->allocate<float>(ctx.rank, 32);
    ctx.comm.allreduce(d, d, 32, DataType::kFloat32, ReduceOp::kSum, o).wait();
  }, engine("nccl"));
  for (size_t r = 0; r < 3; ++r) {
    // Each rank reaches the verdict itself (rank 1 gives its own reason,
    // the others name rank 1), unless another rank failed the communicator
    // first: then that rank's verdict arrives as a RemoteError.
    const std::string& what = out.what[r];
    const bool remote = out.code[r] == static_cast<int>(ErrorCode::kRemote);
    const bool own = contains(what, "libnccl.so.2: cannot open shared object file");
    const bool named = contains(what, "rank 1 cannot open NCCL");
    EXPECT_TRUE(contains(what, "GRADCOMM_DEVICE_ENGINE=nccl, but")) << r << ": " << what;
    EXPECT_TRUE(remote ? own || named : (r == 1 ? own : named)) << r << ": " << what;
    EXPECT_LT(out.seconds[r], 10.0) << r;
  }
}

TEST(DeviceEngine, TheCallIsOrderedAfterTheCallersStreamAndSynchronizeOrdersAnotherStreamAfterIt) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  runRanks(2, [&](RankContext& ctx) {
    const int device = ctx.rank;
    auto owned = fake->ownedStream(device), ownedLater = fake->ownedStream(device);
    void* stream = owned.get();
    void* later = ownedLater.get();
    float* d = fake->allocate<float>(device, 256);
    CollectiveOptions o;
    o.stream = stream;
    // The first call chooses the engine; the next is the one under test.
    ctx.comm.allreduce(d, d, 256, DataType::kFloat32, ReduceOp::kSum, o).wait();
    // A slow "kernel" writes the input; the call must read what it wrote.
    fake->launch(stream, [d] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::fill(d, d + 256, 2.0f);
    });
    Work w = ctx.comm.allreduce(d, d, 256, DataType::kFloat32, ReduceOp::kSum, o);
    EXPECT_EQ(w.algorithm(), "nccl");
    std::atomic<float> seen{0.0f};
    const auto before = std::chrono::steady_clock::now();
    w.synchronize(later);
    fake->launch(later, [d, &seen] { seen = d[255]; });
    // synchronize() did not wait for the 50 ms kernel on the host.
    EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(40));
    fake->drain(later);
    EXPECT_EQ(seen.load(), 4.0f);
    EXPECT_TRUE(w.test());
  }, engine("auto"));
}

TEST(DeviceEngine, CallsThatDifferBetweenRanksFailNamedOnEveryRankAndTheirKernelsEnd) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  const Outcome out = perRank(3, [&](RankContext& ctx) {
    const int device = ctx.rank;
    auto owned = fake->ownedStream(device);
    void* stream = owned.get();
    float* d = fake->allocate<float>(device, 64);
    CollectiveOptions o;
    o.stream = stream;
    ctx.comm.allreduce(d, d, 16, DataType::kFloat32, ReduceOp::kSum, o).wait();
    // Rank 2 passes another count: NCCL itself would hang.
    Work w = ctx.comm.allreduce(d, d, ctx.rank == 2 ? 32 : 16, DataType::kFloat32, ReduceOp::kSum, o);
    try {
      w.wait();
    } catch (...) {
      fake->drain(stream);  // the kernel ended: the group was aborted
      throw;
    }
  }, engine("auto"));
  bool named = false;
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(out.code[r] == static_cast<int>(ErrorCode::kMismatch) ||
                out.code[r] == static_cast<int>(ErrorCode::kRemote))
        << r << ": " << out.what[r];
    named = named || contains(out.what[r], "count differs");
    EXPECT_LT(out.seconds[r], 10.0) << r;
  }
  EXPECT_TRUE(named) << out.what[0] << "\n" << out.what[2];
}

TEST(DeviceEngine, CompressedCallsRunOnNcclAndForcedStagingTakesTheStagedPath) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  runRanks(2, [&](RankContext& ctx) {
    auto stream = fake->ownedStream(ctx.rank);
    float* d = fake->allocate<float>(ctx.rank, 64);
    std::fill(d, d + 64, 0.5f);
    CollectiveOptions topk;
    topk.compression = "topk:64:exact:ef=0";  // every element: exact
    topk.stream = stream.get();
    Work t = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, topk);
    t.wait();
    EXPECT_EQ(t.algorithm(), "topk:64:ef=0:exact+nccl");
    EXPECT_EQ(d[0], 1.0f);
    CollectiveOptions fp16;
    fp16.compression = "fp16";
    fp16.stream = stream.get();
    Work w = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, fp16);
    w.wait();
    EXPECT_EQ(w.algorithm(), "fp16+nccl");
    EXPECT_EQ(d[0], 2.0f);
    CollectiveOptions o;
    o.stream = stream.get();
    Work n = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, o);
    n.wait();
    EXPECT_EQ(n.algorithm(), "nccl");
    EXPECT_EQ(d[0], 4.0f);
  }, engine("auto"));
  EXPECT_EQ(nccl->joined(), 2);
  runRanks(2, [&](RankContext& ctx) {
    auto stream = fake->ownedStream(ctx.rank);
    CollectiveOptions o;
    o.stream = stream.get();
    float* d = fake->allocate<float>(ctx.rank, 64);
    Work w = ctx.comm.allreduce(d, d, 64, DataType::kFloat32, ReduceOp::kSum, o);
    w.wait();
    EXPECT_NE(w.algorithm(), "nccl");
  }, engine("staged"));
  EXPECT_EQ(nccl->joined(), 2);
}

// ---- the Reducer on device gradients ---------------------------------------

#include "gradcomm/reducer.hpp"

namespace {

/// Gradient g's element i on `rank` at `step` (small integers: sums exact).
float gradValue(int rank, int step, size_t g, size_t i) {
  return static_cast<float>((rank + 1) * (step + 1) + static_cast<int>(g) + static_cast<int>(i % 7));
}

}  // namespace

TEST(DeviceReducer, DeviceGradientsAreAveragedAfterTheCallersStreamAndBeforeItsLaterWork) {
  FakeDevice::Installed fake;
  fake->setCopyDelay(std::chrono::microseconds(200));
  const std::vector<size_t> counts{3000, 1, 0, 700, 5000};
  runRanks(2, [&](RankContext& ctx) {
    void* stream = fake->createStream(0);
    std::vector<GradientSpec> specs;
    for (size_t c : counts) specs.push_back({c, DataType::kFloat32, fake->allocate<float>(0, c)});
    ReducerOptions o;
    o.stream = stream;
    o.bucketCapBytes = 16 * 1024;
    o.firstBucketBytes = 4 * 1024;
    o.partitionBytes = 8 * 1024;
    {
      Reducer reducer(ctx.comm, specs, o);
      for (int step = 0; step < 4; ++step) {
        for (size_t g = counts.size(); g-- > 0;) {
          // A slow "backward kernel" writes the gradient; markReady follows at once.
          auto* data = static_cast<float*>(specs[g].data);
          const size_t n = counts[g];
          const int rank = ctx.rank;
          fake->launch(stream, [=] {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            for (size_t i = 0; i < n; ++i) data[i] = gradValue(rank, step, g, i);
          });
          reducer.markReady(g);
        }
        reducer.finalize();
        // Read on the caller's stream, as the optimizer's kernels would.
        std::vector<std::vector<float>> seen(counts.size());
        fake->launch(stream, [&] {
          for (size_t g = 0; g < counts.size(); ++g) {
            const auto* d = static_cast<const float*>(specs[g].data);
            seen[g].assign(d, d + counts[g]);
          }
        });
        fake->drain(stream);
        for (size_t g = 0; g < counts.size(); ++g) {
          for (size_t i = 0; i < counts[g]; ++i) {
            const float want = (gradValue(0, step, g, i) + gradValue(1, step, g, i)) / 2;
            ASSERT_EQ(seen[g][i], want) << "step " << step << " gradient " << g << " element " << i;
          }
        }
      }
    }
    fake->destroyStream(stream);
  }, quick());
}

TEST(DeviceReducer, GradientsComputedIntoDeviceBucketViews) {
  FakeDevice::Installed fake;
  runRanks(3, [&](RankContext& ctx) {
    const std::vector<size_t> counts{100, 2000, 33};
    std::vector<GradientSpec> specs;
    for (size_t c : counts) specs.push_back({c, DataType::kFloat32, nullptr});
    ReducerOptions o;
    o.gradientAsBucketView = true;
    o.device = 0;
    o.average = false;
    Reducer reducer(ctx.comm, specs, o);
    for (int step = 0; step < 3; ++step) {
      for (size_t g = 0; g < counts.size(); ++g) {
        auto* d = static_cast<float*>(reducer.gradient(g));
        ASSERT_TRUE(fake->classify(d).device);
        const size_t n = counts[g];
        const int rank = ctx.rank;
        fake->launch(nullptr, [=] {
          for (size_t i = 0; i < n; ++i) d[i] = gradValue(rank, step, g, i);
        });
        reducer.markReady(g);
      }
      reducer.finalize();
      fake->drain(nullptr);
      for (size_t g = 0; g < counts.size(); ++g) {
        const auto* d = static_cast<const float*>(reducer.gradient(g));
        for (size_t i = 0; i < counts[g]; ++i) {
          const float want = gradValue(0, step, g, i) + gradValue(1, step, g, i) + gradValue(2, step, g, i);
          ASSERT_EQ(d[i], want) << "step " << step << " gradient " << g << " element " << i;
        }
      }
    }
  }, quick());
}

TEST(DeviceReducer, HostAndDeviceGradientsMixedAreRefusedAndCompressedDeviceBucketsAreExact) {
  FakeDevice::Installed fake;
  runRanks(2, [&](RankContext& ctx) {
    std::vector<float> host(10);
    std::vector<GradientSpec> mixed{{10, DataType::kFloat32, host.data()},
                                    {10, DataType::kFloat32, fake->allocate<float>(0, 10)}};
    try {
      Reducer r(ctx.comm, mixed, {});
      ADD_FAILURE() << "mixed gradients were accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), "gradient 0 is host memory but gradient 1 is device memory (device 0)"))
          << e.what();
    }
    // fp16 carries small integers exactly: the average is the reference.
    auto* d = fake->allocate<float>(0, 1000);
    std::vector<GradientSpec> onDevice{{1000, DataType::kFloat32, d}};
    ReducerOptions o;
    o.compression = "fp16";
    Reducer r(ctx.comm, onDevice, o);
    for (size_t i = 0; i < 1000; ++i) d[i] = static_cast<float>(2 * ctx.rank + (i % 9));
    r.markReady(0);
    r.finalize();
    fake->drain(nullptr);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(d[i], 1.0f + (i % 9)) << i;
  }, quick());
}

// Rebuilding the buckets moves every gradient's carried error to its new
// place; on device buckets the residuals are device memory and must stay
// so. The host Reducer is the reference, bit for bit (the fake runtime's
// compressors are the CPU ones).
TEST(DeviceReducer, TopKErrorFeedbackOnDeviceBucketsCarriesAcrossARebuildAsOnTheHost) {
  FakeDevice::Installed fake;
  const std::vector<size_t> counts{300, 7, 1200, 64, 500};
  runRanks(2, [&](RankContext& ctx) {
    std::vector<std::vector<float>> host;
    host.reserve(counts.size());
    std::vector<GradientSpec> hostSpecs, deviceSpecs;
    for (size_t c : counts) {
      host.emplace_back(c);
      hostSpecs.push_back({c, DataType::kFloat32, host.back().data()});
      deviceSpecs.push_back({c, DataType::kFloat32, fake->allocate<float>(0, c)});
    }
    ReducerOptions o;
    o.compression = "topk:0.1";  // error feedback on by default
    o.bucketCapBytes = 3 * 1024;
    o.firstBucketBytes = 1024;
    o.partitionBytes = 1024;
    Reducer onHost(ctx.comm, hostSpecs, o), onDevice(ctx.comm, deviceSpecs, o);
    for (int step = 0; step < 5; ++step) {
      // Marked in registration order: the buckets are rebuilt after step 0.
      for (size_t g = 0; g < counts.size(); ++g) {
        auto* d = static_cast<float*>(deviceSpecs[g].data);
        for (size_t i = 0; i < counts[g]; ++i) {
          d[i] = host[g][i] = std::cos(static_cast<float>(131 * g + i)) * static_cast<float>(ctx.rank + step + 1);
        }
        onHost.markReady(g);
      }
      onHost.finalize();
      for (size_t g = 0; g < counts.size(); ++g) onDevice.markReady(g);
      onDevice.finalize();
      fake->drain(nullptr);
      for (size_t g = 0; g < counts.size(); ++g) {
        const auto* d = static_cast<const float*>(deviceSpecs[g].data);
        for (size_t i = 0; i < counts[g]; ++i) {
          ASSERT_EQ(bitsOf(d[i]), bitsOf(host[g][i])) << "step " << step << " gradient " << g << " element " << i;
        }
      }
    }
  }, quick());
}

// ---- compressed allreduce on the device --------------------------------------
// The fake runtime's compressors are the CPU ones run as kernels on its
// streams (and refusing host pointers), so the device path (compress on
// the device, payloads through pinned memory, decompress on the device)
// must give the host path's result bit for bit.

#include <random>

namespace {

/// Gradients of `rank` at `step`: normally distributed, so casts round and
/// top-k has no ties.
std::vector<float> gradients(size_t n, int rank, int step) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * rank + step + 17));
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

/// Runs `steps` compressed allreduces of the same gradients on host and on
/// device buffers of `device` (each with its own ErrorFeedback) and says
/// where they differ ("" when bit for bit equal, residuals included);
/// the device calls' algorithm must end with `engine` ("+nccl"; "" for
/// any).
std::string compareHostAndDevice(Communicator& comm, FakeDevice& fake, int rank, const std::string& compression,
                                 ReduceOp op, size_t n, int steps, int device = 0, const std::string& engine = "") {
  ErrorFeedback hostEf, deviceEf;
  CollectiveOptions ho, dopt;
  ho.compression = dopt.compression = compression;
  ho.errorFeedback = &hostEf;
  dopt.errorFeedback = &deviceEf;
  auto stream = fake.ownedStream(device);
  dopt.stream = stream.get();
  const std::string what = compression + " " + toString(op) + " n=" + std::to_string(n);
  float* din = fake.allocate<float>(device, n);
  float* dout = fake.allocate<float>(device, n);
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> g = gradients(n, rank, step);
    std::vector<float> hout(n, -1.0f);
    if (n) std::memcpy(din, g.data(), n * sizeof(float));
    // In place on odd steps.
    float* dst = step % 2 ? din : dout;
    comm.allreduce(g.data(), hout.data(), n, DataType::kFloat32, op, ho).wait();
    Work w = comm.allreduce(din, dst, n, DataType::kFloat32, op, dopt);
    w.wait();
    if (!w.onDevice()) return what + ": the device call did not run on the device";
    const std::string ran = w.algorithm();
    if (ran.size() < engine.size() || ran.compare(ran.size() - engine.size(), engine.size(), engine) != 0) {
      return what + ": ran as " + ran + ", not on the engine " + engine;
    }
    if (n && std::memcmp(hout.data(), dst, n * sizeof(float)) != 0) {
      for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(&hout[i], &dst[i], sizeof(float)) != 0) {
          return what + " step " + std::to_string(step) + " element " + std::to_string(i) + ": host " +
                 std::to_string(hout[i]) + ", device " + std::to_string(dst[i]);
        }
      }
    }
  }
  if (hostEf.size() != deviceEf.size()) return what + ": residual sizes differ";
  if (hostEf.size()) {
    if (hostEf.device() != -1 || deviceEf.device() != device || !fake.classify(deviceEf.data()).device) {
      return what + ": residuals are not where their calls ran";
    }
    if (std::memcmp(hostEf.data(), deviceEf.data(), n * sizeof(float)) != 0) return what + ": residuals differ";
  }
  return "";
}

}  // namespace

TEST(DeviceCompression, DeviceCompressedAllreduceEqualsTheHostOneBitForBit) {
  FakeDevice::Installed fake;
  for (int p : {2, 3}) {
    runRanks(p, [&](RankContext& ctx) {
      for (const char* compression : {"fp16", "bf16", "fp16:prescale", "bf16:ef=1", "fp16:ef=1:prescale",
                                      "topk:50:exact:ef=0", "topk:0.1:exact"}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) {
            ASSERT_EQ(compareHostAndDevice(ctx.comm, *fake.fake, ctx.rank, compression, op, n, 3), "")
                << "ranks " << p;
          }
        }
      }
    }, smallChunks());
  }
  // The device path ran the device compressors (not the host ones on a copy).
  EXPECT_GT(fake->compressions(), 0);
}

// With the NCCL engine (a device per rank) fp16/bf16 payloads are summed by
// ncclAllReduce on the caller's stream; the test NCCL sums them as the host
// algorithms do (float32 accumulation, rank order), so two ranks give the
// host path's result bit for bit, residuals included. Top-k slots are
// gathered by ncclAllGather and added in rank order, as on the host.
TEST(DeviceCompression, CastPayloadsAreSummedByTheNcclEngineAsOnTheHost) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  runRanks(2, [&](RankContext& ctx) {
    for (const char* compression : {"fp16", "bf16", "fp16:prescale", "bf16:ef=1", "fp16:ef=1:prescale"}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) {
          ASSERT_EQ(compareHostAndDevice(ctx.comm, *fake.fake, ctx.rank, compression, op, n, 3, ctx.rank, "+nccl"), "");
        }
      }
    }
    for (const char* topk : {"topk:50:exact", "topk:0.1:exact:ef=0"}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (size_t n : {size_t{0}, size_t{1000}}) {
          ASSERT_EQ(compareHostAndDevice(ctx.comm, *fake.fake, ctx.rank, topk, op, n, 2, ctx.rank, "+nccl"), "");
        }
      }
    }
  }, engine("auto"));
  EXPECT_EQ(nccl->joined(), 2);
  EXPECT_GT(fake->compressions(), 0);
  // Three ranks: exact small integers, whatever the order of the sum.
  runRanks(3, [&](RankContext& ctx) {
    auto stream = fake->ownedStream(ctx.rank);
    float* d = fake->allocate<float>(ctx.rank, 300);
    for (size_t i = 0; i < 300; ++i) d[i] = static_cast<float>(ctx.rank + (i % 7));
    CollectiveOptions o;
    o.stream = stream.get();
    o.compression = "bf16:ef=0";
    Work w = ctx.comm.allreduce(d, d, 300, DataType::kFloat32, ReduceOp::kAvg, o);
    w.wait();
    EXPECT_EQ(w.algorithm(), "bf16+nccl");
    for (size_t i = 0; i < 300; ++i) ASSERT_EQ(d[i], 1.0f + static_cast<float>(i % 7)) << i;
  }, engine("auto"));
  EXPECT_EQ(nccl->joined(), 5);
}

// A malformed top-k slot that came through NCCL: the check queued behind the
// decompression fails the call on every rank, naming the slot's rank (the
// gathered payloads are the same everywhere; a rank may hear it from the
// other first), even where the caller only orders a stream after the call
// (synchronize, as the PyTorch backend does: it waits for the check before
// the stream goes on); test() keeps saying so, and, as for any failed
// device call, the communicator is failed: a later call is an error.
TEST(DeviceCompression, AMalformedTopKSlotOnTheNcclEngineFailsTheCallOnEveryRankNamingItsRank) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  nccl->onAllgatherResult([](char* result, size_t bytes, int) {
    std::memset(result + bytes / 2, 0xff, 8);  // the header of rank 1's slot (of 2)
  });
  std::vector<std::string> errors(2);
  runRanks(2, [&](RankContext& ctx) {
    auto stream = fake->ownedStream(ctx.rank);
    float* d = fake->allocate<float>(ctx.rank, 100);
    std::fill(d, d + 100, 1.0f);
    CollectiveOptions o;
    o.stream = stream.get();
    o.compression = "topk:10:exact:ef=0";
    Work w = ctx.comm.allreduce(d, d, 100, DataType::kFloat32, ReduceOp::kSum, o);
    EXPECT_EQ(w.algorithm(), "topk:10:ef=0:exact+nccl");
    try {
      w.synchronize(stream.get());
    } catch (const Error& e) {
      errors[static_cast<size_t>(ctx.rank)] = e.what();
    }
    EXPECT_ANY_THROW(w.test());
    EXPECT_ANY_THROW(ctx.comm.allreduce(d, d, 100, DataType::kFloat32, ReduceOp::kSum, o).wait());
  }, engine("auto"));
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("on NCCL: payload of rank 1: top-k payload claims"), std::string::npos)
        << r << ": " << errors[r];
  }
}

// A Work dropped while its kernels still run on the device: its payload
// block is not handed to a call on another stream before they finished
// (that call would overwrite the payload under them); it goes back after.
// Rank 1 holds its first call's stream, so rank 0's NCCL sum of it waits
// with the compressed payload in its block while rank 0 issues a second
// call on another stream.
TEST(DeviceCompression, ANcclCallsPayloadBlockOutlivesAWorkDroppedBeforeItsKernelsRan) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  runRanks(2, [&](RankContext& ctx) {
    auto first = fake->ownedStream(ctx.rank), second = fake->ownedStream(ctx.rank);
    constexpr size_t n = 512;
    float* x = fake->allocate<float>(ctx.rank, n);
    float* y = fake->allocate<float>(ctx.rank, n);
    CollectiveOptions o;
    o.compression = "fp16";
    o.stream = second.get();
    ctx.comm.allreduce(y, y, n, DataType::kFloat32, ReduceOp::kSum, o).wait();  // the engine is chosen
    ctx.comm.barrier().wait();  // the engine let go of that call: its block is back
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 100), y[i] = 100.0f + static_cast<float>(i % 50);
    std::atomic<bool> open{false};
    if (ctx.rank == 1) {
      fake->launch(first.get(), [&] {
        while (!open.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      });
    }
    o.stream = first.get();
    ctx.comm.allreduce(x, x, n, DataType::kFloat32, ReduceOp::kSum, o);  // dropped at once
    ctx.comm.barrier().wait();  // its host part finished: nothing holds it
    ctx.barrier->wait();
    const int blocks = fake->deviceAllocations();
    ctx.barrier->wait();
    o.stream = second.get();
    ctx.comm.allreduce(y, y, n, DataType::kFloat32, ReduceOp::kSum, o).wait();
    ctx.barrier->wait();
    EXPECT_EQ(fake->deviceAllocations(), blocks + 2) << "each rank's second call takes a block of its own";
    open = true;
    fake->drain(first.get());
    ctx.comm.barrier().wait();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(x[i], 2.0f * static_cast<float>(i % 100)) << i;
      ASSERT_EQ(y[i], 200.0f + 2.0f * static_cast<float>(i % 50)) << i;
    }
  }, engine("auto"));
}

TEST(DeviceCompression, ErrorFeedbackIsCarriedAcrossCallsInDeviceMemory) {
  FakeDevice::Installed fake;
  runRanks(2, [&](RankContext& ctx) {
    // top-1 of the same four values on both ranks: what is not sent waits
    // in the residual and wins a later step.
    const float g[4] = {4, 3, 2, 1};
    float* d = fake->allocate<float>(0, 4);
    ErrorFeedback ef;
    CollectiveOptions o;
    o.compression = "topk:1:exact";
    o.errorFeedback = &ef;
    const float want[3][4] = {{8, 0, 0, 0}, {0, 12, 0, 0}, {16, 0, 0, 0}};
    for (int step = 0; step < 3; ++step) {
      std::memcpy(d, g, sizeof(g));
      ctx.comm.allreduce(d, d, 4, DataType::kFloat32, ReduceOp::kSum, o).wait();
      for (int i = 0; i < 4; ++i) ASSERT_EQ(d[i], want[step][i]) << "step " << step << " element " << i;
    }
    ASSERT_EQ(ef.size(), 4u);
    EXPECT_EQ(ef.device(), 0);
    EXPECT_TRUE(fake->classify(ef.data()).device);
    const float residual[4] = {0, 3, 6, 3};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ef.data()[i], residual[i]) << i;
    // clear() forgets it, place included: the tensor may move to the host.
    ef.clear();
    EXPECT_EQ(ef.device(), -1);
    float h[4] = {4, 3, 2, 1};
    ctx.comm.allreduce(h, h, 4, DataType::kFloat32, ReduceOp::kSum, o).wait();
    EXPECT_EQ(h[0], 8.0f);
    EXPECT_EQ(ef.device(), -1);
  }, quick());
}

namespace {

/// Each rank makes a residual with a call on host (or device) buffers and
/// then passes it with device (or host) buffers; the rank other than
/// `caller` passes a new ErrorFeedback the second time, so only `caller` errs.
Outcome residualMovedBetweenMemories(FakeDevice& fake, bool firstOnDevice, const char* compression, int caller) {
  return perRank(2, [&](RankContext& ctx) {
    float* d = fake.allocate<float>(0, 64);
    std::vector<float> h(64, 1.0f);
    ErrorFeedback ef, fresh;
    CollectiveOptions o;
    o.compression = compression;
    o.errorFeedback = &ef;
    float* first = firstOnDevice ? d : h.data();
    float* second = firstOnDevice ? h.data() : d;
    ctx.comm.allreduce(first, first, 64, DataType::kFloat32, ReduceOp::kSum, o).wait();
    if (ctx.rank != caller) o.errorFeedback = &fresh;
    ctx.comm.allreduce(second, second, 64, DataType::kFloat32, ReduceOp::kSum, o).wait();
  });
}

}  // namespace

TEST(DeviceCompressionErrors, AHostResidualWithDeviceBuffers) {
  FakeDevice::Installed fake;
  expectOnCallerAndRemoteElsewhere(residualMovedBetweenMemories(*fake.fake, false, "topk:4:exact", 0), 0,
                                   ErrorCode::kInvalidArgument, "the error-feedback residual lives in host memory");
}

TEST(DeviceCompressionErrors, ADeviceResidualWithHostBuffers) {
  FakeDevice::Installed fake;
  expectOnCallerAndRemoteElsewhere(residualMovedBetweenMemories(*fake.fake, true, "fp16:ef=1", 1), 1,
                                   ErrorCode::kInvalidArgument,
                                   "the error-feedback residual lives in device memory (device 0)");
}

TEST(DeviceCompressionErrors, ADeviceErrorDuringCompressionFailsTheCallOnEveryRankWithoutAHang) {
  FakeDevice::Installed fake;
  std::atomic<int> armed{0};
  const Outcome out = perRank(2, [&](RankContext& ctx) {
    float* a = fake->allocate<float>(0, 4096);
    CollectiveOptions o;
    o.compression = "topk:0.01:exact:ef=0";
    ctx.comm.allreduce(a, a, 4096, DataType::kFloat32, ReduceOp::kSum, o).wait();
    ctx.comm.barrier().wait();
    if (armed.exchange(1) == 0) fake->failNextCompressions(1);  // whichever rank compresses first
    ctx.comm.barrier().wait();
    ctx.comm.allreduce(a, a, 4096, DataType::kFloat32, ReduceOp::kSum, o).wait();
  }, quick("8s"));
  expectOneDeviceErrorAndItsRemote(out, "cudaErrorLaunchFailure");
}

// Communicator::deviceEngine: the choice the first device call would make,
// asked on its own (gradcomm-info --tuning prints it), kept by later calls.
TEST(DeviceEngine, TheQueryNamesTheEngineAndWhyAndLaterCallsTakeIt) {
  FakeDevice::Installed fake;
  FakeNccl::Installed nccl(fake.fake);
  runRanks(2, [&](RankContext& ctx) {
    const Communicator::DeviceEngine e = ctx.comm.deviceEngine(ctx.rank);
    EXPECT_EQ(e.engine, "nccl");
    EXPECT_TRUE(contains(e.why, "device of its own")) << e.why;
    const auto [w, last] = sumOnesOnOwnDevice(*fake.fake, ctx, 8);
    EXPECT_EQ(w.algorithm(), "nccl");
    EXPECT_EQ(last, 2.0f);
    EXPECT_EQ(ctx.comm.deviceEngine(ctx.rank).engine, "nccl");  // asked again: the same
  }, engine("auto"));
  EXPECT_EQ(nccl->joined(), 2);
  runRanks(2, [&](RankContext& ctx) {
    const Communicator::DeviceEngine e = ctx.comm.deviceEngine();  // both on the current device, 0
    EXPECT_EQ(e.engine, "staged");
    EXPECT_TRUE(contains(e.why, "ranks 0 and 1 share one device")) << e.why;
  }, engine("auto"));
  runRanks(2, [&](RankContext& ctx) {
    const Communicator::DeviceEngine e = ctx.comm.deviceEngine(ctx.rank);
    EXPECT_EQ(e.engine, "staged");
    EXPECT_EQ(e.why, "GRADCOMM_DEVICE_ENGINE=staged");
  }, engine("staged"));
  EXPECT_EQ(nccl->joined(), 2);
}

TEST(DeviceEngine, TheQueryWithoutADeviceSaysNoneOnEveryRankAndABadDeviceFailsEveryRank) {
  // This machine's runtime: no device here (or a build without CUDA).
  runRanks(2, [&](RankContext& ctx) {
    if (device::runtime().devicesPresent()) GTEST_SKIP() << "a device is present";
    const Communicator::DeviceEngine e = ctx.comm.deviceEngine();
    EXPECT_EQ(e.engine, "none");
    EXPECT_TRUE(contains(e.why, "no CUDA device") || contains(e.why, "built without CUDA")) << e.why;
    // The query was a call like any other: the next one runs.
    int v = 1;
    ctx.comm.allreduce(&v, &v, 1, DataType::kInt32, ReduceOp::kSum).wait();
    EXPECT_EQ(v, 2);
  });
  FakeDevice::Installed fake;
  const Outcome out = perRank(2, [&](RankContext& ctx) { ctx.comm.deviceEngine(ctx.rank == 1 ? -2 : 0); });
  expectOnCallerAndRemoteElsewhere(out, 1, ErrorCode::kInvalidArgument, "device -2 is not a device");
}
