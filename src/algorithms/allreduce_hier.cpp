// Hierarchical allreduce ("hier") for several hosts with several ranks each.
// The vector is cut into S = (largest host's rank count) slices. On host h,
// slice j belongs to local rank j % L_h, so on the largest host every local
// rank owns one slice and on smaller hosts some local ranks own several.
//   1. Reduce-scatter inside each host through shared memory: the owner of
//      each slice reduces every local rank's part of it, in local-rank
//      order, into its output.
//   2. For each slice, the owners on all hosts (one per host) run a ring
//      allreduce of it, in place in their outputs. Every slice has its own
//      ring, so every local rank of the largest host, and its link, is busy.
//   3. Allgather inside each host through shared memory: owners publish
//      their slices, every other local rank copies them.
// Phases 1 and 3 go through the ShmGroup's double buffers in rounds (each
// round moves c elements of every slice, c = buffer / (S * element size)),
// with the same round-number flags as the `shm` allreduce. Phase 2 is one
// Plan: the ring planner's plan per owned slice, with host indices mapped to
// the owners' ranks, spans moved to the slice, and message index
// m * stride + j (stride a power of two >= S): message indices that a
// transport truncates to its tag bits then still never collide between the
// rings of two slices that link the same pair of ranks.
// avg reduces as a sum and divides each slice by the world size once, after
// its ring, so every rank gets identical bits.
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/catalog.hpp"
#include "algorithms/hier_phases.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/plan_runner.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {

using transport::ShmGroup;
using transport::ShmRankBlock;

Plan hier::allreduceInterHostPlan(const CollectiveCall& call, const hier::Layout& l, const Tuning& tuning) {
  const auto& ring = static_cast<const PlannedAlgorithm&>(ringAllreduce());
  const patterns::Partition slices{call.count, l.slices};
  Plan all;
  for (size_t j = static_cast<size_t>(l.local); j < l.slices; j += l.localSize()) {
    if (slices.sizeOf(j) == 0) continue;
    CollectiveCall sub = call;
    sub.count = slices.sizeOf(j);
    sub.inPlace = true;
    if (sub.op == ReduceOp::kAvg) sub.op = ReduceOp::kSum;
    const uint32_t first = hier::appendSlicePlan(all, ring.plan(sub, l.host, static_cast<int>(l.hosts.size()), tuning),
                                                 l, j, slices.offsetOf(j));
    if (call.op == ReduceOp::kAvg) {
      // Once, after every step of this slice's ring (its sends read it too).
      Step div;
      div.kind = StepKind::kDivide;
      div.dst = out(slices.offsetOf(j), slices.sizeOf(j));
      div.depBegin = static_cast<uint32_t>(all.deps.size());
      for (uint32_t i = first; i < all.steps.size(); ++i) all.deps.push_back(i);
      div.depEnd = static_cast<uint32_t>(all.deps.size());
      all.steps.push_back(div);
    }
  }
  return all;
}

namespace {

class HierAllreduceSchedule final : public Schedule {
 public:
  HierAllreduceSchedule(const CollectiveCall& call, const RunContext& ctx, const Algorithm* algorithm)
      : call_(call), ctx_(ctx), layout_(hier::Layout::of(*ctx.transport)), elem_(dataTypeSize(call.type)) {
    const std::string problem = hier::layoutProblem(*ctx.transport, layout_);
    if (!problem.empty()) throw UnsupportedError("hierarchical allreduce: " + problem);
    in_ = static_cast<const char*>(call.input);
    out_ = static_cast<char*>(call.output);
    slices_ = patterns::Partition{call.count, layout_.slices};
    p_ = static_cast<int>(layout_.localSize());
    me_ = layout_.local;
    if (p_ >= 2) {
      g_ = ctx.transport->sharedMemory();
      chunk_ = g_->bufferBytes() / layout_.slices / elem_;
      const size_t longest = slices_.sizeOf(0);
      rounds_ = longest == 0 ? 1 : (longest + chunk_ - 1) / chunk_;
      // Every local rank takes the same round numbers, phase 1's then phase 3's.
      firstRound_ = g_->takeRound();
      for (size_t k = 1; k < rounds_; ++k) g_->takeRound();
      std::vector<hier::FanOutItem> items;
      for (size_t j = 0; j < layout_.slices; ++j) {
        const int owner = static_cast<int>(j % static_cast<size_t>(p_));
        items.push_back({owner, out_ + slices_.offsetOf(j) * elem_, slices_.offsetOf(j), slices_.sizeOf(j)});
      }
      gather_.start(*g_, std::move(items), out_, elem_, ctx_, "hierarchical allreduce");
    }
    interHost_ = hier::cachedPlan(algorithm, call, ctx, [&] { return hier::allreduceInterHostPlan(call, layout_, ctx.tuning); });
  }

