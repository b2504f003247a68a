// Shared-memory allreduce for ranks on one host ("shm"). The vector is cut
// into rounds of localSize * chunk elements. In each round every rank
//   1. stages the parts of its input that other ranks reduce into its own
//      shared buffer (double-buffered: rounds alternate between two),
//   2. reduces its own slice straight from the peers' buffers and its own
//      input, in rank order, into its output and its buffer,
//   3. gathers the other slices from the owners' buffers into its output.
// Atomic flags carrying round numbers order the steps; no MPI call is in the
// data path. Rounds pipeline: a rank stages round k+1 while peers still
// reduce round k. A rank reuses a buffer only after every peer has
// published that it finished reading the round that last used it.
//
// Small messages (one round, at most kDirectMaxBytes) take a shorter path
// with one synchronisation instead of two: every rank stages its whole
// input and reduces the whole vector itself, in rank order, so every rank
// still computes identical bits.
#include <immintrin.h>

#include <cstring>
#include <string>

#include "algorithms/catalog.hpp"
#include "algorithms/hier_phases.hpp"
#include "algorithms/patterns/partition.hpp"
#include "gradcomm/error.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::algorithms {
namespace {

using transport::ShmGroup;
using transport::ShmRankBlock;

class ShmAllreduceSchedule final : public Schedule {
  static constexpr const char* kWhat = "shared-memory allreduce";

 public:
  ShmAllreduceSchedule(const CollectiveCall& call, const RunContext& ctx, ShmGroup& g)
      : call_(call), ctx_(ctx), g_(g), p_(g.localSize()), me_(g.localRank()), elem_(dataTypeSize(call.type)) {
    chunk_ = g.bufferBytes() / static_cast<size_t>(p_) / elem_;
    roundElems_ = chunk_ * static_cast<size_t>(p_);
    rounds_ = call.count == 0 ? 1 : (call.count + roundElems_ - 1) / roundElems_;
    firstRound_ = 0;
    for (size_t k = 0; k < rounds_; ++k) {
      uint64_t id = g.takeRound();
      if (k == 0) firstRound_ = id;
    }
    in_ = static_cast<const char*>(call.input);
    out_ = static_cast<char*>(call.output);
    direct_ = rounds_ == 1 && call.count * elem_ <= kDirectMaxBytes;
  }

  bool advance() override {
    if (direct_) return advanceDirect();
    bool moved = false;
    for (bool any = true; any && !done();) {
      any = tryGather() || tryReduce() || tryStage();
      moved = moved || any;
    }
    return moved;
  }

  bool done() const override { return gatherNext_ == rounds_; }
  /// One round of at most kDirectMaxBytes: the path runInline() may take.
  bool direct() const { return direct_; }
  static constexpr size_t kDirectMaxBytes = transport::kShmDirectMaxBytes;

  std::string waitingFor() const override {
    std::string what = "shared-memory round " + std::to_string(gatherNext_ + 1) + " of " + std::to_string(rounds_) + ": ";
    return what + stall_.describe(&g_);
  }

  void healthCheck() override { hier::checkPeersAlive(g_, kWhat); }

 private:
  struct Slice {
    size_t offset;  // within the round
    size_t count;
  };
  size_t roundBegin(size_t k) const { return k * roundElems_; }
  size_t roundCount(size_t k) const {
    const size_t b = roundBegin(k);
    return b >= call_.count ? 0 : std::min(roundElems_, call_.count - b);
  }
  Slice slice(size_t k, int q) const {
    const patterns::Partition slices{roundCount(k), static_cast<size_t>(p_)};
    return {slices.offsetOf(static_cast<size_t>(q)), slices.sizeOf(static_cast<size_t>(q))};
  }
  uint64_t id(size_t k) const { return firstRound_ + k; }
  int buf(size_t k) const { return static_cast<int>(id(k) & 1); }

  // 1. Stage round stageNext_ (at most one round ahead of the gather).
  bool tryStage() {
    const size_t k = stageNext_;
    if (k >= rounds_ || k > gatherNext_ + 1) return false;
    // Buffer b last held round id-2: every peer must be done reading it.
    const uint64_t rid = id(k);
    if (int q = g_.peerStillReading(rid); q >= 0) return stall_.set(q, "finish reading an earlier round");
    const int b = buf(k);
    char* mine = g_.buffer(me_, b);
    const size_t begin = roundBegin(k), n = roundCount(k);
    const Slice own = slice(k, me_);
    // Everything but our own slice: peers reduce those parts.
    if (own.offset) std::memcpy(mine, in_ + begin * elem_, own.offset * elem_);
    const size_t after = own.offset + own.count;
    if (n > after) std::memcpy(mine + after * elem_, in_ + (begin + after) * elem_, (n - after) * elem_);
    g_.publish(b, rid, ctx_.tag.fingerprint);
    ++stageNext_;
    return true;
  }

