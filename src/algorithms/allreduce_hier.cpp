// Hierarchical allreduce ("hier") for several hosts with several ranks each.
// The vector is cut into S = (largest host's rank count) slices. On host h,
// slice j belongs to local rank j % L_h, so on the largest host every local
// rank owns one slice and on smaller hosts some local ranks own several.
//   1. Reduce-scatter inside each host through shared memory: the owner of
//      each slice reduces every local rank's part of it, in local-rank
//      order, into its output.
//   2. For each slice, the owners on all hosts (one per host) run an
//      allreduce of it, in place in their outputs: recursive doubling when
//      the call's largest slice is at most Tuning::hierRdSliceBytes
//      (GRADCOMM_HIER_RD_SIZE; latency-bound) or there are two hosts, else
//      a ring (topology::hierExchangesByRd). Every slice has
//      its own exchange, so every local rank of the largest host, and its
//      link, is busy.
//   3. Allgather inside each host through shared memory: owners publish
//      their slices, every other local rank copies them.
// Phases 1 and 3 go through the ShmGroup's double buffers in rounds (each
// round moves c elements of every slice, c = buffer / (S * element size)),
// with the same round-number flags as the `shm` allreduce. Phase 2 is one
// Plan: the planner's plan per owned slice, with host indices mapped to
// the owners' ranks, spans moved to the slice, and message index
// m * stride + j (stride a power of two >= S): message indices that a
// transport truncates to its tag bits then still never collide between the
// exchanges of two slices that link the same pair of ranks.
// avg reduces as a sum and divides each slice by the world size once, after
// its exchange, so every rank gets identical bits.
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/catalog.hpp"
#include "algorithms/hier_phases.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/plan_runner.hpp"
#include "gradcomm/error.hpp"
#include "topology/cost_model.hpp"

