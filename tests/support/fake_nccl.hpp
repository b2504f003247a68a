#pragma once
// A device collective library for the test runtime (fake_device.hpp): ranks
// are threads of one process, a group is a table they meet at, and each
// collective is a "kernel" on the caller's fake stream that waits for every
// rank's call of the same number, computes this rank's result from all the
// inputs and writes it once every rank computed its own. Calls that differ
// between ranks wait forever, as NCCL's kernels would, until the group is
// aborted. Install it with FakeNccl::Installed.
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/collective_library.hpp"
#include "kernels/reduce.hpp"
#include "support/fake_device.hpp"

namespace gradcomm::testing {

class FakeNccl final : public device::CollectiveLibrary {
 public:
  explicit FakeNccl(std::shared_ptr<FakeDevice> dev) : dev_(std::move(dev)) {}

  struct Installed {
    std::shared_ptr<FakeNccl> fake;
    std::shared_ptr<device::CollectiveLibrary> previous;
    explicit Installed(std::shared_ptr<FakeDevice> dev) : fake(std::make_shared<FakeNccl>(std::move(dev))) {
      previous = device::installCollectiveLibrary(fake);
    }
    ~Installed() { device::installCollectiveLibrary(previous); }
    FakeNccl* operator->() const { return fake.get(); }
  };

  /// Makes the library unusable for the calling rank thread (as a process
  /// without libnccl.so.2): `why` is the reason it gives; "" makes it usable.
  void unavailableOnThisThread(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (why.empty()) {
      unavailable_.erase(std::this_thread::get_id());
    } else {
      unavailable_[std::this_thread::get_id()] = std::move(why);
    }
  }
  /// Applied to each rank's allgather result before it is written (tests
  /// that corrupt what a peer sent); null: none.
  using ResultHook = std::function<void(char* result, size_t bytes, int rank)>;
  void onAllgatherResult(ResultHook hook) {
    std::lock_guard<std::mutex> lock(mu_);
    allgatherHook_ = std::make_shared<ResultHook>(std::move(hook));
  }
  int joined() const { return joined_.load(); }
  int calls() const { return calls_.load(); }