  // 2. Reduce our slice of round reduceNext_ from every rank's data.
  bool tryReduce() {
    const size_t k = reduceNext_;
    if (k >= stageNext_) return false;
    const uint64_t rid = id(k);
    const int b = buf(k);
    for (int q = 0; q < p_; ++q) {
      if (q == me_) continue;
      const ShmRankBlock::Mailbox& box = g_.block(q).mailbox[b];
      if (box.ready.load(std::memory_order_acquire) < rid) return stall_.set(q, "stage its data");
      if (box.fingerprint != ctx_.tag.fingerprint) throwMismatch(q);
    }
    const size_t begin = roundBegin(k);
    const Slice own = slice(k, me_);
    if (own.count) {
      // Accumulate in our own slice of our buffer (staging leaves it free):
      // writing into the output first would clobber our input when in place.
      char* acc = g_.buffer(me_, b) + own.offset * elem_;
      reduceInRankOrder(ctx_, acc, p_, own.count, [&](int q) -> const char* {
        return q == me_ ? in_ + (begin + own.offset) * elem_ : g_.buffer(q, b) + own.offset * elem_;
      });
      if (call_.op == ReduceOp::kAvg) ctx_.divide(acc, own.count, static_cast<double>(p_));
      std::memcpy(out_ + (begin + own.offset) * elem_, acc, own.count * elem_);
    }
    g_.block(me_).reduced[b].store(rid, std::memory_order_release);
    ++reduceNext_;
    return true;
  }

  // 3. Gather the other slices of round gatherNext_ as their owners finish.
  bool tryGather() {
    const size_t k = gatherNext_;
    if (k >= reduceNext_) return false;
    const size_t begin = roundBegin(k);
    return gather_.look(g_, id(k), stall_, "reduce its slice", &gatherNext_, [&](int q, int b) {
      const Slice s = slice(k, q);
      if (s.count) std::memcpy(out_ + (begin + s.offset) * elem_, g_.buffer(q, b) + s.offset * elem_, s.count * elem_);
    });
  }

  // Small messages: stage everything, then reduce everything. Up to
  // Mailbox::kInlineBytes travel inside the mailbox cache line itself.
  bool advanceDirect() {
    bool moved = false;
    const int b = buf(0);
    const uint64_t rid = id(0);
    const size_t bytes = call_.count * elem_;
    const bool inlined = bytes <= ShmRankBlock::Mailbox::kInlineBytes;
    if (stageNext_ == 0) {
      if (int q = g_.peerStillReading(rid); q >= 0) return stall_.set(q, "finish reading an earlier round");
      if (bytes) std::memcpy(inlined ? g_.block(me_).mailbox[b].data : g_.buffer(me_, b), in_, bytes);
      g_.publish(b, rid, ctx_.tag.fingerprint);
      stageNext_ = 1;
      moved = true;
    }
    int late = -1;
    for (int q = 0; q < p_; ++q) {
      if (q == me_) continue;
      const ShmRankBlock::Mailbox& box = g_.block(q).mailbox[b];
      if (box.ready.load(std::memory_order_acquire) < rid) {
        if (late < 0) late = q;
        if (!inlined && bytes <= kPrefetchMaxBytes) prefetchStaged(q, b, bytes);
        continue;
      }
      if (box.fingerprint != ctx_.tag.fingerprint) throwMismatch(q);
    }
    if (late >= 0) return stall_.set(late, "stage its data") || moved;
    if (call_.count) {
      // Our own operand comes from our staged copy: in place, `out` is `in`.
      auto staged = [&](int q) -> const char* {
        return inlined ? g_.block(q).mailbox[b].data : g_.buffer(q, b);
      };
      ctx_.reduce(out_, staged(0), staged(1), call_.count);
      for (int q = 2; q < p_; ++q) ctx_.reduce(out_, out_, staged(q), call_.count);
      if (call_.op == ReduceOp::kAvg) ctx_.divide(out_, call_.count, static_cast<double>(p_));
    }
    g_.block(me_).consumed.store(rid, std::memory_order_release);
    reduceNext_ = gatherNext_ = 1;
    return true;
  }

