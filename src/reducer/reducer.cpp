#include "gradcomm/reducer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/communicator_impl.hpp"
#include "compression/compression.hpp"
#include "base/log.hpp"
#include "base/timeline.hpp"
#include "base/units.hpp"
#include "device/runtime.hpp"
#include "reducer/bucket_layout.hpp"

namespace gradcomm {
namespace detail {

using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// Frees bucket memory: host memory, or device memory of `rt`.
struct AlignedFree {
  device::Runtime* rt = nullptr;
  void operator()(char* p) const {
    if (rt) rt->freeDevice(p);
    else std::free(p);
  }
};

}  // namespace

class ReducerImpl {
 public:
  ReducerImpl(Communicator comm, std::vector<GradientSpec> grads, ReducerOptions o)
      : comm_(std::move(comm)), grads_(std::move(grads)), opts_(std::move(o)) {
    auto& impl = *comm_.impl();
    const core::Config& cfg = impl.config();
    if (opts_.bucketCapBytes == 0) opts_.bucketCapBytes = cfg.bucketCapBytes;
    if (opts_.firstBucketBytes == 0) opts_.firstBucketBytes = cfg.firstBucketBytes;
    const bool partitionFromConfig = opts_.partitionBytes == 0;
    if (partitionFromConfig) opts_.partitionBytes = cfg.partitionBytes == 0 ? SIZE_MAX : cfg.partitionBytes;
    if (opts_.timelinePath.empty()) opts_.timelinePath = cfg.timelinePath;
    if (opts_.compression.empty()) opts_.compression = cfg.compression;
    try {
      compression_ = compression::Spec::parse(opts_.compression);
    } catch (const ConfigError& e) {
      throw InvalidArgument(std::string("ReducerOptions::compression: ") + e.what());
    }
    rank_ = comm_.rank();
    // ReducerOptions::printStats asks for every step; GRADCOMM_STATS=N for
    // every Nth. Rank 0 speaks for all unless GRADCOMM_STATS_ALL_RANKS=1.
    statsEvery_ = cfg.statsEvery > 0 ? cfg.statsEvery : (opts_.printStats ? 1 : 0);
    if (!cfg.statsAllRanks && rank_ != 0) statsEvery_ = 0;
    warnAboutTinyPartitions(partitionFromConfig);
    validateLocally();
    placeBuckets();
    // A rank that cannot write its timeline says so in the agreement, so
    // every rank fails alike instead of the others waiting for it.
    std::string timelineError;
    if (!opts_.timelinePath.empty()) {
      try {
        timeline_ = std::make_unique<core::Timeline>(core::Timeline::perRankPath(opts_.timelinePath, rank_), rank_);
      } catch (const Error& e) {
        timelineError = e.what();
      }
    }
    agreeAcrossRanks(timelineError);
    // Every rank leaves the agreement's allgather at about the same time:
    // the common zero of the ranks' traces.
    if (timeline_) timeline_->setOrigin(Clock::now());
    info_.reserve(grads_.size());
    for (const auto& g : grads_) info_.push_back({g.count, g.type});
    install(reducer::assignBuckets(info_, reducer::reverseOrder(grads_.size()), opts_.firstBucketBytes,
                                   opts_.bucketCapBytes),
            false);
    state_.assign(grads_.size(), kPending);
    logLayout("initial layout, gradients in reverse registration order");
  }

  ~ReducerImpl() {
    if (timeline_) timeline_->flush();
    if (rt_) {
      // The buckets are freed below: the Reducer's copies must be done.
      try {
        syncStream();
      } catch (const Error& e) {
        core::log(core::LogLevel::kWarn, rank_, std::string("Reducer: device error at destruction: ") + e.what());
      }
      rt_->destroyEvent(producedEvent_);
      rt_->destroyEvent(copiedOutEvent_);
      rt_->destroyStream(stream_);
    }
  }

  void* gradient(size_t i) {
    checkIndex(i, "gradient");
    if (!opts_.gradientAsBucketView) return grads_[i].data;
    return bucketPtr(layout_.bucketOf[i]) + layout_.offsetOf[i] * dataTypeSize(grads_[i].type);
  }

  void markReady(size_t i) { mark(i, false); }
  void markUnused(size_t i) { mark(i, true); }

