// The NCCL-ABI shim through its C API, ranks as threads of this process.
// The real NCCL is replaced by fake hooks (capi/real_init.hpp), so device
// selection and real-NCCL failures can be driven without a GPU.
#include <dirent.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "capi/comm.hpp"
#include "capi/errors.hpp"
#include "capi/group.hpp"
#include "capi/real_init.hpp"
#include "gradcomm/error.hpp"

using namespace std::chrono_literals;
namespace capi = gradcomm::capi;

namespace {

/// Ranks meet on loopback, and a stall fails within the test's time
/// (unless the environment says otherwise).
const bool kEnvironment = [] {
  setenv("GRADCOMM_NCCL_ID_ADDR", "127.0.0.1", 0);
  setenv("GRADCOMM_TIMEOUT", "30s", 0);
  return true;
}();

/// The fake's notion of the calling thread's current CUDA device.
thread_local int tDevice = 0;

/// What the fake real NCCL saw of one ncclCommInitRank.
struct SeenInit {
  int device = -1;
  int cgaClusterSize = -1;
  std::string netName;
};

/// A real NCCL that works on host memory only in name: creation records
/// its arguments and hands out a fake handle; `failRank` fails.
struct FakeRealNccl {
  std::mutex mu;
  std::map<int, SeenInit> inits;  ///< by rank
  std::vector<std::pair<ncclComm_t, bool>> destroyed;
  int failRank = -1;
  int badDeviceRank = -1;  ///< this rank's device cannot be selected
  bool usable = true;
  /// Devices of one number are one GPU, as for processes on one host;
  /// otherwise every rank's device is a GPU of its own.
  bool sharedGpus = false;
  bool unknownGpus = false;  ///< no identity at all (it matches no other)
  std::atomic<int> gpus{0};
  /// Entering the real init parks a rank until its peers arrive (as NCCL's
  /// bootstrap does); this one never arrives.
  std::condition_variable peersCv;
  int entered = 0;

  capi::RealInitHooks hooks() {
    capi::RealInitHooks h;
    h.unusable = [this]() -> std::string { return usable ? "" : "fake: host memory only"; };
    h.currentDevice = [] { return tDevice; };
    h.selectDevice = [this](int device) {
      if (device == 100 + badDeviceRank) return capi::fail(ncclUnhandledCudaError, "fake: invalid device ordinal");
      return ncclSuccess;
    };
    h.deviceIdentity = [this](int device) -> std::string {
      if (unknownGpus) return "";
      return sharedGpus ? "GPU-fake-" + std::to_string(device) : "GPU-fake-own-" + std::to_string(gpus++);
    };
    h.getUniqueId = [](ncclUniqueId* id) {
      std::memset(id, 7, sizeof *id);
      return ncclSuccess;
    };
    h.initRank = [this](ncclComm_t* real, int nranks, const ncclUniqueId&, int rank, int device,
                        ncclConfig_t* config) {
      std::unique_lock<std::mutex> lock(mu);
      SeenInit& s = inits[rank];
      s.device = device;
      if (config) {
        s.cgaClusterSize = config->cgaClusterSize;
        s.netName = config->netName ? config->netName : "(null)";
      }
      if (rank == failRank) return capi::fail(ncclUnhandledCudaError, "fake: cudaSetDevice failed on this rank");
      if (device == 100 + badDeviceRank) return capi::fail(ncclUnhandledCudaError, "fake: invalid device ordinal");
      if (badDeviceRank >= 0) {
        // The real NCCL's bootstrap: wait (here at most 10 s) for every rank.
        std::unique_lock<std::mutex> wait(mu, std::defer_lock);
        lock.swap(wait);
        ++entered;
        peersCv.notify_all();
        if (!peersCv.wait_for(wait, 10s, [&] { return entered == nranks; })) {
          return capi::fail(ncclSystemError, "fake: bootstrap timed out waiting for a rank");
        }
      }
      *real = reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(0x1000 + rank));
      return ncclSuccess;
    };
    h.destroy = [this](ncclComm_t real, bool abort) {
      std::lock_guard<std::mutex> lock(mu);
      destroyed.push_back({real, abort});
    };
    return h;
  }
};

