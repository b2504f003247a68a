// The "native" algorithm of every collective: MPI's own nonblocking
// collective on the communicator's private duplicate. Before the data moves,
// the ranks agree on the call signature (one small MPI_Iallgather of every
// rank's), because MPI itself may corrupt memory or hang when ranks pass
// different counts.
#include <cstring>
#include <functional>

#include "algorithms/catalog.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {
namespace {

/// Runs a sequence of requests, each started after the previous completed,
/// then a local finishing step.
class StagedSchedule final : public Schedule {
 public:
  using Stage = std::function<transport::RequestPtr()>;
  StagedSchedule(std::vector<Stage> stages, std::function<void()> finish, std::string what)
      : stages_(std::move(stages)), finish_(std::move(finish)), what_(std::move(what)) {}
  bool advance() override {
    bool moved = false;
    while (!done_) {
      if (!current_) {
        if (next_ == stages_.size()) {
          if (finish_) finish_();
          done_ = true;
          return true;
        }
        current_ = stages_[next_++]();
        moved = true;
      }
      if (!current_->test()) return moved;
      current_.reset();
      moved = true;
    }
    return moved;
  }
  bool done() const override { return done_; }
  std::string waitingFor() const override {
    return "MPI " + what_ + " (stage " + std::to_string(next_) + " of " + std::to_string(stages_.size()) + ")";
  }

 private:
  std::vector<Stage> stages_;
  std::function<void()> finish_;
  std::string what_;
  size_t next_ = 0;
  transport::RequestPtr current_;
  bool done_ = false;
};

/// Why `t` cannot run native collectives, or empty.
std::string whyNot(const transport::Transport& t) {
  if (transport::nativeCollectives(const_cast<transport::Transport&>(t)) == nullptr) {
    return "the native algorithm needs MPI; transport '" + t.name() + "' has no native collectives";
  }
  return {};
}

class Native final : public Algorithm {
 public:
  explicit Native(Collective c) : collective_(c) {}
  const char* name() const override { return "native"; }
  // Its first stage compares every rank's call signature.
  bool checksCalls() const override { return true; }
  Collective collective() const override { return collective_; }
  std::string unsupportedReason(const CollectiveCall&, const Team& team) const override {
    return whyNot(team.transport);
  }

  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override {
    transport::NativeCollectives* nat = transport::nativeCollectives(*ctx.transport);
    if (!nat) throw UnsupportedError(whyNot(*ctx.transport));
    if (!ctx.signature) throw InternalError("native " + std::string(toString(call.collective)) + " without a call signature");
    const transport::CallSignature sig = *ctx.signature;
    const std::string what = std::string(toString(call.collective)) + " #" + std::to_string(ctx.tag.seq) + " (" +
                             toString(call.type) + " " + toString(call.op) + ", " + std::to_string(call.count) +
                             " elements, algorithm native)";
    std::vector<StagedSchedule::Stage> stages;
    stages.push_back([nat, sig, what] { return nat->agree(sig, what); });
    std::function<void()> finish;
    const CollectiveCall c = call;
    const int rank = ctx.transport->rank();
    const int size = ctx.transport->size();
    switch (call.collective) {
      case Collective::kAllreduce:
        stages.push_back([nat, c] { return nat->allreduce(c.input, c.output, c.count, c.type, c.op); });
        if (c.op == ReduceOp::kAvg) finish = [c, ctx, size] { ctx.divide(c.output, c.count, size); };
        break;
      case Collective::kBroadcast:
        if (rank == c.root && !c.inPlace) {
          std::memcpy(c.output, c.input, c.count * dataTypeSize(c.type));
        }
        stages.push_back([nat, c] { return nat->broadcast(c.output, c.count, c.type, c.root); });
        break;
      case Collective::kReduce:
        stages.push_back([nat, c] { return nat->reduce(c.input, c.output, c.count, c.type, c.op, c.root); });
        if (c.op == ReduceOp::kAvg && rank == c.root) {
          finish = [c, ctx, size] { ctx.divide(c.output, c.count, size); };
        }
        break;
      case Collective::kAllgather:
        stages.push_back([nat, c] { return nat->allgather(c.input, c.output, c.count, c.type); });
        break;
      case Collective::kReduceScatter: {
        // In place, gradcomm's result goes to block `rank` of the input (as
        // in NCCL); MPI's in-place form puts it at the start. Receive into
        // scratch and copy instead.
        void* target = c.inPlace ? ctx.scratch(c.count * dataTypeSize(c.type)) : c.output;
        stages.push_back([nat, c, target] { return nat->reduceScatter(c.input, target, c.count, c.type, c.op); });
        finish = [c, ctx, size, target] {
          if (target != c.output) std::memcpy(c.output, target, c.count * dataTypeSize(c.type));
          if (c.op == ReduceOp::kAvg) ctx.divide(c.output, c.count, size);
        };
        break;
      }
      case Collective::kBarrier:
        stages.push_back([nat] { return nat->barrier(); });
        break;
    }
    return makeSchedule<StagedSchedule>(nullptr, std::move(stages), std::move(finish), toString(call.collective));
  }

 private:
  Collective collective_;
};

}  // namespace

const Algorithm& nativeAlgorithm(Collective collective) {
  static const Native algorithms[kNumCollectives] = {
      Native(Collective::kAllreduce),     Native(Collective::kBroadcast), Native(Collective::kReduce),
      Native(Collective::kAllgather),     Native(Collective::kReduceScatter), Native(Collective::kBarrier)};
  return algorithms[static_cast<int>(collective)];
}

}  // namespace gradcomm::algorithms
