#include "core/device_staging.hpp"

#include <string>
#include <utility>

#include "gradcomm/error.hpp"

namespace gradcomm::detail {

DeviceStaging::DeviceStaging(std::shared_ptr<device::Runtime> runtime, int device)
    : runtime_(std::move(runtime)), device_(device) {
  toHost_ = runtime_->createStream(device_);
  try {
    toDevice_ = runtime_->createStream(device_);
  } catch (...) {
    runtime_->destroyStream(toHost_);
    throw;
  }
}

DeviceStaging::~DeviceStaging() {
  // Everything cached was given back by a call that had finished.
  for (auto& [capacity, block] : pinned_) runtime_->freePinned(block);
  for (auto& [capacity, block] : deviceBlocks_) runtime_->freeDevice(block);
  for (device::Event e : events_) runtime_->destroyEvent(e);
  // The context ends: what retired calls hold goes with it once the copies
  // and kernels using it ran (after a device error it is left alone). This
  // waits, on whichever thread drops the staging last.
  for (Retired& r : retired_) {
    try {
      runtime_->synchronize(r.event);
    } catch (...) {
      continue;
    }
    for (auto& [block, capacity] : r.blocks) runtime_->freeDevice(block);
    if (r.pinned) runtime_->freePinned(r.pinned);
    runtime_->destroyEvent(r.event);
  }
  runtime_->destroyStream(toHost_);
  runtime_->destroyStream(toDevice_);
}

void* DeviceStaging::take(Blocks& blocks, size_t bytes, size_t* capacity) {
  reap();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks.lower_bound(bytes);
    if (it != blocks.end() && it->first <= 2 * bytes + 4096) {
      void* block = it->second;
      *capacity = it->first;
      blocks.erase(it);
      return block;
    }
  }
  *capacity = bytes;
  return &blocks == &pinned_ ? runtime_->allocatePinned(bytes) : runtime_->allocateDevice(device_, bytes);
}

void DeviceStaging::give(Blocks& blocks, void* block, size_t capacity) {
  if (!block) return;
  std::lock_guard<std::mutex> lock(mu_);
  cache(blocks, capacity, block);
}

void* DeviceStaging::acquire(size_t bytes, size_t* capacity) { return take(pinned_, bytes, capacity); }

void DeviceStaging::release(void* block, size_t capacity) { give(pinned_, block, capacity); }

void* DeviceStaging::acquireDevice(size_t bytes, size_t* capacity) { return take(deviceBlocks_, bytes, capacity); }

void DeviceStaging::releaseDevice(void* block, size_t capacity) { give(deviceBlocks_, block, capacity); }

void DeviceStaging::cache(Blocks& blocks, size_t capacity, void* block) {
  blocks.emplace(capacity, block);
  if (blocks.size() <= kMaxCachedBlocks) return;
  // Sizes that vary more than takeCached() bridges would grow the cache
  // without bound; the smallest block goes (the large ones cost the most
  // to make again).
  void* smallest = blocks.begin()->second;
  blocks.erase(blocks.begin());
  try {
    if (&blocks == &pinned_) {
      runtime_->freePinned(smallest);
    } else {
      runtime_->freeDevice(smallest);
    }
  } catch (...) {  // a device error: its next call reports it
  }
}

void DeviceStaging::retire(device::Event event, std::vector<std::pair<void*, size_t>> blocks, void* pinned,
                           size_t pinnedCapacity) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    retired_.push_back({event, std::move(blocks), pinned, pinnedCapacity});
  }
  reap();
}

void DeviceStaging::reap() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < retired_.size();) {
    bool done = false;
    try {
      done = runtime_->done(retired_[i].event);
    } catch (...) {
      // A device error: the blocks may be in use for good; they stay here.
    }
    if (!done) {
      ++i;
      continue;
    }
    for (auto& [block, capacity] : retired_[i].blocks) cache(deviceBlocks_, capacity, block);
    if (retired_[i].pinned) cache(pinned_, retired_[i].pinnedCapacity, retired_[i].pinned);
    events_.push_back(retired_[i].event);
    retired_[i] = std::move(retired_.back());
    retired_.pop_back();
  }
}

device::Event DeviceStaging::takeEvent() {
  reap();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!events_.empty()) {
      device::Event e = events_.back();
      events_.pop_back();
      return e;
    }
  }
  return runtime_->createEvent(device_);
}

void DeviceStaging::giveEvent(device::Event event) {
  if (!event) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(event);
}

StagedCall::StagedCall(std::shared_ptr<DeviceStaging> staging, size_t hostBytes)
    : staging_(std::move(staging)), rt_(staging_->runtime()) {
  host_ = static_cast<char*>(staging_->acquire(hostBytes, &capacity_));
}

StagedCall::~StagedCall() {
  // The copies read and write the pinned block and the device work uses the
  // device blocks: they go back once that is done. Usually it is (the Work
  // waited); otherwise the blocks retire behind one event on the to-device
  // stream that follows both directions' copies, so that whichever thread
  // drops the last reference (the progress thread included) does not wait
  // (unless it also drops the last reference to a staging whose context
  // ended: ~DeviceStaging waits before it frees). The events this call
  // recorded are asked; an input event that a failed compression left
  // unrecorded holds an earlier record, which at worst releases the
  // blocks after work that later copies on the same streams follow anyway.
  try {
    const bool inputsPending = inputsQueued_ && !rt_.done(inputDone_.back());
    const bool copiesPending = anyCopyBack_ && !rt_.done(copiedBack_);
    if (inputsPending || copiesPending) {
      if (inputsPending) rt_.streamWait(staging_->toDevice(), inputDone_.back());
      rt_.record(copiedBack_, staging_->toDevice());
      // From here the staging owns them, whatever retire() does.
      device::Event last = std::exchange(copiedBack_, nullptr);
      char* host = std::exchange(host_, nullptr);
      staging_->retire(last, std::exchange(deviceBlocks_, {}), host, capacity_);
    }
  } catch (...) {
    // A device error: the blocks may still be in use; leak them rather
    // than reuse them (the events are only recorded again).
    host_ = nullptr;
    deviceBlocks_.clear();
  }
  staging_->release(host_, capacity_);
  for (auto& [block, capacity] : deviceBlocks_) staging_->releaseDevice(block, capacity);
  for (device::Event e : inputDone_) staging_->giveEvent(e);
  staging_->giveEvent(callerReady_);
  staging_->giveEvent(copiedBack_);
}