namespace gradcomm::algorithms {

using transport::ShmGroup;
using transport::ShmRankBlock;

Plan hier::allreduceInterHostPlan(const CollectiveCall& call, const hier::Layout& l, const Tuning& tuning,
                                  uint32_t lane, size_t laneScratch) {
  const patterns::Partition slices{
      call.count, topology::hierSlicesUsed(l.slices, call.count, dataTypeSize(call.type), tuning.hierSliceMinBytes)};
  // One choice for every slice of the call, from values every rank holds
  // alike (the owners of a slice on all hosts must run the same plan).
  const bool byRd = topology::hierExchangesByRd(slices.sizeOf(0) * dataTypeSize(call.type), l.hosts.size(),
                                                tuning.hierRdSliceBytes);
  const auto& between =
      static_cast<const PlannedAlgorithm&>(byRd ? recursiveDoublingAllreduce() : ringAllreduce());
  Plan all;
  all.scratchCount = lane ? laneScratch : 0;
  for (size_t j = static_cast<size_t>(l.local); j < slices.parts; j += l.localSize()) {
    if (slices.sizeOf(j) == 0) continue;
    CollectiveCall sub = call;
    sub.count = slices.sizeOf(j);
    sub.inPlace = true;
    if (sub.op == ReduceOp::kAvg) sub.op = ReduceOp::kSum;
    const Plan slicePlan = between.plan(sub, l.host, static_cast<int>(l.hosts.size()), tuning);
    const uint32_t first = hier::appendSlicePlan(all, slicePlan, l, j, slices.offsetOf(j), lane);
    if (call.op == ReduceOp::kAvg) {
      // Once, after every step of this slice's exchange (its sends read it too).
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

// Waves: the vector is cut into waves of kHierWaveSegments pipeline segments
// per slice, each a complete hierarchical allreduce of its range, so the
// transfers between hosts of one wave overlap the shared-memory phases of
// its neighbours. The shared-memory phases run strictly in the order
// RS0, RS1, AG0, RS2, AG1, ..., AG(W-1) (their round numbers are taken in
// that order when the schedule is made), and AG(w) waits for wave w's
// transfers; so at most waves w and w+1 move data between hosts at once,
// on lanes w % 2 (their own message indices and scratch).
class HierAllreduceSchedule final : public Schedule {
 public:
  HierAllreduceSchedule(const CollectiveCall& call, const RunContext& ctx, const Algorithm* algorithm)
      : call_(call), ctx_(ctx), layout_(hier::Layout::of(*ctx.topology, ctx.transport->rank())), elem_(dataTypeSize(call.type)) {
    const std::string problem = hier::layoutProblem(*ctx.transport, layout_);
    if (!problem.empty()) throw UnsupportedError("hierarchical allreduce: " + problem);
    in_ = static_cast<const char*>(call.input);
    out_ = static_cast<char*>(call.output);
    p_ = static_cast<int>(layout_.localSize());
    me_ = layout_.local;
    // Equal on every rank (tuning is agreed), whatever its host.
    const size_t waveElems = topology::hierWaveElems(layout_.slices, ctx.tuning.segmentBytes, elem_);
    const size_t waves = call.count == 0 ? 1 : (call.count + waveElems - 1) / waveElems;
    waves_.resize(waves);
    for (size_t w = 0; w < waves; ++w) {
      Wave& v = waves_[w];
      v.begin = w * waveElems;
      v.count = call.count == 0 ? 0 : std::min(waveElems, call.count - v.begin);
      v.slices = patterns::Partition{
          v.count, topology::hierSlicesUsed(layout_.slices, v.count, elem_, ctx.tuning.hierSliceMinBytes)};
    }
    // Shared-memory tasks in their fixed order.
    tasks_.push_back({true, 0});
    for (size_t w = 1; w < waves; ++w) {
      tasks_.push_back({true, w});
      tasks_.push_back({false, w - 1});
    }
    tasks_.push_back({false, waves - 1});
    if (p_ >= 2) {
      g_ = ctx.transport->sharedMemory();
      chunk_ = g_->bufferBytes() / layout_.slices / elem_;
      for (const Task& t : tasks_) {
        Wave& v = waves_[t.wave];
        if (t.reduceScatter) {
          const size_t longest = v.slices.sizeOf(0);
          v.rounds = longest == 0 ? 1 : (longest + chunk_ - 1) / chunk_;
          v.firstRound = g_->takeRound();
          for (size_t k = 1; k < v.rounds; ++k) g_->takeRound();
        } else {
          std::vector<hier::FanOutItem> items;
          for (size_t j = 0; j < layout_.slices; ++j) {
            const size_t at = v.begin + v.slices.offsetOf(j);
            items.push_back({static_cast<int>(j % static_cast<size_t>(p_)), out_ + at * elem_, at, v.slices.sizeOf(j)});
          }
          v.gather.start(*g_, std::move(items), out_, elem_, ctx_, "hierarchical allreduce");
        }
      }
    }
    // Plans run relative to their wave's start, so equal waves share one
    // per lane. Lane 1 keeps its scratch behind lane 0's.
    CollectiveCall full = call;
    full.count = std::min(waveElems, call.count);
    full.root = 0;
    const auto lane0 =
        cachedPlan(algorithm, full, ctx, [&] { return hier::allreduceInterHostPlan(full, layout_, ctx.tuning); });
    const size_t laneScratch = lane0->plan.scratchCount;
    for (size_t w = 0; w < waves; ++w) {
      Wave& v = waves_[w];
      CollectiveCall c = call;
      c.count = v.count;
      c.root = static_cast<int>(w % hier::kLanes);  // the cache key's lane
      const uint32_t lane = static_cast<uint32_t>(w % hier::kLanes);
      v.plan = cachedPlan(algorithm, c, ctx, [&] {
        return hier::allreduceInterHostPlan(c, layout_, ctx.tuning, lane, laneScratch);
      });
      scratchElems_ = std::max(scratchElems_, v.plan->plan.scratchCount);
    }
  }

  bool advance() override {
    bool moved = false;
    for (bool any = true; any && !done();) {
      any = false;
      for (size_t w = netFirst_; w < netStarted_; ++w) {
        Wave& v = waves_[w];
        if (!v.runner) continue;
        any = v.runner->advance() || any;
        if (v.runner->done()) {
          v.runner.reset();
          v.netDone = true;
          any = true;
        }
      }
      while (netFirst_ < netStarted_ && waves_[netFirst_].netDone) ++netFirst_;
      any = advanceTasks() || any;
      moved = moved || any;
    }
    return moved;
  }

  bool done() const override { return task_ == tasks_.size(); }

  std::string waitingFor() const override {
    const std::string what = "hierarchical allreduce, ";
    if (task_ >= tasks_.size()) return what + "done";
    const Task& t = tasks_[task_];
    const Wave& v = waves_[t.wave];
    const std::string wave = "wave " + std::to_string(t.wave + 1) + " of " + std::to_string(waves_.size()) + ", ";
    if (!t.reduceScatter && !v.netDone && v.runner) return what + wave + "between hosts: " + v.runner->waitingFor();
    if (!t.reduceScatter) return what + wave + "allgather, " + v.gather.waitingFor();
    std::string s = what + wave + "reduce-scatter, round " + std::to_string(reduceNext_ + 1) + " of " +
                    std::to_string(v.rounds) + " in this host: ";
    return s + stall_.describe(g_);
  }

  std::vector<int> awaitedPeers() const override {
    std::vector<int> peers;
    for (size_t w = netFirst_; w < netStarted_; ++w) {
      if (waves_[w].runner) {
        for (int r : waves_[w].runner->awaitedPeers()) peers.push_back(r);
      }
    }
    return peers;
  }

  void healthCheck() override {
    if (g_) hier::checkPeersAlive(*g_, "hierarchical allreduce");
  }

 private:
  struct Task {
    bool reduceScatter;  // else allgather
    size_t wave;
  };
  struct Wave {
    size_t begin = 0, count = 0;  // elements of the vector
    patterns::Partition slices;
    size_t rounds = 0;  // of the reduce-scatter
    uint64_t firstRound = 0;
    hier::ShmFanOut gather;
    std::shared_ptr<const CompiledPlan> plan;
    SchedulePtr runner;
    bool netDone = false;
  };
  struct Part {
    size_t offset;  // in the vector
    size_t count;
  };

  // Runs the shared-memory tasks in order as far as they go.
  bool advanceTasks() {
    bool moved = false;
    while (task_ < tasks_.size()) {
      const Task& t = tasks_[task_];
      Wave& v = waves_[t.wave];
      if (t.reduceScatter) {
        if (p_ < 2) {
          if (!call_.inPlace && v.count) std::memcpy(out_ + v.begin * elem_, in_ + v.begin * elem_, v.count * elem_);
        } else {
          for (bool any = true; any && reduceNext_ < v.rounds;) {
            any = tryReduce(v) || tryStage(v);
            moved = moved || any;
          }
          if (reduceNext_ < v.rounds) return moved;
          stageNext_ = reduceNext_ = 0;
        }
        startNet(t.wave);
      } else {
        if (!v.netDone) return moved;
        if (p_ >= 2) {
          moved = v.gather.advance() || moved;
          if (!v.gather.done()) return moved;
        }
      }
      ++task_;
      moved = true;
    }
    return moved;
  }

  void startNet(size_t w) {
    Wave& v = waves_[w];
    if (w == 0) ctx_.scratch(scratchElems_ * elem_);  // once, for both lanes: runners never reallocate it
    CollectiveCall c = call_;
    c.input = out_ + v.begin * elem_;
    c.output = out_ + v.begin * elem_;
    c.count = v.count;
    c.inPlace = true;
    v.runner = makeSchedule<PlanRunner>(nullptr, v.plan, c, ctx_);
    netStarted_ = w + 1;
  }

  // The part of slice j of wave v that round k moves; it sits at j * chunk_ in a buffer.
  Part part(const Wave& v, size_t k, size_t j) const {
    const size_t begin = k * chunk_, n = v.slices.sizeOf(j);
    const size_t at = v.begin + v.slices.offsetOf(j);
    if (begin >= n) return {at, 0};
    return {at + begin, std::min(chunk_, n - begin)};
  }
  char* slot(int q, int b, size_t j) const { return g_->buffer(q, b) + j * chunk_ * elem_; }
  bool owns(int q, size_t j) const { return j % static_cast<size_t>(p_) == static_cast<size_t>(q); }

  // Reduce-scatter, step a: stage the parts of the slices other local ranks own.
  bool tryStage(const Wave& v) {
    const size_t k = stageNext_;
    if (k >= v.rounds || k > reduceNext_ + 1) return false;
    const uint64_t rid = v.firstRound + k;
    if (int q = g_->peerStillReading(rid); q >= 0) return stall_.set(q, "finish reading an earlier round");
    const int b = static_cast<int>(rid & 1);
    for (size_t j = 0; j < layout_.slices; ++j) {
      if (owns(me_, j)) continue;
      const Part pt = part(v, k, j);
      if (pt.count) std::memcpy(slot(me_, b, j), in_ + pt.offset * elem_, pt.count * elem_);
    }
    g_->publish(b, rid, ctx_.tag.fingerprint);
    ++stageNext_;
    return true;
  }

  // Reduce-scatter, step b: reduce the parts of our slices from every local rank.
  bool tryReduce(const Wave& v) {
    const size_t k = reduceNext_;
    if (k >= stageNext_) return false;
    const uint64_t rid = v.firstRound + k;
    const int b = static_cast<int>(rid & 1);
    for (int q = 0; q < p_; ++q) {
      if (q == me_) continue;
      const ShmRankBlock::Mailbox& box = g_->block(q).mailbox[b];
      if (box.ready.load(std::memory_order_acquire) < rid) {
        return stall_.set(q, "stage its data");
      }
      if (box.fingerprint != ctx_.tag.fingerprint) hier::throwShmMismatch(ctx_, *g_, q, "hierarchical allreduce");
    }
    for (size_t j = static_cast<size_t>(me_); j < layout_.slices; j += static_cast<size_t>(p_)) {
      const Part pt = part(v, k, j);
      if (!pt.count) continue;
      // Accumulate in our own (unstaged) slot: writing the output first would
      // clobber our input when in place.
      char* acc = slot(me_, b, j);
      reduceInRankOrder(ctx_, acc, p_, pt.count,
                        [&](int q) -> const char* { return q == me_ ? in_ + pt.offset * elem_ : slot(q, b, j); });
      std::memcpy(out_ + pt.offset * elem_, acc, pt.count * elem_);
    }
    g_->block(me_).consumed.store(rid, std::memory_order_release);
    ++reduceNext_;
    stall_.rank = -1;
    return true;
  }

  CollectiveCall call_;
  RunContext ctx_;
  hier::Layout layout_;
  size_t elem_;
  ShmGroup* g_ = nullptr;
  int p_ = 1;
  int me_ = 0;
  size_t chunk_ = 0;
  const char* in_ = nullptr;
  char* out_ = nullptr;
  std::vector<Wave> waves_;
  std::vector<Task> tasks_;
  size_t task_ = 0;                     // next shared-memory task
  size_t stageNext_ = 0, reduceNext_ = 0;  // rounds of the current reduce-scatter task
  size_t netFirst_ = 0, netStarted_ = 0;   // waves whose transfers may be in flight
  size_t scratchElems_ = 0;
  hier::ShmStall stall_;
};

class HierAllreduce final : public Algorithm {
 public:
  const char* name() const override { return "hier"; }
  Collective collective() const override { return Collective::kAllreduce; }
  std::string unsupportedReason(const CollectiveCall&, const Team& team) const override {
    return hier::layoutProblem(team.transport, hier::Layout::of(team.topology, team.transport.rank()));
  }
  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override {
    return makeSchedule<HierAllreduceSchedule>(ctx.workspace, call, ctx, this);
  }
  /// Small calls sign their messages between hosts instead of running the
  /// engine's call check, which adds a message across each host link. Recursive
  /// doubling sends one message per round (or fold) to a different owner of
  /// a slice; on equal hosts each rank owns one slice, on uneven ones a rank
  /// of a smaller host owns several, which must not meet the same owner
  /// twice (topology::hierSlicesPairOnce): at most one message per ordered
  /// pair, paired by the layout alone. One wave only: with several, a pair
  /// exchanges a message per wave under one tag. Every shared-memory round
  /// compares the fingerprints of the host's ranks, and slice 0's owners
  /// link every host, so wherever calls differ some rank sees it. Count 0
  /// moves nothing between hosts: the engine checks it.
  bool signsMessages(const transport::CallSignature& call, const RunContext& ctx) const override {
    const topology::TopologyView* view = ctx.topology;
    if (!view) return false;
    return topology::hierSignsMessages(*view, call.count, dataTypeSize(static_cast<DataType>(call.type)),
                                       ctx.tuning.hierRdSliceBytes, ctx.tuning.segmentBytes,
                                       ctx.tuning.hierSliceMinBytes);
  }
};

}  // namespace

const Algorithm& hierAllreduce() {
  static const HierAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