  // A rank that finds a peer's data not staged yet prefetches that peer's
  // staging lines on each look. The peer writes them before its mailbox,
  // so a look after those writes brings the fresh lines in alongside the
  // mailbox, and the reduction that follows reads them from this core's
  // cache: one cross-core transfer less on the call's path (what loads
  // them is only a hint; the mailbox's `ready` still orders the reads).
  // Up to 512 B only: at a few KiB, prefetching every line on every look
  // pulls lines the peer is still writing back and forth, and is slower.
  static constexpr size_t kPrefetchMaxBytes = 512;
  void prefetchStaged(int q, int b, size_t bytes) const {
    const char* p = g_.buffer(q, b);
    for (size_t at = 0; at < bytes; at += 64) _mm_prefetch(p + at, _MM_HINT_T0);
  }

  // Both ranks announced their calls before staging anything (where this
  // communicator numbers the memory): the error names the field that differs.
  [[noreturn]] void throwMismatch(int q) const { hier::throwShmMismatch(ctx_, g_, q, kWhat); }

  CollectiveCall call_;
  RunContext ctx_;
  ShmGroup& g_;
  int p_;
  int me_;
  size_t elem_;
  size_t chunk_ = 0;
  size_t roundElems_ = 0;
  size_t rounds_ = 0;
  uint64_t firstRound_ = 0;
  const char* in_ = nullptr;
  char* out_ = nullptr;
  size_t stageNext_ = 0, reduceNext_ = 0, gatherNext_ = 0;
  hier::ShmGather gather_;
  bool direct_ = false;
  hier::ShmStall stall_;
};

class ShmAllreduce final : public Algorithm {
 public:
  const char* name() const override { return "shm"; }
  Collective collective() const override { return Collective::kAllreduce; }
  std::string unsupportedReason(const CollectiveCall&, const Team& team) const override {
    const transport::Transport& t = team.transport;
    auto& mt = const_cast<transport::Transport&>(t);
    if (t.size() < 2) return "it needs at least two ranks";
    const ShmGroup* g = mt.sharedMemory();
    if (!g) return "there is no shared memory between the ranks (one rank per host, or GRADCOMM_SHM=0)";
    if (g->localSize() != t.size()) {
      return "the ranks span several hosts (" + std::to_string(g->localSize()) + " of " + std::to_string(t.size()) +
             " share this one)";
    }
    if (g->localSize() > 64) return "it supports at most 64 ranks per host";
    if (g->bufferBytes() / static_cast<size_t>(g->localSize()) < 8) return "its chunk is smaller than one element";
    return {};
  }
  bool canRun(const CollectiveCall&, const Team& team) const override {
    const transport::Transport& t = team.transport;
    const ShmGroup* g = const_cast<transport::Transport&>(t).sharedMemory();
    return g && t.size() >= 2 && g->localSize() == t.size() && g->localSize() <= 64 &&
           g->bufferBytes() / static_cast<size_t>(g->localSize()) >= 8;
  }
  // Every rank reads every peer's mailbox, fingerprint included, each round.
  bool checksCalls() const override { return true; }
  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override {
    ShmGroup* g = ctx.transport->sharedMemory();
    if (!g) throw UnsupportedError("shared-memory allreduce without shared memory");
    return makeSchedule<ShmAllreduceSchedule>(ctx.workspace, call, ctx, *g);
  }
  // The whole call is one staged mailbox per rank and a reduction: no
  // operation object, queue or heap schedule is needed unless a peer is late.
  bool runsInline(const CollectiveCall& call, const RunContext& ctx) const override {
    return ctx.transport->sharedMemory() && call.count * dataTypeSize(call.type) <= ShmAllreduceSchedule::kDirectMaxBytes;
  }
  bool runInline(const CollectiveCall& call, const RunContext& ctx, InlinePatience patience,
                 SchedulePtr* rest) const override {
    ShmGroup* g = ctx.transport->sharedMemory();
    if (!g || !runsInline(call, ctx)) return false;
    ShmAllreduceSchedule s(call, ctx, *g);  // takes this call's round: no way back from here
    if (s.direct() && pollInline(s, patience)) return true;
    *rest = makeSchedule<ShmAllreduceSchedule>(ctx.workspace, std::move(s));
    return false;
  }
};

}  // namespace

const Algorithm& shmAllreduce() {
  static const ShmAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