  bool advance() override {
    bool moved = false;
    if (phase_ == 1) {
      if (p_ < 2) {
        if (!call_.inPlace && call_.count) std::memcpy(out_, in_, call_.count * elem_);
        phase_ = 2;
        moved = true;
      } else {
        for (bool any = true; any && reduceNext_ < rounds_;) {
          any = tryReduce() || tryStage();
          moved = moved || any;
        }
        if (reduceNext_ == rounds_) phase_ = 2;
      }
    }
    if (phase_ == 2) {
      if (!runner_) {
        CollectiveCall inPlace = call_;
        inPlace.input = out_;
        inPlace.inPlace = true;
        runner_ = makeSchedule<PlanRunner>(nullptr, interHost_, inPlace, ctx_);
        moved = true;
      }
      moved = runner_->advance() || moved;
      if (!runner_->done()) return moved;
      runner_.reset();
      phase_ = 3;
      moved = true;
    }
    if (phase_ == 3) {
      if (p_ >= 2) moved = gather_.advance() || moved;
      if (p_ < 2 || gather_.done()) phase_ = 4;
    }
    return moved;
  }

  bool done() const override { return phase_ == 4; }

  std::string waitingFor() const override {
    const std::string what = "hierarchical allreduce, ";
    if (phase_ == 2 && runner_) return what + "between hosts: " + runner_->waitingFor();
    if (phase_ == 3) return what + "allgather, " + gather_.waitingFor();
    std::string s = what + "reduce-scatter, round " + std::to_string(reduceNext_ + 1) + " of " +
                    std::to_string(rounds_) + " in this host: ";
    if (stalledOn_ >= 0 && g_) {
      return s + "waiting for rank " + std::to_string(g_->ranks()[static_cast<size_t>(stalledOn_)]) + " to " +
             stalledFor_;
    }
    return s + "running";
  }

  std::vector<int> awaitedPeers() const override {
    if (phase_ == 2 && runner_) return runner_->awaitedPeers();
    return {};
  }

  void healthCheck() override {
    if (g_) hier::checkPeersAlive(*g_, "hierarchical allreduce");
  }

 private:
  struct Part {
    size_t offset;  // in the vector
    size_t count;
  };
  // The part of slice j that round k moves; it sits at j * chunk_ in a buffer.
  Part part(size_t k, size_t j) const {
    const size_t begin = k * chunk_, n = slices_.sizeOf(j);
    if (begin >= n) return {slices_.offsetOf(j), 0};
    return {slices_.offsetOf(j) + begin, std::min(chunk_, n - begin)};
  }
  char* slot(int q, int b, size_t j) const { return g_->buffer(q, b) + j * chunk_ * elem_; }
  bool owns(int q, size_t j) const { return j % static_cast<size_t>(p_) == static_cast<size_t>(q); }

