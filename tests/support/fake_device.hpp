#pragma once
// A device runtime on host memory, for running the device path where there
// is no GPU: "device memory" is host memory registered with a device
// number, each stream is a thread that runs its queue in order (copies,
// event records, waits on events, and work a test queues as a "kernel"),
// and events complete when their stream reaches them. Its compressors are
// the CPU ones, run as kernels on its streams and refusing buffers that are
// not its "device memory". Install it with
// FakeDevice::Installed; restore happens when that goes out of scope.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/runtime.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::testing {

class FakeDevice final : public device::Runtime {
 public:
  /// `cuda`: whether it plays a build with CUDA (false: device pointers
  /// are recognised but cannot be moved, as in a build without CUDA).
  explicit FakeDevice(bool cuda = true) : cuda_(cuda) {}
  ~FakeDevice() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [p, a] : allocations_) std::free(reinterpret_cast<void*>(p));
  }

  /// Installs a FakeDevice for the scope; puts the previous runtime back.
  struct Installed {
    std::shared_ptr<FakeDevice> fake;
    std::shared_ptr<device::Runtime> previous;
    explicit Installed(bool cuda = true) : fake(std::make_shared<FakeDevice>(cuda)) {
      previous = device::installRuntime(fake);
    }
    ~Installed() { device::installRuntime(previous); }
    FakeDevice* operator->() const { return fake.get(); }
  };

  /// "Device memory" of `device`: `bytes` of host memory, zero-filled.
  void* allocate(int device, size_t bytes) {
    void* p = std::calloc(bytes ? bytes : 1, 1);
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(p)] = {bytes ? bytes : 1, device};
    return p;
  }
  template <typename T> T* allocate(int device, size_t count) {
    return static_cast<T*>(allocate(device, count * sizeof(T)));
  }
  /// A stream of `device`, destroyed (once its queue ran) with the last copy.
  std::shared_ptr<void> ownedStream(int device) {
    return std::shared_ptr<void>(createStream(device), [this](void* s) { destroyStream(s); });
  }
  /// Queues `work` on `s` as a kernel (runs on the stream's thread, in order).
  void launch(device::Stream s, std::function<void()> work) { stream(s).push(std::move(work)); }
  /// Blocks until everything queued on `s` so far ran.
  void drain(device::Stream s) {
    device::Event e = createEvent(streamDevice(s));
    record(e, s);
    synchronize(e);
    destroyEvent(e);
  }
  /// The next done() on an event recorded after this call fails as an
  /// illegal address would (queries of older records, such as a finished
  /// call's clean-up on another thread, do not take it).
  void failNextQuery() {
    failAfter_ = recordCount_.load();
    failNext_ = true;
  }
  /// Each copy takes at least this long (to make orders visible); copies
  /// into device memory take `intoDevice` where given.
  void setCopyDelay(std::chrono::microseconds d, std::chrono::microseconds intoDevice = std::chrono::microseconds(-1)) {
    copyDelay_ = d;
    intoDeviceDelay_ = intoDevice.count() < 0 ? d : intoDevice;
  }
  /// The next `count` compress() calls of its compressors (whichever
  /// rank's come first) fail at launch with a DeviceError, as a kernel
  /// launch error would.
  void failNextCompressions(int count = 1) { failCompress_ = count; }
  /// compress() calls its compressors ran.
  int compressions() const { return compressions_.load(); }
  int pinnedAllocations() const { return pinned_.load(); }
  /// Pinned blocks allocated and not yet freed.
  int pinnedHeld() const { return pinned_.load() - pinnedFreed_.load(); }
  /// Runtime::allocateDevice calls (not the test's own allocate()).
  int deviceAllocations() const { return deviceAllocations_.load(); }
  int eventsCreated() const { return eventsCreated_.load(); }
  int copies() const { return copies_.load(); }

  // ---- device::Runtime ----
  std::string name() const override { return "fake"; }
  bool canMoveDeviceMemory() const override { return cuda_; }
  bool devicesPresent() override { return true; }
  device::Memory classify(const void* p) override {
    const auto x = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.upper_bound(x);
    if (it == allocations_.begin()) return {};
    --it;
    if (x >= it->first + it->second.bytes) return {};
    return {true, it->second.device};
  }
  /// Device numbers are the fake's whole identity: ranks (threads) that
  /// allocate on one number share a device.
  std::string identity(int device) override { return "fake-" + std::to_string(device); }
  int streamDevice(device::Stream s) override { return s ? static_cast<FakeStream*>(s)->device : current(); }
  /// Each thread's current device starts at 0, as in CUDA.
  int currentDevice() override { return current(); }
  void setCurrentDevice(int device) override { current() = device; }
  device::Stream createStream(int device) override { return new FakeStream(device); }
  void destroyStream(device::Stream s) override { delete static_cast<FakeStream*>(s); }
  /// Events live as long as the FakeDevice: as with CUDA, one may be
  /// destroyed while a stream still has work that records or waits on it.
  device::Event createEvent(int) override {
    ++eventsCreated_;
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::make_unique<FakeEvent>());
    return events_.back().get();
  }
  void destroyEvent(device::Event) override {}
  void record(device::Event ev, device::Stream s) override {
    auto* e = static_cast<FakeEvent*>(ev);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      gen = ++e->recorded;
      e->lastRecord = ++recordCount_;
    }
    stream(s).push([e, gen] {
      std::lock_guard<std::mutex> lock(e->mu);
      e->completed.insert(gen);
      e->cv.notify_all();
    });
  }
  void streamWait(device::Stream s, device::Event ev) override {
    auto* e = static_cast<FakeEvent*>(ev);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      gen = e->recorded;
    }
    stream(s).push([e, gen] {
      std::unique_lock<std::mutex> lock(e->mu);
      e->cv.wait(lock, [&] { return e->reached(gen); });
    });
  }
  bool done(device::Event ev) override {
    auto* e = static_cast<FakeEvent*>(ev);
    std::lock_guard<std::mutex> lock(e->mu);
    if (failNext_.load() && e->lastRecord > failAfter_.load() && failNext_.exchange(false)) {
      throw DeviceError("cudaEventQuery failed: cudaErrorIllegalAddress (fake device)");
    }
    return e->reached(e->recorded);
  }
  void synchronize(device::Event ev) override {
    auto* e = static_cast<FakeEvent*>(ev);
    std::unique_lock<std::mutex> lock(e->mu);
    const uint64_t gen = e->recorded;
    e->cv.wait(lock, [&] { return e->reached(gen); });
  }
  void copy(void* dst, const void* src, size_t bytes, device::Stream s) override {
    ++copies_;
    const auto delay = classify(dst).device ? intoDeviceDelay_ : copyDelay_;
    stream(s).push([=] {
      if (delay.count()) std::this_thread::sleep_for(delay);
      std::memcpy(dst, src, bytes);
    });
  }
  void* allocateDevice(int device, size_t bytes) override {
    ++deviceAllocations_;
    return bytes ? allocate(device, bytes) : nullptr;
  }
  void freeDevice(void*) override {}  // freed with the FakeDevice (a stream may still use it)
  void zero(void* p, size_t bytes, device::Stream s) override {
    stream(s).push([=] { std::memset(p, 0, bytes); });
  }
  void* allocatePinned(size_t bytes) override {
    ++pinned_;
    return bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
  }
  void freePinned(void* p) override {
    if (p) ++pinnedFreed_;
    std::free(p);
  }
  compression::CompressorPtr makeCompressor(const compression::Spec& spec, int device, device::Stream s) override {
    if (streamDevice(s) != device) throw InvalidArgument("fake device: a compressor's stream is of another device");
    return std::make_unique<FakeCompressor>(*this, compression::makeCpuCompressor(spec, compression::detectIsa()), s);
  }
  void divide(float* data, size_t n, float divisor, device::Stream s) override {
    requireDevice(data, "divide");
    launch(s, [=] {
      for (size_t i = 0; i < n; ++i) data[i] = data[i] / divisor;
    });
  }
  void multiply(float* data, size_t n, float factor, device::Stream s) override {
    requireDevice(data, "multiply");
    launch(s, [=] {
      for (size_t i = 0; i < n; ++i) data[i] = data[i] * factor;
    });
  }

 private:
  /// A device kernel may not read host memory: a null or host pointer here
  /// is a bug of the caller (InternalError, thrown at launch).
  void requireDevice(const void* p, const char* what) {
    if (p && !classify(p).device) {
      throw InternalError(std::string("fake device: ") + what + " was given host memory");
    }
  }
  /// A CPU compressor whose work runs on a fake stream, in order.
  class FakeCompressor final : public compression::Compressor {
   public:
    FakeCompressor(FakeDevice& dev, compression::CompressorPtr cpu, device::Stream s)
        : dev_(dev), cpu_(std::move(cpu)), stream_(s) {}
    compression::Kind kind() const override { return cpu_->kind(); }
    compression::MemoryKind memory() const override { return compression::MemoryKind::kDevice; }
    bool summable() const override { return cpu_->summable(); }
    DataType payloadType() const override { return cpu_->payloadType(); }
    size_t payloadBytes(size_t n) const override { return cpu_->payloadBytes(n); }
    void compress(const float* in, float* residual, size_t n, void* payload,
                  const compression::CompressArgs& args) override {
      if (dev_.failCompress_.fetch_sub(1) > 0) throw DeviceError("compression kernel launch failed: cudaErrorLaunchFailure (fake device)");
      if (n) {
        dev_.requireDevice(in, "compress (input)");
        dev_.requireDevice(residual, "compress (residual)");
      }
      dev_.requireDevice(payload, "compress (payload)");
      auto cpu = cpu_;
      FakeDevice* dev = &dev_;
      dev_.launch(stream_, [=] {
        ++dev->compressions_;
        cpu->compress(in, residual, n, payload, args);
      });
    }
    void decompress(const void* payload, float* out, size_t n) override {
      dev_.requireDevice(payload, "decompress (payload)");
      if (n) dev_.requireDevice(out, "decompress (output)");
      auto cpu = cpu_;
      dev_.launch(stream_, [=] { cpu->decompress(payload, out, n); });
    }
    /// Waits for its stream, as the CUDA one does to validate the payload;
    /// a malformed payload throws here.
    void decompressAdd(const void* payload, float* out, size_t n) override {
      dev_.requireDevice(payload, "decompressAdd (payload)");
      if (n) dev_.requireDevice(out, "decompressAdd (output)");
      auto cpu = cpu_;
      auto check = launchChecked([=] { cpu->decompressAdd(payload, out, n); });
      dev_.drain(stream_);
      check();
    }
    /// As the CUDA top-k: the slots added on the stream, the check run once
    /// the stream passed them (it throws what the CPU compressor threw).
    std::function<void()> decompressAllQueued(const char* payloads, size_t slotBytes, int ranks, float* out,
                                              size_t n, void*) override {
      dev_.requireDevice(payloads, "decompressAllQueued (payloads)");
      if (n) dev_.requireDevice(out, "decompressAllQueued (output)");
      auto cpu = cpu_;
      return launchChecked([=] { cpu->decompressAll(payloads, slotBytes, ranks, out, n); });
    }

   private:
    /// Launches `kernel` on the stream; the returned function, run once the
    /// stream passed it, rethrows what the kernel threw.
    std::function<void()> launchChecked(std::function<void()> kernel) {
      auto error = std::make_shared<std::exception_ptr>();
      dev_.launch(stream_, [error, kernel = std::move(kernel)] {
        try {
          kernel();
        } catch (...) {
          *error = std::current_exception();
        }
      });
      return [error] {
        if (*error) std::rethrow_exception(*error);
      };
    }
    FakeDevice& dev_;
    std::shared_ptr<compression::Compressor> cpu_;
    device::Stream stream_;
  };
  /// As a CUDA event: a query, a synchronize or a stream's wait concerns
  /// the record made last before it, whichever records complete later (a
  /// record on another stream may complete first).
  struct FakeEvent {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;
    uint64_t lastRecord = 0;  ///< the fake's count of records when this one was last recorded
    std::set<uint64_t> completed;  ///< records whose work ran
    bool reached(uint64_t gen) const { return gen == 0 || completed.count(gen) != 0; }
  };
  struct FakeStream {
    explicit FakeStream(int d) : device(d), worker([this] { run(); }) {}
    ~FakeStream() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      worker.join();
    }
    void push(std::function<void()> f) {
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(std::move(f));
      }
      cv.notify_all();
    }
    void run() {
      for (;;) {
        std::function<void()> f;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || !queue.empty(); });
          if (queue.empty()) return;  // stop, with nothing left to run
          f = std::move(queue.front());
          queue.pop_front();
        }
        f();
      }
    }
    int device;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    bool stop = false;
    std::thread worker;  // last: starts once the rest is built
  };
  static int& current() {
    static thread_local int device = 0;
    return device;
  }
  /// The null stream is the default stream of the calling thread's current device.
  FakeStream& stream(device::Stream s) {
    if (s) return *static_cast<FakeStream*>(s);
    std::lock_guard<std::mutex> lock(mu_);
    auto& d = defaults_[current()];
    if (!d) d = std::make_unique<FakeStream>(current());
    return *d;
  }
  struct Allocation {
    size_t bytes;
    int device;
  };
  const bool cuda_;
  std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;
  std::vector<std::unique_ptr<FakeEvent>> events_;
  std::map<int, std::unique_ptr<FakeStream>> defaults_;  // guarded by mu_
  std::atomic<bool> failNext_{false};
  std::atomic<uint64_t> recordCount_{0}, failAfter_{0};
  std::atomic<int> failCompress_{0};
  std::atomic<int> compressions_{0};
  std::chrono::microseconds copyDelay_{0};
  std::chrono::microseconds intoDeviceDelay_{0};
  std::atomic<int> pinned_{0}, pinnedFreed_{0}, copies_{0}, deviceAllocations_{0}, eventsCreated_{0};
};

}  // namespace gradcomm::testing