  void setSynchronization(bool enabled) {
    std::lock_guard<std::mutex> lock(mu_);
    if (marked_ != 0) {
      fail(InvalidUsage("setSynchronization() called in the middle of a step (" + std::to_string(marked_) +
                        " gradients already marked); call it before the first markReady() of a step"),
           "misused its Reducer");
    }
    sync_ = enabled;
  }

  void finalize() {
    const auto entered = Clock::now();
    std::vector<size_t> missing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < state_.size(); ++i) {
        if (state_[i] == kPending) missing.push_back(i);
      }
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t k = 0; k < missing.size() && k < 16; ++k) list += (k ? ", " : "") + std::to_string(missing[k]);
      if (missing.size() > 16) list += ", ... (" + std::to_string(missing.size()) + " in all)";
      fail(InvalidUsage("Reducer::finalize(): gradient(s) " + list +
                        " were never marked ready in this step; call markReady() for every gradient, or "
                        "markUnused() for those this step does not produce"),
           "misused its Reducer");
    }
    StepStats st;
    st.step = step_;
    st.synchronized = sync_;
    if (sync_) {
      for (auto& w : works_) w.work.wait();
    }
    const auto waited = Clock::now();
    if (sync_) {
      for (auto& w : works_) {
        st.commMs += ms(w.work.endTime() - w.work.startTime());
        st.bytes += w.work.bytes();
        if (timeline_) {
          timeline_->span("allreduce bucket " + std::to_string(w.bucket), "collective", w.work.startTime(),
                          w.work.endTime(), core::Timeline::kComm,
                          "\"bucket\": " + std::to_string(w.bucket) + ", \"bytes\": " + std::to_string(w.work.bytes()) +
                              ", \"algorithm\": \"" + w.work.algorithm() + "\"");
          for (const auto& ph : w.work.phases()) {
            timeline_->span(ph.name + " bucket " + std::to_string(w.bucket), ph.name.c_str(), ph.start, ph.end,
                            core::Timeline::kComm, "\"bucket\": " + std::to_string(w.bucket));
          }
        }
      }
      st.buckets = works_.size();
      for (const auto& w : works_) {
        if (w.bucket == works_.back().bucket) st.lastBucketMs += ms(w.work.endTime() - w.work.startTime());
      }
      if (!opts_.gradientAsBucketView) copyOut();
    }
    if (rt_) {
      // Work the caller queues on its stream from here reads the result.
      rt_->record(copiedOutEvent_, stream_);
      rt_->streamWait(opts_.stream, copiedOutEvent_);
    }
    works_.clear();
    const auto end = Clock::now();
    if (timeline_) {
      timeline_->span("finalize (blocked)", "stall", entered, waited, core::Timeline::kCompute);
      timeline_->flush();
    }
    st.exposedMs = ms(end - entered);
    st.stepMs = ms(end - stepStart_);
    st.computeMs = st.stepMs - st.exposedMs;
    st.hiddenMs = std::max(0.0, st.commMs - st.exposedMs);
    st.utilization = st.stepMs > 0 ? st.computeMs / st.stepMs : 1.0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = st;
    }
    if (statsEvery_ > 0 && st.step % static_cast<uint64_t>(statsEvery_) == 0) {
      std::fprintf(stderr,
                   "gradcomm[rank %d] step %llu: step %.2f ms, communication %.2f ms (exposed %.2f, hidden %.2f), "
                   "utilization %.3f, %zu allreduces, %.1f MB%s\n",
                   rank_, static_cast<unsigned long long>(st.step), st.stepMs, st.commMs, st.exposedMs, st.hiddenMs,
                   st.utilization, st.buckets, st.bytes / 1e6, sync_ ? "" : " (no synchronisation)");
    }
    if (sync_ && opts_.rebuildBuckets && !rebuilt_) rebuild();
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(state_.begin(), state_.end(), kPending);
    for (auto& part : parts_) part.pending = part.gradients;
    readyOrder_.clear();
    marked_ = 0;
    nextPart_ = 0;
    ++step_;
    stepStart_ = end;
    stepStarted_ = true;
  }

  StepStats lastStepStats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  std::vector<std::vector<size_t>> buckets() const {
    std::vector<std::vector<size_t>> out;
    for (const auto& b : layout_.buckets) out.push_back(b.gradients);
    return out;
  }

 private:
  enum State : uint8_t { kPending, kReady, kUnused };
  struct Launched {
    size_t bucket;
    Work work;
  };

  [[noreturn]] void fail(const Error& e, const std::string& what) { comm_.impl()->abortAndThrow(e, what); }

  void checkIndex(size_t i, const char* fn) const {
    if (i >= grads_.size()) {
      throw InvalidArgument(std::string("Reducer::") + fn + "(" + std::to_string(i) + "): there are only " +
                            std::to_string(grads_.size()) + " gradients");
    }
  }

  /// Buckets on the host, or on the gradients' device (then the Reducer
  /// copies on a stream of its own, ordered after ReducerOptions::stream).
  void placeBuckets() {
    int device = opts_.gradientAsBucketView ? opts_.device : -1;
    if (!opts_.gradientAsBucketView && !grads_.empty()) {
      device::Runtime& rt = device::runtime();
      if (rt.devicesPresent()) {
        std::string host, dev;
        for (size_t i = 0; i < grads_.size(); ++i) {
          if (!grads_[i].count) continue;
          const device::Memory m = rt.classify(grads_[i].data);
          if (!m.device) {
            if (host.empty()) host = std::to_string(i);
            continue;
          }
          if (dev.empty()) dev = std::to_string(i), device = m.ordinal;
          if (m.ordinal != device) {
            throw InvalidArgument("Reducer: gradient " + dev + " is on device " + std::to_string(device) +
                                  " but gradient " + std::to_string(i) + " on device " + std::to_string(m.ordinal) +
                                  "; every gradient must be on one device");
          }
        }
        if (!host.empty() && !dev.empty()) {
          throw InvalidArgument("Reducer: gradient " + host + " is host memory but gradient " + dev +
                                " is device memory (device " + std::to_string(device) +
                                "); register gradients of one kind");
        }
      }
    }
    if (device < 0) return;
    rt_ = device::sharedRuntime();
    if (!rt_->canMoveDeviceMemory()) {
      throw UnsupportedError("Reducer: the gradients are device memory, but this gradcomm was built without CUDA");
    }
    device_ = device;
    stream_ = rt_->createStream(device);
    producedEvent_ = rt_->createEvent(device);
    copiedOutEvent_ = rt_->createEvent(device);
  }

  /// Copies `bytes` between gradient and bucket memory: at once on the
  /// host; on the Reducer's stream for device buckets.
  void copyBytes(void* dst, const void* src, size_t bytes) {
    if (rt_) rt_->copy(dst, src, bytes, stream_);
    else std::memcpy(dst, src, bytes);
  }
  void zeroBytes(void* p, size_t bytes) {
    if (rt_) rt_->zero(p, bytes, stream_);
    else std::memset(p, 0, bytes);
  }

  void validateLocally() const {
    for (size_t i = 0; i < grads_.size(); ++i) {
      const auto& g = grads_[i];
      (void)dataTypeSize(g.type);  // throws for an invalid enum
      if (!opts_.gradientAsBucketView && g.count > 0 && !g.data) {
        throw InvalidArgument("Reducer: gradient " + std::to_string(i) +
                              " has no data pointer (pass GradientSpec::data, or use gradientAsBucketView)");
      }
    }
    if (opts_.firstBucketBytes == 0 || opts_.bucketCapBytes == 0) {
      throw ConfigError("Reducer: bucket caps must be positive");
    }
  }

  /// Every rank must have registered the same gradients: compare counts and
  /// types once, at construction, and name the first difference.
  void agreeAcrossRanks(const std::string& localError) {
    const int p = comm_.size();
    constexpr uint64_t kFailed = ~uint64_t{0};
    uint64_t n = localError.empty() ? grads_.size() : kFailed;
    std::vector<uint64_t> all(static_cast<size_t>(p));
    comm_.allgather(&n, all.data(), 1, DataType::kInt64).wait();
    if (!localError.empty()) throw ConfigError("Reducer: " + localError);
    for (int r = 0; r < p; ++r) {
      if (all[static_cast<size_t>(r)] == kFailed) {
        throw ConfigError("Reducer: rank " + std::to_string(r) + " cannot write its timeline (GRADCOMM_TIMELINE)");
      }
    }
    for (int r = 0; r < p; ++r) {
      if (all[static_cast<size_t>(r)] != n) {
        throw InvalidArgument("Reducer: rank " + std::to_string(rank_) + " registered " + std::to_string(n) +
                              " gradients but rank " + std::to_string(r) + " registered " +
                              std::to_string(all[static_cast<size_t>(r)]) + "; every rank must register the same");
      }
    }
    std::vector<int64_t> mine(2 * n), every(2 * n * static_cast<size_t>(p));
    for (size_t i = 0; i < n; ++i) {
      mine[2 * i] = static_cast<int64_t>(grads_[i].count);
      mine[2 * i + 1] = static_cast<int64_t>(grads_[i].type);
    }
    comm_.allgather(mine.data(), every.data(), mine.size(), DataType::kInt64).wait();
    for (size_t i = 0; i < n; ++i) {
      for (int r = 0; r < p; ++r) {
        const int64_t* theirs = every.data() + static_cast<size_t>(r) * 2 * n;
        if (theirs[2 * i] != mine[2 * i] || theirs[2 * i + 1] != mine[2 * i + 1]) {
          throw InvalidArgument("Reducer: gradient " + std::to_string(i) + " has " + std::to_string(mine[2 * i]) + " " +
                                toString(static_cast<DataType>(mine[2 * i + 1])) + " elements on rank " +
                                std::to_string(rank_) + " but " + std::to_string(theirs[2 * i]) + " " +
                                toString(static_cast<DataType>(theirs[2 * i + 1])) + " on rank " + std::to_string(r) +
                                "; every rank must register the same gradients in the same order");
        }
      }
    }
  }

  char* bucketPtr(size_t b) const { return memory_[b].get(); }

  /// Switches to a new layout. With `keepValues`, the gradients' current
  /// values move into the new bucket memory (views must not change value).
  void install(reducer::BucketLayout layout, bool keepValues) {
    std::vector<std::unique_ptr<char, AlignedFree>> memory;
    for (const auto& b : layout.buckets) {
      const size_t bytes = std::max<size_t>(64, (b.count * dataTypeSize(b.type) + 63) / 64 * 64);
      char* p = rt_ ? static_cast<char*>(rt_->allocateDevice(device_, bytes))
                    : static_cast<char*>(std::aligned_alloc(64, bytes));
      if (!p) throw std::bad_alloc();
      memory.emplace_back(p, AlignedFree{rt_.get()});
      zeroBytes(p, bytes);
    }
    if (keepValues) {
      for (size_t g = 0; g < grads_.size(); ++g) {
        const size_t e = dataTypeSize(grads_[g].type);
        copyBytes(memory[layout.bucketOf[g]].get() + layout.offsetOf[g] * e,
                  bucketPtr(layout_.bucketOf[g]) + layout_.offsetOf[g] * e, grads_[g].count * e);
      }
    }
    // The caller may write the new buckets (views) on any stream from here,
    // and the old ones go below: zeroing and copies must be done.
    syncStream();
    layout_ = std::move(layout);
    memory_ = std::move(memory);
    buildParts();
  }

  /// Cuts every bucket into partitions (of partitionBytes, or whole) and
  /// records which gradients each one waits for. Partitions launch in
  /// (bucket, partition) order as soon as their own gradients are ready, so
  /// a large bucket starts moving before its last gradient arrives.
  void buildParts() {
    parts_.clear();
    partsOfGrad_.assign(grads_.size(), {});
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      const auto& bucket = layout_.buckets[b];
      const size_t e = dataTypeSize(bucket.type);
      const size_t per = opts_.partitionBytes == SIZE_MAX ? std::max<size_t>(bucket.count, 1)
                                                          : std::max<size_t>(1, opts_.partitionBytes / e);
      for (size_t off = 0; off < bucket.count || (bucket.count == 0 && off == 0); off += per) {
        Part part;
        part.bucket = b;
        part.offset = off;
        part.count = std::min(per, bucket.count - off);
        for (size_t k = 0; k < bucket.gradients.size(); ++k) {
          const size_t g = bucket.gradients[k], begin = bucket.offsets[k], end = begin + grads_[g].count;
          // Empty gradients belong to the partition that holds their offset.
          const bool overlaps = grads_[g].count ? (begin < off + part.count && off < end)
                                                : (begin >= off && (begin < off + part.count || part.count == 0));
          if (overlaps) {
            ++part.gradients;
            partsOfGrad_[g].push_back(parts_.size());
          }
        }
        part.pending = part.gradients;
        parts_.push_back(part);
        if (bucket.count == 0) break;
      }
    }
  }

  void mark(size_t i, bool unused) {
    const auto now = Clock::now();
    checkIndex(i, unused ? "markUnused" : "markReady");
    std::vector<size_t> launch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stepStarted_) {
        stepStart_ = now;
        stepStarted_ = true;
      }
      if (state_[i] != kPending) {
        fail(InvalidUsage("Reducer: gradient " + std::to_string(i) + " was marked " +
                          (state_[i] == kReady ? "ready" : "unused") +
                          " twice in one step; mark each gradient once per step, then call finalize()"),
             "misused its Reducer");
      }
      state_[i] = unused ? kUnused : kReady;
      ++marked_;
      readyOrder_.push_back(i);
      const size_t b = layout_.bucketOf[i];
      const size_t e = dataTypeSize(grads_[i].type);
      char* slot = bucketPtr(b) + layout_.offsetOf[i] * e;
      if (rt_ && !unused) {
        // The gradient is complete once the work queued on the caller's
        // stream so far is: the copy (and, for views, the allreduce) follow it.
        rt_->record(producedEvent_, opts_.stream);
        rt_->streamWait(stream_, producedEvent_);
      }
      if (unused) {
        zeroBytes(slot, grads_[i].count * e);
      } else if (!opts_.gradientAsBucketView && sync_ && grads_[i].count) {
        copyBytes(slot, grads_[i].data, grads_[i].count * e);
      }
      for (size_t part : partsOfGrad_[i]) --parts_[part].pending;
      // Launch, in (bucket, partition) order, every partition that is complete.
      while (sync_ && nextPart_ < parts_.size() && parts_[nextPart_].pending == 0) launch.push_back(nextPart_++);
      for (size_t part : launch) launchPart(part);
    }
    if (timeline_) {
      timeline_->instant((unused ? "unused " : "ready ") + std::to_string(i), "gradient", now, core::Timeline::kCompute,
                         "\"gradient\": " + std::to_string(i));
      for (size_t part : launch) {
        timeline_->instant("queue bucket " + std::to_string(parts_[part].bucket), "bucket", Clock::now(),
                           core::Timeline::kCompute,
                           "\"bucket\": " + std::to_string(parts_[part].bucket) +
                               ", \"offset\": " + std::to_string(parts_[part].offset));
      }
    }
  }

  // Called with mu_ held: submission order is launch order on every rank.
  void launchPart(size_t index) {
    const Part& part = parts_[index];
    const auto& bucket = layout_.buckets[part.bucket];
    const size_t e = dataTypeSize(bucket.type);
    const ReduceOp op = opts_.average && isFloatingPoint(bucket.type) ? ReduceOp::kAvg : ReduceOp::kSum;
    CollectiveOptions co;
    co.algorithm = opts_.algorithm;
    // Compression applies to float32 buckets (others stay exact); each
    // partition keeps its own error feedback.
    const bool compress = compression_.kind != compression::Kind::kNone && bucket.type == DataType::kFloat32;
    co.compression = compress ? compression_.toString() : "none";
    co.errorFeedback = compress && compression_.errorFeedback ? &feedback(part.bucket, part.offset, part.count) : nullptr;
    co.stream = stream_;
    char* at = bucketPtr(part.bucket) + part.offset * e;
    works_.push_back({part.bucket, comm_.allreduce(at, at, part.count, bucket.type, op, co)});
  }

  /// Error feedback of the partition of bucket b at element `offset`.
  ErrorFeedback& feedback(size_t b, size_t offset, size_t count) {
    auto& f = feedback_[{b, offset}];
    if (f.size() != 0 && f.size() != count) f.clear();
    return f;
  }

  /// New buckets: move each gradient's carried error to its new place, so
  /// rebuilding loses nothing that compression has not sent yet. Device
  /// buckets' residuals are device memory: read out and written back on the
  /// Reducer's stream (no step is in flight while buckets are rebuilt).
  void remapFeedback(const reducer::BucketLayout& from, const reducer::BucketLayout& to) {
    if (feedback_.empty()) return;
    std::map<std::pair<size_t, size_t>, std::vector<float>> old;
    for (auto& [key, f] : feedback_) {
      auto& v = old[key];
      v.resize(f.size());
      if (!v.empty()) copyBytes(v.data(), f.data(), v.size() * sizeof(float));
    }
    syncStream();
    const size_t per = opts_.partitionBytes == SIZE_MAX ? SIZE_MAX : std::max<size_t>(1, opts_.partitionBytes / 4);
    std::vector<std::vector<float>> carried(grads_.size());
    for (size_t g = 0; g < grads_.size(); ++g) {
      if (grads_[g].type != DataType::kFloat32) continue;
      carried[g].assign(grads_[g].count, 0.0f);
      const size_t b = from.bucketOf[g], off = from.offsetOf[g];
      for (size_t i = 0; i < grads_[g].count; ++i) {
        const size_t at = off + i;
        const size_t part = per == SIZE_MAX ? 0 : at / per * per;
        auto it = old.find({b, part});
        if (it != old.end() && it->second.size() > at - part) carried[g][i] = it->second[at - part];
      }
    }
    feedback_.clear();
    std::vector<std::vector<float>> staged;  // host sources of the copies in flight
    for (size_t b = 0; b < to.buckets.size(); ++b) {
      const auto& bucket = to.buckets[b];
      if (bucket.type != DataType::kFloat32) continue;
      const size_t step = per == SIZE_MAX ? bucket.count : per;
      for (size_t part = 0; part < bucket.count; part += step) {
        const size_t n = std::min(step, bucket.count - part);
        std::vector<float>& values = staged.emplace_back(n, 0.0f);
        for (size_t k = 0; k < bucket.gradients.size(); ++k) {
          const size_t g = bucket.gradients[k], off = bucket.offsets[k];
          for (size_t i = 0; i < grads_[g].count; ++i) {
            const size_t at = off + i;
            if (at >= part && at < part + n) values[at - part] = carried[g][i];
          }
        }
        compression::Residual& r = feedback(b, part, n).residual();
        float* dst = rt_ ? r.deviceData(n, device_, [this](size_t bytes) {
                             return device::allocateOwned(rt_, device_, bytes);
                           })
                         : r.data(n);
        copyBytes(dst, values.data(), n * sizeof(float));
      }
    }
    syncStream();
  }

  /// Device buckets: waits for what is queued on the Reducer's stream.
  void syncStream() {
    if (!rt_) return;
    rt_->record(copiedOutEvent_, stream_);
    rt_->synchronize(copiedOutEvent_);
  }

  void copyOut() {
    for (size_t g = 0; g < grads_.size(); ++g) {
      const size_t e = dataTypeSize(grads_[g].type);
      if (grads_[g].count) {
        copyBytes(grads_[g].data, bucketPtr(layout_.bucketOf[g]) + layout_.offsetOf[g] * e, grads_[g].count * e);
      }
    }
  }

  /// After the first synchronised step: everyone adopts rank 0's ready order.
  void rebuild() {
    rebuilt_ = true;
    std::vector<int64_t> order(grads_.size());
    for (size_t k = 0; k < readyOrder_.size(); ++k) order[k] = static_cast<int64_t>(readyOrder_[k]);
    comm_.broadcast(order.data(), order.data(), order.size(), DataType::kInt64, 0).wait();
    std::vector<size_t> o(order.begin(), order.end());
    auto layout = reducer::assignBuckets(info_, o, opts_.firstBucketBytes, opts_.bucketCapBytes);
    bool same = layout.buckets.size() == layout_.buckets.size();
    for (size_t b = 0; same && b < layout.buckets.size(); ++b) same = layout.buckets[b].gradients == layout_.buckets[b].gradients;
    if (!same) {
      remapFeedback(layout_, layout);
      install(std::move(layout), opts_.gradientAsBucketView);
      logLayout("rebuilt in the order gradients became ready on rank 0");
    } else {
      if (rank_ == 0) core::log(core::LogLevel::kInfo, rank_, "Reducer: the ready order keeps the bucket layout");
    }
  }

  /// Partitions of a few bytes turn a bucket into thousands of allreduces,
  /// each paying a full network latency: say so once, with what to use.
  void warnAboutTinyPartitions(bool fromConfig) const {
    constexpr size_t kSmallestSensibleBytes = 64 * 1024;
    if (rank_ != 0 || opts_.partitionBytes == SIZE_MAX || opts_.partitionBytes >= kSmallestSensibleBytes) return;
    core::logOnce(core::LogLevel::kWarn, rank_,
                  std::string("Reducer: partitions of ") + core::formatBytes(opts_.partitionBytes) + " bytes" +
                      (fromConfig ? " (GRADCOMM_PARTITION_SIZE)" : " (ReducerOptions::partitionBytes)") +
                      " make one allreduce per few bytes, each paying a full network latency; use 1M to 8M "
                      "(the default is 4M), or 0 for whole buckets");
  }

  /// info: the buckets (rank 0; every rank has the same layout).
  void logLayout(const std::string& why) const {
    if (rank_ != 0 || !core::logEnabled(core::LogLevel::kInfo)) return;
    size_t total = 0;
    std::string list;
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      const auto& bucket = layout_.buckets[b];
      const size_t bytes = bucket.count * dataTypeSize(bucket.type);
      total += bytes;
      if (b < 16) {
        list += "; bucket " + std::to_string(b) + ": " + std::to_string(bucket.gradients.size()) + " gradients, " +
                core::formatBytes(bytes) + " bytes of " + toString(bucket.type);
      }
    }
    if (layout_.buckets.size() > 16) list += "; ...";
    const std::string partitions =
        opts_.partitionBytes == SIZE_MAX ? "whole buckets" : "partitions of " + core::formatBytes(opts_.partitionBytes);
    core::log(core::LogLevel::kInfo, rank_,
              "Reducer: " + std::to_string(grads_.size()) + " gradients, " + core::formatBytes(total) + " bytes in " +
                  std::to_string(layout_.buckets.size()) + " buckets (" + why + "; first bucket cap " +
                  core::formatBytes(opts_.firstBucketBytes) + ", cap " + core::formatBytes(opts_.bucketCapBytes) +
                  ", " + partitions + ", " + std::to_string(parts_.size()) + " allreduces per step, compression " +
                  compression_.toString() + ")" + list);
  }

  Communicator comm_;
  std::vector<GradientSpec> grads_;
  std::vector<reducer::GradientInfo> info_;
  ReducerOptions opts_;
  int statsEvery_ = 0;  // print StepStats every this many steps (0: never)
  int rank_ = 0;
  reducer::BucketLayout layout_;
  /// Device buckets (placeBuckets): the runtime, their device, the stream
  /// the Reducer copies and reduces on, and two events it reuses. Null
  /// runtime: host buckets. Declared before memory_, which frees through it.
  std::shared_ptr<device::Runtime> rt_;
  int device_ = -1;
  device::Stream stream_ = nullptr;
  device::Event producedEvent_ = nullptr;
  device::Event copiedOutEvent_ = nullptr;
  std::vector<std::unique_ptr<char, AlignedFree>> memory_;
  std::unique_ptr<core::Timeline> timeline_;

  mutable std::mutex mu_;
  std::vector<State> state_;
  struct Part {
    size_t bucket = 0;
    size_t offset = 0;     // elements into the bucket
    size_t count = 0;
    size_t gradients = 0;  // gradients overlapping it
    size_t pending = 0;    // of those, not yet ready this step
  };
  std::vector<Part> parts_;                     // in launch order
  std::vector<std::vector<size_t>> partsOfGrad_;  // per gradient
  std::vector<size_t> readyOrder_;
  size_t marked_ = 0;
  size_t nextPart_ = 0;
  std::vector<Launched> works_;
  compression::Spec compression_;
  std::map<std::pair<size_t, size_t>, ErrorFeedback> feedback_;  // (bucket, partition offset)
  bool sync_ = true;
  bool rebuilt_ = false;
  uint64_t step_ = 0;
  bool stepStarted_ = false;
  Clock::time_point stepStart_{};
  StepStats last_;
};

}  // namespace detail

Reducer::Reducer(Communicator comm, std::vector<GradientSpec> gradients, ReducerOptions options)
    : impl_(std::make_unique<detail::ReducerImpl>(std::move(comm), std::move(gradients), std::move(options))) {}
Reducer::~Reducer() = default;
void* Reducer::gradient(size_t i) { return impl_->gradient(i); }
void Reducer::markReady(size_t i) { impl_->markReady(i); }
void Reducer::markUnused(size_t i) { impl_->markUnused(i); }
void Reducer::finalize() { impl_->finalize(); }
void Reducer::setSynchronization(bool enabled) { impl_->setSynchronization(enabled); }
StepStats Reducer::lastStepStats() const { return impl_->lastStepStats(); }
std::vector<std::vector<size_t>> Reducer::buckets() const { return impl_->buckets(); }

}  // namespace gradcomm
