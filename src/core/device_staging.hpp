#pragma once
// Collectives on device memory, staged through pinned host memory: the
// input is copied to the host in chunks on a copy stream (after the work
// the caller queued on its stream), each chunk is one host collective of
// the context's engine (started once its copy landed), and each finished
// chunk is copied back on a second stream at once, so copying chunk i+1 in,
// reducing chunk i and copying chunk i-1 out overlap.
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/schedule.hpp"
#include "device/runtime.hpp"

namespace gradcomm::detail {

/// A context's device resources: the one device it serves, a stream per
/// direction, and what finished calls leave for the next ones (pinned and
/// device blocks, events): a call allocates nothing once the sizes it uses
/// were seen (cudaFree and cudaFreeHost wait for the whole device, and
/// creating an event costs about as much as queuing a small collective).
class DeviceStaging {
 public:
  DeviceStaging(std::shared_ptr<device::Runtime> runtime, int device);
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  /// Blocks kept for later calls, per kind (pinned, device).
  static constexpr size_t kMaxCachedBlocks = 8;

  device::Runtime& runtime() { return *runtime_; }
  int device() const { return device_; }
  device::Stream toHost() const { return toHost_; }
  device::Stream toDevice() const { return toDevice_; }
  /// A pinned block of at least `bytes`, from the cache or new.
  void* acquire(size_t bytes, size_t* capacity);
  void release(void* block, size_t capacity);
  /// A block of at least `bytes` of the device's memory, from the cache or
  /// new; given back once the device work using it finished.
  void* acquireDevice(size_t bytes, size_t* capacity);
  void releaseDevice(void* block, size_t capacity);
  /// An event of the device, from the pool or new. Given back once nothing
  /// on the host asks it any more, possibly with its last record still
  /// pending: every user records it before asking it, and a later record
  /// replaces its state (waits queued on streams before keep the state
  /// they saw, as with CUDA).
  device::Event takeEvent();
  void giveEvent(device::Event event);
  /// Gives `blocks` (device memory), `pinned` (a pinned block of
  /// `pinnedCapacity`, or null) and `event` back once `event` completed
  /// (the device work after which it was recorded no longer uses the
  /// blocks): at once when it has, else at a later acquire, acquireDevice()
  /// or takeEvent() that finds it completed. Only ~DeviceStaging waits.
  void retire(device::Event event, std::vector<std::pair<void*, size_t>> blocks, void* pinned = nullptr,
              size_t pinnedCapacity = 0);

 private:
  using Blocks = std::multimap<size_t, void*>;  // capacity -> block
  /// The smallest cached block of `blocks` (pinned_ or deviceBlocks_) that
  /// holds `bytes` (not one more than about twice as large: a small call
  /// would hold a large block), or a new one of that kind.
  void* take(Blocks& blocks, size_t bytes, size_t* capacity);
  /// Caches `block` (null: nothing) in `blocks`.
  void give(Blocks& blocks, void* block, size_t capacity);
  /// Gives back what retired calls held, where their events completed.
  void reap();
  /// Puts `block` into `blocks` (requires mu_), freeing the smallest
  /// cached block beyond kMaxCachedBlocks.
  void cache(Blocks& blocks, size_t capacity, void* block);
  struct Retired {
    device::Event event;
    std::vector<std::pair<void*, size_t>> blocks;
    void* pinned;
    size_t pinnedCapacity;
  };