class Capi : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_.usable = false;
    previous_ = capi::setRealInitHooks(fake_.hooks());
  }
  void TearDown() override { capi::setRealInitHooks(previous_); }

  /// `n` communicators of one job, each created on its own thread.
  std::vector<ncclComm_t> makeComms(int n) {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
    std::vector<ncclComm_t> comms(n, nullptr);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        EXPECT_EQ(ncclCommInitRank(&comms[r], n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      });
    }
    for (auto& t : threads) t.join();
    return comms;
  }

  FakeRealNccl fake_;
  capi::RealInitHooks previous_;
};

/// Runs `f` on a thread; fails (and leaves the thread behind) when it takes
/// longer than `limit`.
template <typename F>
bool finishesWithin(std::chrono::seconds limit, F&& f) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::forward<F>(f));
  auto done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  return done.wait_for(limit) == std::future_status::ready;
}

int countEntries(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - (std::strcmp(dir, "/proc/self/fd") == 0 ? 1 : 0);  // the directory's own descriptor
}

// NCCL's single-process multi-GPU loop: cudaSetDevice(i) then
// ncclCommInitRankConfig inside a group, each config on the stack of one
// loop iteration. The device and the config are the caller's at the call,
// not whatever they are when ncclGroupEnd runs (on other threads).
TEST_F(Capi, GroupInitUsesTheDeviceAndConfigOfTheCall) {
  fake_.usable = true;
  capi::setRealInitHooks(fake_.hooks());
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  static const char* kNetNames[2] = {"net-rank0", "net-rank1"};
  ncclComm_t comms[2] = {nullptr, nullptr};
  // Groups belong to a thread: the whole loop runs on one (bounded).
  ASSERT_TRUE(finishesWithin(60s, [&] {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int i = 0; i < 2; ++i) {
      tDevice = 5 + i;  // cudaSetDevice(5 + i)
      auto* config = new ncclConfig_t(NCCL_CONFIG_INITIALIZER);
      std::string netName = kNetNames[i];
      config->cgaClusterSize = 3 + i;
      config->netName = netName.c_str();
      EXPECT_EQ(ncclCommInitRankConfig(&comms[i], 2, id, i, config), ncclSuccess) << ncclGetLastError(nullptr);
      std::memset(static_cast<void*>(config), 0xa5, sizeof *config);  // the iteration's storage is reused...
      delete config;                                                   // ...or gone
      netName.assign(netName.size(), 'x');
    }
    tDevice = 0;
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  }));
  for (int i = 0; i < 2; ++i) {
    std::lock_guard<std::mutex> lock(fake_.mu);
    ASSERT_EQ(fake_.inits.count(i), 1u) << "rank " << i << " never reached the real NCCL";
    EXPECT_EQ(fake_.inits[i].device, 5 + i) << "rank " << i;
    EXPECT_EQ(fake_.inits[i].cgaClusterSize, 3 + i) << "rank " << i;
    EXPECT_EQ(fake_.inits[i].netName, kNetNames[i]) << "rank " << i;
  }
  for (int i = 0; i < 2; ++i) {
    int device = -1;
    EXPECT_EQ(ncclCommCuDevice(comms[i], &device), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(device, 5 + i);
    EXPECT_EQ(ncclCommDestroy(comms[i]), ncclSuccess);
  }
  std::lock_guard<std::mutex> lock(fake_.mu);
  EXPECT_EQ(fake_.destroyed.size(), 2u);
}

// NCCL refuses ranks that share a GPU ("Duplicate GPU detected"): the
// ranks see that they do before the real init and form without the real
// NCCL, every rank saying why, so their device collectives take gradcomm's
// staged path instead of failing the communicator's creation.
TEST_F(Capi, RanksSharingAGpuFormWithoutTheRealNcclAndSayWhy) {
  fake_.usable = true;
  fake_.sharedGpus = true;
  capi::setRealInitHooks(fake_.hooks());
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  ncclComm_t comms[3] = {nullptr, nullptr, nullptr};
  ASSERT_TRUE(finishesWithin(60s, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        tDevice = r == 2 ? 1 : 4;  // ranks 0 and 1 on GPU 4, rank 2 on GPU 1
        EXPECT_EQ(ncclCommInitRank(&comms[r], 3, id, r), ncclSuccess) << ncclGetLastError(nullptr);
        tDevice = 0;
      });
    }
    for (auto& t : threads) t.join();
  }));
  {
    std::lock_guard<std::mutex> lock(fake_.mu);
    EXPECT_TRUE(fake_.inits.empty()) << "a rank entered the real NCCL's init";
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_NE(comms[r], nullptr);
    EXPECT_EQ(comms[r]->real, nullptr) << "rank " << r;
    EXPECT_NE(comms[r]->realWhy.find("ranks 0 and 1 share one GPU (GPU-fake-4)"), std::string::npos)
        << comms[r]->realWhy;
    int device = -1;
    EXPECT_EQ(ncclCommCuDevice(comms[r], &device), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(device, r == 2 ? 1 : 4);
  }
  // Host memory goes through gradcomm as ever.
  ASSERT_TRUE(finishesWithin(60s, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        float x = static_cast<float>(r + 1);
        EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[r], nullptr), ncclSuccess)
            << ncclGetLastError(nullptr);
        EXPECT_EQ(x, 6.0f);
        EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
      });
    }
    for (auto& t : threads) t.join();
  }));
  std::lock_guard<std::mutex> lock(fake_.mu);
  EXPECT_TRUE(fake_.destroyed.empty());
}