  // Phase 1, step a: stage the parts of the slices other local ranks own.
  bool tryStage() {
    const size_t k = stageNext_;
    if (k >= rounds_ || k > reduceNext_ + 1) return false;
    const uint64_t rid = firstRound_ + k;
    if (!hier::peersDoneWith(*g_, rid, &stalledOn_)) {
      stalledFor_ = "finish reading an earlier round";
      return false;
    }
    const int b = static_cast<int>(rid & 1);
    for (size_t j = 0; j < layout_.slices; ++j) {
      if (owns(me_, j)) continue;
      const Part pt = part(k, j);
      if (pt.count) std::memcpy(slot(me_, b, j), in_ + pt.offset * elem_, pt.count * elem_);
    }
    ShmRankBlock::Mailbox& box = g_->block(me_).mailbox[b];
    box.fingerprint = ctx_.tag.fingerprint;
    box.ready.store(rid, std::memory_order_release);
    ++stageNext_;
    return true;
  }

  // Phase 1, step b: reduce the parts of our slices from every local rank.
  bool tryReduce() {
    const size_t k = reduceNext_;
    if (k >= stageNext_) return false;
    const uint64_t rid = firstRound_ + k;
    const int b = static_cast<int>(rid & 1);
    for (int q = 0; q < p_; ++q) {
      if (q == me_) continue;
      const ShmRankBlock::Mailbox& box = g_->block(q).mailbox[b];
      if (box.ready.load(std::memory_order_acquire) < rid) {
        stalledOn_ = q;
        stalledFor_ = "stage its data";
        return false;
      }
      if (box.fingerprint != ctx_.tag.fingerprint) hier::throwShmMismatch(ctx_, *g_, q, "hierarchical allreduce");
    }
    for (size_t j = static_cast<size_t>(me_); j < layout_.slices; j += static_cast<size_t>(p_)) {
      const Part pt = part(k, j);
      if (!pt.count) continue;
      // Accumulate in our own (unstaged) slot: writing the output first would
      // clobber our input when in place. Operands go in local-rank order.
      char* acc = slot(me_, b, j);
      const char* prev = nullptr;
      for (int q = 0; q < p_; ++q) {
        const char* src = q == me_ ? in_ + pt.offset * elem_ : slot(q, b, j);
        if (!prev) {
          prev = src;
          continue;
        }
        ctx_.reduce(acc, prev, src, pt.count);
        prev = acc;
      }
      std::memcpy(out_ + pt.offset * elem_, acc, pt.count * elem_);
    }
    g_->block(me_).consumed.store(rid, std::memory_order_release);
    ++reduceNext_;
    stalledOn_ = -1;
    return true;
  }

  CollectiveCall call_;
  RunContext ctx_;
  hier::Layout layout_;
  size_t elem_;
  patterns::Partition slices_;
  ShmGroup* g_ = nullptr;
  int p_ = 1;
  int me_ = 0;
  size_t chunk_ = 0;
  size_t rounds_ = 0;
  uint64_t firstRound_ = 0;
  const char* in_ = nullptr;
  char* out_ = nullptr;
  int phase_ = 1;  // 1: reduce-scatter in the host, 2: between hosts, 3: allgather in the host, 4: done
  size_t stageNext_ = 0, reduceNext_ = 0;
  int stalledOn_ = -1;
  const char* stalledFor_ = "";
  std::shared_ptr<const CompiledPlan> interHost_;
  SchedulePtr runner_;
  hier::ShmFanOut gather_;
};

class HierAllreduce final : public Algorithm {
 public:
  const char* name() const override { return "hier"; }
  Collective collective() const override { return Collective::kAllreduce; }
  std::string unsupportedReason(const CollectiveCall&, const transport::Transport& t) const override {
    return hier::layoutProblem(t, hier::Layout::of(t));
  }
  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override {
    return makeSchedule<HierAllreduceSchedule>(ctx.workspace, call, ctx, this);
  }
};

}  // namespace

const Algorithm& hierAllreduce() {
  static const HierAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