  std::shared_ptr<device::Runtime> runtime_;
  int device_;
  device::Stream toHost_ = nullptr;
  device::Stream toDevice_ = nullptr;
  std::mutex mu_;  // guards the caches below
  Blocks pinned_;
  Blocks deviceBlocks_;
  std::vector<device::Event> events_;
  std::vector<Retired> retired_;
};

/// How a call on device buffers reaches its end on the device after its
/// host part finished: what Work::test, wait and synchronize ask.
class DeviceCompletion {
 public:
  virtual ~DeviceCompletion() = default;
  /// True once the result is in device memory (never blocks).
  virtual bool done() = 0;
  /// Blocks until the result is in device memory.
  virtual void wait() = 0;
  /// Makes `stream` wait for the result (does not block).
  virtual void streamWait(device::Stream stream) = 0;
};

/// One call on device buffers, shared by its chunk operations and its Work.
class StagedCall final : public DeviceCompletion {
 public:
  /// One chunk: its copy to the host (skipped where bytes is 0) and back.
  struct Chunk {
    const void* deviceIn = nullptr;
    void* hostIn = nullptr;
    size_t inBytes = 0;
    const void* hostOut = nullptr;
    void* deviceOut = nullptr;
    size_t outBytes = 0;
  };
  /// Takes a pinned block of `hostBytes` from `staging`; `chunks` says
  /// where each part goes (pointers into host() filled in by the caller
  /// through host()).
  StagedCall(std::shared_ptr<DeviceStaging> staging, size_t hostBytes);
  ~StagedCall() override;
  StagedCall(const StagedCall&) = delete;
  StagedCall& operator=(const StagedCall&) = delete;

  char* host() const { return host_; }
  std::vector<Chunk>& chunks() { return chunks_; }
  /// Device work around the copies (a compressed call: compress before the
  /// copies to the host, decompress after the copy back). `beforeInputs`
  /// is queued on the to-host stream ahead of the first copy to the host,
  /// once that stream waits for the caller and for earlier calls' copies
  /// back; `afterCopyBack` on the to-device stream after each chunk's copy
  /// back, before the event the Work waits for. Set before start().
  void setDeviceWork(std::function<void(device::Stream)> beforeInputs,
                     std::function<void(device::Stream)> afterCopyBack);
  /// A block of device memory of at least `bytes` for the call's device
  /// work, from the staging's cache; it goes back once the call's copies
  /// and device work are done (when this object goes).
  void* deviceBlock(size_t bytes);
  /// Marks the caller's `stream` (on the calling thread, at the call): the
  /// copies to the host will follow the work queued on it so far.
  void start(device::Stream stream);
  /// Queues every chunk's copy to the host (once, when the first chunk's
  /// operation starts: the calls before it have then queued their copies
  /// back, which this call's input may be).
  void copyInputs();
  /// True once chunk i's input is in host memory (never blocks).
  bool inputReady(size_t i);
  /// Queues chunk i's copy back to the device.
  void copyBack(size_t i);
  /// True once every queued copy back finished (never blocks).
  bool done() override;
  /// Blocks until every queued copy back finished.
  void wait() override;
  /// Makes `stream` wait for every queued copy back (does not block).
  void streamWait(device::Stream stream) override;

 private:
  std::shared_ptr<DeviceStaging> staging_;
  device::Runtime& rt_;
  char* host_ = nullptr;
  size_t capacity_ = 0;
  std::vector<Chunk> chunks_;
  device::Event callerReady_ = nullptr;
  std::vector<device::Event> inputDone_;
  device::Event copiedBack_ = nullptr;
  bool anyCopyBack_ = false;
  bool inputsQueued_ = false;
  std::function<void(device::Stream)> beforeInputs_;
  std::function<void(device::Stream)> afterCopyBack_;
  std::vector<std::pair<void*, size_t>> deviceBlocks_;  // block, capacity
};

/// True when a buffer the call reads or writes on `rank` is device memory
/// (asked only where device::runtime().devicesPresent()).
bool touchesDeviceMemory(const algorithms::CollectiveCall& call, int rank);

/// The schedule of one chunk: waits for the chunk's input to land in host
/// memory, runs the host algorithm's schedule (made only then: it may read
/// the input when made), then queues the copy back.
algorithms::SchedulePtr stagedSchedule(std::shared_ptr<StagedCall> call, size_t chunk,
                                       std::function<algorithms::SchedulePtr()> makeInner);

}  // namespace gradcomm::detail