// Where the GPUs cannot be named, or every rank opts in to sharing
// (NCCL_MULTI_RANK_GPU_ENABLE=1, which newer NCCL releases accept), the
// ranks go on to the real NCCL's init as before.
TEST_F(Capi, UnnamedGpusOrAnOptInOnEveryRankLeaveTheChoiceToTheRealNccl) {
  for (const bool optIn : {false, true}) {
    SCOPED_TRACE(optIn ? "GPUs shared, every rank opted in" : "GPUs without a name");
    {
      std::lock_guard<std::mutex> lock(fake_.mu);
      fake_.inits.clear();
      fake_.destroyed.clear();
    }
    fake_.usable = true;
    fake_.unknownGpus = !optIn;
    fake_.sharedGpus = optIn;
    if (optIn) setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
    capi::setRealInitHooks(fake_.hooks());
    std::vector<ncclComm_t> comms;
    ASSERT_TRUE(finishesWithin(60s, [&] { comms = makeComms(2); }));
    unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
    {
      std::lock_guard<std::mutex> lock(fake_.mu);
      EXPECT_EQ(fake_.inits.size(), 2u) << "a rank did not reach the real NCCL's init";
    }
    for (ncclComm_t c : comms) {
      ASSERT_NE(c, nullptr);
      EXPECT_NE(c->real, nullptr) << c->realWhy;
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
  }
}

// One rank's real ncclCommInitRank fails: every rank's ncclCommInitRank
// fails, naming that rank and why, and no rank keeps a real communicator.
TEST_F(Capi, RealInitFailureOnOneRankFailsEveryRank) {
  fake_.usable = true;
  fake_.failRank = 1;
  capi::setRealInitHooks(fake_.hooks());
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  ncclComm_t comms[2] = {reinterpret_cast<ncclComm_t>(1), reinterpret_cast<ncclComm_t>(1)};
  ncclResult_t results[2] = {ncclSuccess, ncclSuccess};
  std::string texts[2];
  ASSERT_TRUE(finishesWithin(60s, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        results[r] = ncclCommInitRank(&comms[r], 2, id, r);
        texts[r] = ncclGetLastError(nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }));
  EXPECT_EQ(results[1], ncclUnhandledCudaError) << texts[1];
  EXPECT_EQ(results[0], ncclRemoteError) << texts[0];
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(comms[r], nullptr) << "rank " << r << " holds a communicator";
    EXPECT_NE(texts[r].find("rank 1"), std::string::npos) << texts[r];
    EXPECT_NE(texts[r].find("fake: cudaSetDevice failed"), std::string::npos) << texts[r];
  }
  std::lock_guard<std::mutex> lock(fake_.mu);
  ASSERT_EQ(fake_.destroyed.size(), 1u) << "rank 0's real communicator was not given back";
  EXPECT_EQ(fake_.destroyed[0].first, reinterpret_cast<ncclComm_t>(0x1000));
  EXPECT_TRUE(fake_.destroyed[0].second) << "destroyed, not aborted (its peer never had one)";
}