  std::string name() override { return "fake-nccl"; }
  std::string unavailable() override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = unavailable_.find(std::this_thread::get_id());
    return it == unavailable_.end() ? "" : it->second;
  }
  std::vector<char> newId() override {
    const uint64_t id = ++nextId_;
    std::vector<char> out(sizeof id);
    std::memcpy(out.data(), &id, sizeof id);
    return out;
  }
  std::unique_ptr<device::DeviceComm> join(const std::vector<char>& id, int size, int rank, int device,
                                           const std::function<bool()>& cancelled) override {
    std::shared_ptr<Group> g;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& slot = groups_[std::string(id.begin(), id.end())];
      if (!slot) slot = std::make_shared<Group>(size);
      g = slot;
    }
    std::unique_lock<std::mutex> lock(g->mu);
    ++g->joined;
    g->cv.notify_all();
    while (g->joined < g->size) {
      if (cancelled()) throw DeviceError("fake NCCL: joining was cancelled");
      g->cv.wait_for(lock, std::chrono::milliseconds(5));
    }
    ++joined_;
    return std::make_unique<Comm>(*this, g, rank, device);
  }

 private:
  struct Args {
    int kind = 0;  // 0 allreduce, 1 broadcast, 2 reduce, 3 allgather, 4 reduce-scatter
    const void* in = nullptr;
    void* out = nullptr;
    size_t count = 0;
    DataType type = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
    bool sameCall(const Args& o) const {
      return kind == o.kind && count == o.count && type == o.type && op == o.op && root == o.root;
    }
  };
  struct Round {
    std::vector<Args> args;
    std::vector<bool> arrived;
    int computed = 0, left = 0;
  };
  struct Group {
    explicit Group(int n) : size(n) {}
    const int size;
    std::mutex mu;
    std::condition_variable cv;
    int joined = 0;
    bool aborted = false;
    std::map<uint64_t, Round> rounds;  // by call number
  };

  class Comm final : public device::DeviceComm {
   public:
    Comm(FakeNccl& lib, std::shared_ptr<Group> g, int rank, int device)
        : lib_(lib), g_(std::move(g)), rank_(rank), device_(device) {}
    void allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, device::Stream s) override {
      enqueue({0, in, out, count, type, op, 0}, s);
    }
    void broadcast(const void* in, void* out, size_t count, DataType type, int root, device::Stream s) override {
      enqueue({1, in, out, count, type, ReduceOp::kSum, root}, s);
    }
    void reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root,
                device::Stream s) override {
      enqueue({2, in, out, count, type, op, root}, s);
    }
    void allgather(const void* in, void* out, size_t count, DataType type, device::Stream s) override {
      enqueue({3, in, out, count, type, ReduceOp::kSum, 0}, s);
    }
    void reduceScatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                       device::Stream s) override {
      enqueue({4, in, out, count, type, op, 0}, s);
    }
    std::string asyncError() override {
      std::lock_guard<std::mutex> lock(g_->mu);
      return g_->aborted ? "fake NCCL: the group was aborted" : "";
    }
    void abort() override {
      std::lock_guard<std::mutex> lock(g_->mu);
      g_->aborted = true;
      g_->cv.notify_all();
    }

   private:
    void enqueue(Args a, device::Stream s) {
      {
        std::lock_guard<std::mutex> lock(g_->mu);
        if (g_->aborted) throw DeviceError("fake NCCL: the group was aborted");
      }
      if (lib_.dev_->streamDevice(s) != device_) throw DeviceError("fake NCCL: a stream of another device");
      ++lib_.calls_;
      const uint64_t n = next_++;
      std::shared_ptr<ResultHook> hook;
      {
        std::lock_guard<std::mutex> lock(lib_.mu_);
        hook = lib_.allgatherHook_;
      }
      lib_.dev_->launch(s, [g = g_, a, n, rank = rank_, hook] { run(*g, a, n, rank, hook.get()); });
    }
    static void run(Group& g, const Args& a, uint64_t n, int rank, const ResultHook* hook) {
      const size_t elem = dataTypeSize(a.type);
      std::unique_lock<std::mutex> lock(g.mu);
      Round& r = g.rounds[n];
      if (r.args.empty()) r.args.resize(g.size), r.arrived.resize(g.size, false);
      r.args[rank] = a;
      r.arrived[rank] = true;
      g.cv.notify_all();
      auto allArrivedAndMatch = [&] {
        for (int i = 0; i < g.size; ++i) {
          if (!r.arrived[i] || !r.args[i].sameCall(a)) return false;
        }
        return true;
      };
      g.cv.wait(lock, [&] { return g.aborted || allArrivedAndMatch(); });
      if (g.aborted) return;
      // This rank's result, from every rank's input, into a buffer of its own.
      const size_t outCount = a.kind == 3 ? a.count * g.size : a.count;
      std::vector<char> result(outCount * elem);
      if (a.count == 0) {  // nothing to move (the buffers may be null)
        ++r.computed;
        g.cv.notify_all();
        g.cv.wait(lock, [&] { return g.aborted || r.computed == g.size; });
        if (!g.aborted && ++r.left == g.size) g.rounds.erase(n);
        return;
      }
      const bool writes = a.kind != 2 || rank == a.root;
      if (a.kind == 1) {
        std::memcpy(result.data(), r.args[a.root].in, a.count * elem);
      } else if (a.kind == 3) {
        for (int i = 0; i < g.size; ++i) std::memcpy(result.data() + i * a.count * elem, r.args[i].in, a.count * elem);
        if (hook && *hook) (*hook)(result.data(), result.size(), rank);
      } else {
        const size_t offset = a.kind == 4 ? rank * a.count * elem : 0;
        const ReduceOp op = a.op == ReduceOp::kAvg ? ReduceOp::kSum : a.op;
        auto add = kernels::reduceFunction(a.type, op, kernels::SimdLevel::kScalar);
        std::memcpy(result.data(), static_cast<const char*>(r.args[0].in) + offset, a.count * elem);
        for (int i = 1; i < g.size; ++i) {
          add(result.data(), result.data(), static_cast<const char*>(r.args[i].in) + offset, a.count);
        }
        if (a.op == ReduceOp::kAvg) kernels::divideFunction(a.type, kernels::SimdLevel::kScalar)(result.data(), a.count, g.size);
      }
      // Written once every rank computed its own: inputs may be outputs.
      ++r.computed;
      g.cv.notify_all();
      g.cv.wait(lock, [&] { return g.aborted || r.computed == g.size; });
      if (g.aborted) return;
      if (writes && a.out) std::memcpy(a.out, result.data(), result.size());
      if (++r.left == g.size) g.rounds.erase(n);
    }
    FakeNccl& lib_;
    std::shared_ptr<Group> g_;
    int rank_, device_;
    uint64_t next_ = 0;
  };

  std::shared_ptr<FakeDevice> dev_;
  std::mutex mu_;
  std::map<std::thread::id, std::string> unavailable_;      // guarded by mu_
  std::shared_ptr<ResultHook> allgatherHook_;              // guarded by mu_
  std::map<std::string, std::shared_ptr<Group>> groups_;    // guarded by mu_
  std::atomic<uint64_t> nextId_{0};
  std::atomic<int> joined_{0}, calls_{0};
};

}  // namespace gradcomm::testing