void* StagedCall::deviceBlock(size_t bytes) {
  size_t capacity = 0;
  void* block = staging_->acquireDevice(bytes, &capacity);
  deviceBlocks_.emplace_back(block, capacity);
  return block;
}

void StagedCall::setDeviceWork(std::function<void(device::Stream)> beforeInputs,
                               std::function<void(device::Stream)> afterCopyBack) {
  beforeInputs_ = std::move(beforeInputs);
  afterCopyBack_ = std::move(afterCopyBack);
}

void StagedCall::start(device::Stream stream) {
  callerReady_ = staging_->takeEvent();
  copiedBack_ = staging_->takeEvent();
  inputDone_.reserve(chunks_.size());
  for (size_t i = 0; i < chunks_.size(); ++i) inputDone_.push_back(staging_->takeEvent());
  rt_.record(callerReady_, stream);
}

void StagedCall::copyInputs() {
  if (inputsQueued_) return;
  inputsQueued_ = true;
  rt_.streamWait(staging_->toHost(), callerReady_);
  // After the copies back of earlier calls (this input may be their output).
  rt_.record(copiedBack_, staging_->toDevice());
  rt_.streamWait(staging_->toHost(), copiedBack_);
  try {
    if (beforeInputs_) beforeInputs_(staging_->toHost());
  } catch (...) {
    // What was queued before the failure still runs; the destructor waits for it.
    rt_.record(inputDone_.back(), staging_->toHost());
    throw;
  }
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    if (c.inBytes) rt_.copy(c.hostIn, c.deviceIn, c.inBytes, staging_->toHost());
    rt_.record(inputDone_[i], staging_->toHost());
  }
}

bool StagedCall::inputReady(size_t i) { return rt_.done(inputDone_.at(i)); }

void StagedCall::copyBack(size_t i) {
  const Chunk& c = chunks_.at(i);
  // The copies back follow the caller's work too: a chunk whose output the
  // caller's stream still writes must not be overwritten before. Queued
  // here, not when the call was made: the to-device stream would otherwise
  // hold the copies back of calls made earlier until the caller's stream
  // reached this call.
  if (!anyCopyBack_) rt_.streamWait(staging_->toDevice(), callerReady_);
  if (c.outBytes) rt_.copy(c.deviceOut, c.hostOut, c.outBytes, staging_->toDevice());
  // The event follows the copy even when the device work after it fails to
  // be queued: the pinned block goes back only after that copy read it.
  anyCopyBack_ = true;
  try {
    if (afterCopyBack_) afterCopyBack_(staging_->toDevice());
  } catch (...) {
    rt_.record(copiedBack_, staging_->toDevice());
    throw;
  }
  rt_.record(copiedBack_, staging_->toDevice());
}

bool StagedCall::done() { return !anyCopyBack_ || rt_.done(copiedBack_); }

void StagedCall::wait() {
  if (anyCopyBack_) rt_.synchronize(copiedBack_);
}

void StagedCall::streamWait(device::Stream stream) {
  if (anyCopyBack_) rt_.streamWait(stream, copiedBack_);
}

namespace {

class StagedSchedule final : public algorithms::Schedule {
 public:
  StagedSchedule(std::shared_ptr<StagedCall> call, size_t chunk, std::function<algorithms::SchedulePtr()> make)
      : call_(std::move(call)), chunk_(chunk), make_(std::move(make)) {}
  bool advance() override {
    bool moved = false;
    if (!inner_) {
      if (chunk_ == 0) call_->copyInputs();
      if (!call_->inputReady(chunk_)) return false;
      inner_ = make_();
      moved = true;
    }
    if (copied_) return moved;
    // At least once, and not after done(): the copy back is reading the output.
    if (!innerAdvanced_ || !inner_->done()) {
      innerAdvanced_ = true;
      moved = inner_->advance() || moved;
    }
    if (inner_->done()) {
      call_->copyBack(chunk_);
      copied_ = true;
      moved = true;
    }
    return moved;
  }
  bool done() const override { return copied_; }
  std::string waitingFor() const override {
    if (inner_) return inner_->waitingFor();
    return "the copy of chunk " + std::to_string(chunk_) + " of the device input into host memory";
  }
  std::vector<int> awaitedPeers() const override { return inner_ ? inner_->awaitedPeers() : std::vector<int>{}; }
  void healthCheck() override {
    if (inner_) inner_->healthCheck();
  }

 private:
  std::shared_ptr<StagedCall> call_;
  size_t chunk_;
  std::function<algorithms::SchedulePtr()> make_;
  algorithms::SchedulePtr inner_;
  bool innerAdvanced_ = false;
  bool copied_ = false;
};

}  // namespace

algorithms::SchedulePtr stagedSchedule(std::shared_ptr<StagedCall> call, size_t chunk,
                                       std::function<algorithms::SchedulePtr()> makeInner) {
  return algorithms::makeSchedule<StagedSchedule>(nullptr, std::move(call), chunk, std::move(makeInner));
}

}  // namespace gradcomm::detail