// One rank's device cannot be selected: no rank enters the real NCCL's init
// (whose other ranks would wait there for it), and every rank fails.
TEST_F(Capi, BadDeviceOnOneRankFailsEveryRankBeforeTheRealInit) {
  fake_.usable = true;
  fake_.badDeviceRank = 1;
  capi::setRealInitHooks(fake_.hooks());
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  ncclComm_t comms[2] = {nullptr, nullptr};
  ncclResult_t results[2] = {ncclSuccess, ncclSuccess};
  std::string texts[2];
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(finishesWithin(60s, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        tDevice = 100 + r;
        results[r] = ncclCommInitRank(&comms[r], 2, id, r);
        texts[r] = ncclGetLastError(nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "a rank waited in the real NCCL's init";
  EXPECT_EQ(results[1], ncclUnhandledCudaError) << texts[1];
  EXPECT_EQ(results[0], ncclRemoteError) << texts[0];
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(comms[r], nullptr) << "rank " << r << " holds a communicator";
    EXPECT_NE(texts[r].find("rank 1"), std::string::npos) << texts[r];
    EXPECT_NE(texts[r].find("fake: invalid device ordinal"), std::string::npos) << texts[r];
  }
  std::lock_guard<std::mutex> lock(fake_.mu);
  EXPECT_EQ(fake_.entered, 0) << "a rank entered the real NCCL's init";
  EXPECT_TRUE(fake_.destroyed.empty());
}

// PyTorch's watchdog: a rank blocks in ncclAllReduce (its peer never
// calls) and another thread aborts the communicator. The call returns
// ncclInternalError (what NCCL returns from a blocking wait its abort flag
// interrupted) saying it was aborted; the communicator is freed only after
// the call left it (the valgrind run of this test sees no invalid read).
class CapiAbort : public Capi, public ::testing::WithParamInterface<bool> {};

TEST_P(CapiAbort, AbortFromAnotherThreadWakesTheBlockedCall) {
  const bool inGroup = GetParam();
  const char* function = inGroup ? "ncclGroupEnd" : "ncclAllReduce";
  auto comms = makeComms(2);
  ASSERT_TRUE(comms[0] && comms[1]);
  std::atomic<int> result{-1};
  std::string text;
  std::thread blocked([&] {
    float x = 1;
    if (inGroup) {
      ncclGroupStart();
      ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[0], nullptr);
      result = ncclGroupEnd();
    } else {
      result = ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[0], nullptr);
    }
    text = ncclGetLastError(nullptr);
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(result.load(), -1) << "the call returned without its peer";
  ASSERT_TRUE(finishesWithin(30s, [&] { EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess); }));
  ASSERT_TRUE(finishesWithin(30s, [&] { blocked.join(); })) << "the blocked call never returned";
  EXPECT_EQ(result.load(), ncclInternalError) << text;
  EXPECT_NE(text.find(function), std::string::npos) << text;
  EXPECT_NE(text.find("aborted"), std::string::npos) << text;
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess) << ncclGetLastError(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Calls, CapiAbort, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("InAGroup") : std::string("Alone");
                         });

// Creating and destroying communicators leaves no thread, socket or store
// behind: the store served for a unique id and the connections to it go
// when the communicators formed through them are destroyed.
TEST_F(Capi, DestroyedCommunicatorsLeaveNoThreadsOrDescriptors) {
  auto cycle = [] {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
    std::vector<ncclComm_t> comms(2, nullptr);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        EXPECT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess) << ncclGetLastError(nullptr);
        float x = 1;
        EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[r], nullptr), ncclSuccess);
        EXPECT_EQ(x, 2.0f);
      });
    }
    for (auto& t : threads) t.join();
    for (auto c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  };
  cycle();  // process-wide state made once (UCX, the progress machinery)
  cycle();
  const int threads0 = countEntries("/proc/self/task"), fds0 = countEntries("/proc/self/fd");
  for (int i = 0; i < 10; ++i) cycle();
  // Threads end and sockets close as their last user lets go: allow a moment.
  int threads1 = 0, fds1 = 0;
  for (int i = 0; i < 100; ++i) {
    threads1 = countEntries("/proc/self/task");
    fds1 = countEntries("/proc/self/fd");
    if (threads1 <= threads0 && fds1 <= fds0) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_LE(threads1, threads0) << "threads before " << threads0 << ", after 10 communicators " << threads1;
  EXPECT_LE(fds1, fds0) << "descriptors before " << fds0 << ", after 10 communicators " << fds1;
}

/// Sets (or with null unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1); else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

/// The log level in force after a communicator was formed with this environment.
gradcomm::core::LogLevel levelAfterInit(const char* ncclDebug, const char* gradcommLevel) {
  ScopedEnv a("NCCL_DEBUG", ncclDebug), b("GRADCOMM_LOG_LEVEL", gradcommLevel);
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
  gradcomm::core::LogLevel level = gradcomm::core::LogLevel::kError;
  for (auto l : {gradcomm::core::LogLevel::kWarn, gradcomm::core::LogLevel::kInfo, gradcomm::core::LogLevel::kDebug}) {
    if (gradcomm::core::logEnabled(l)) level = l;
  }
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  return level;
}

// The error strings tell users to set NCCL_DEBUG: it sets gradcomm's log
// level, unless GRADCOMM_LOG_LEVEL is set too.
TEST_F(Capi, NcclDebugSetsTheLogLevel) {
  EXPECT_EQ(levelAfterInit("INFO", nullptr), gradcomm::core::LogLevel::kInfo);
  EXPECT_EQ(levelAfterInit("WARN", nullptr), gradcomm::core::LogLevel::kWarn);
  EXPECT_EQ(levelAfterInit("TRACE", nullptr), gradcomm::core::LogLevel::kDebug);
  EXPECT_EQ(levelAfterInit("info", nullptr), gradcomm::core::LogLevel::kInfo);
  EXPECT_EQ(levelAfterInit("INFO", "error"), gradcomm::core::LogLevel::kError);
  EXPECT_EQ(levelAfterInit(nullptr, nullptr), gradcomm::core::LogLevel::kWarn);
  EXPECT_EQ(levelAfterInit("VERSION", nullptr), gradcomm::core::LogLevel::kWarn);
}

// Device calls the real NCCL cannot serve are staged: choosing gradcomm's
// device engine would be an exchange at the first device call, which the
// ranks of ncclCommInitAll driven by one thread would wait on forever.
// GRADCOMM_DEVICE_ENGINE, where set, stands.
TEST_F(Capi, TheShimsCommunicatorsStageDeviceCallsUnlessToldOtherwise) {
  for (const char* env : {static_cast<const char*>(nullptr), "auto"}) {
    ScopedEnv engine("GRADCOMM_DEVICE_ENGINE", env);
    ncclComm_t comms[2] = {nullptr, nullptr};
    ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    for (ncclComm_t c : comms) EXPECT_EQ(c->host.parameter("GRADCOMM_DEVICE_ENGINE"), env ? env : "staged");
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

// NCCL callers read a count mismatch (and any call in the wrong order) as
// ncclInvalidUsage; gradcomm reports them as MismatchError / InvalidUsage.
TEST(CapiErrors, MismatchAndInvalidUsageAreNcclInvalidUsage) {
  ncclResult_t r = capi::guarded("ncclAllReduce", []() -> ncclResult_t {
    throw gradcomm::MismatchError("rank 1 called allreduce with 5 elements, rank 0 with 4");
  });
  EXPECT_EQ(r, ncclInvalidUsage);
  EXPECT_STREQ(capi::lastError(), "ncclAllReduce: rank 1 called allreduce with 5 elements, rank 0 with 4");
  r = capi::guarded("ncclSend", []() -> ncclResult_t { throw gradcomm::InvalidUsage("destroyed"); });
  EXPECT_EQ(r, ncclInvalidUsage);

  // Through the path a host collective fails on: the call's result and the
  // communicator's sticky error.
  ncclComm comm;
  r = capi::runNow(&comm, nullptr, "ncclAllReduce", []() -> gradcomm::Work {
    throw gradcomm::MismatchError("count 4 here, 5 on rank 1");
  });
  EXPECT_EQ(r, ncclInvalidUsage);
  EXPECT_EQ(comm.asyncError.load(), ncclInvalidUsage);
  EXPECT_NE(std::string(capi::lastError()).find("count 4 here"), std::string::npos);
}

// The same through two ranks that pass different counts (here on one host,
// where the shared-memory path compares the calls): ncclInvalidUsage on
// every rank, saying what differs.
TEST_F(Capi, CountMismatchIsInvalidUsageOnEveryRank) {
  auto comms = makeComms(2);
  ASSERT_TRUE(comms[0] && comms[1]);
  ncclResult_t results[2] = {ncclSuccess, ncclSuccess};
  std::string texts[2];
  ASSERT_TRUE(finishesWithin(60s, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        float x[8] = {};
        results[r] = ncclAllReduce(x, x, 4 + r, ncclFloat32, ncclSum, comms[r], nullptr);
        texts[r] = ncclGetLastError(nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r], ncclInvalidUsage) << "rank " << r << ": " << texts[r];
    EXPECT_NE(texts[r].find("count"), std::string::npos) << texts[r];
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
  }
}

}  // namespace
