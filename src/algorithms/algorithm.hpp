#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/plan.hpp"
#include "algorithms/schedule.hpp"
#include "algorithms/workspace.hpp"
#include "gradcomm/types.hpp"
#include "kernels/reduce.hpp"
#include "topology/topology_view.hpp"
#include "transport/transport.hpp"

namespace gradcomm::algorithms {

/// One collective call as an algorithm sees it. Counts follow NCCL: for
/// allgather `count` is per rank (output holds size * count); for
/// reduce-scatter `count` is per rank (input holds size * count).
struct CollectiveCall {
  Collective collective = Collective::kAllreduce;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  int root = 0;
  const void* input = nullptr;
  void* output = nullptr;
  bool inPlace = false;
};

/// What a planner may know about the team and the tuning.
struct Tuning {
  /// Pipeline segment of tree-shaped plans (broadcast, reduce, tree
  /// allreduce) and of the hierarchy's waves.
  size_t segmentBytes = 256 * 1024;
  /// Pipeline segment of ring and halving-doubling exchanges: the
  /// communicator sets GRADCOMM_NET_SEGMENT_SIZE here when it spans hosts,
  /// GRADCOMM_SEGMENT_SIZE when it does not.
  size_t exchangeSegmentBytes = 256 * 1024;
  int pipelineDepth = 4;
  size_t shmChunkBytes = 128 * 1024;
  /// The hierarchy's allreduce between hosts: slices of at most this many
  /// bytes (the largest slice of the call, equal on every rank) are summed
  /// by recursive doubling, larger ones by a ring. Small slices are
  /// latency-bound: rd takes ceil(log2 H) rounds (plus two where H is not a
  /// power of two) where the ring takes 2(H - 1), and on 2 hosts it moves the
  /// same bytes in one round instead of two (GRADCOMM_HIER_RD_SIZE).
  size_t hierRdSliceBytes = 16 * 1024;
  /// The hierarchy's smallest slice: a call of fewer bytes than S slices of
  /// this size uses fewer (topology::hierSlicesUsed), so fewer local ranks
  /// exchange between hosts (GRADCOMM_HIER_SLICE_MIN).
  size_t hierSliceMinBytes = 32 * 1024;
  /// Halving-doubling's exchange distances (in core ranks) whose partners
  /// all share a host, as a bit set (topology::hdSameHostDistances): its
  /// reduce-scatter takes them first (topology::hdHalvingOrder). Identical
  /// on every rank (the communicator's view).
  uint32_t hdSameHostDistances = 0;
};

/// What host-local peers announced of the operations they run (core's
/// control plane in the host's shared memory: core::HostControl), by local
/// index in the transport's ShmGroup. An algorithm that finds a mismatch in
/// shared memory names the field that differs with it.
class HostAnnouncements {
 public:
  /// The signature local rank `local` announced for operation `seq`; false
  /// when it has not announced that operation (yet, or any more).
  virtual bool announced(int local, uint64_t seq, transport::CallSignature* out) const = 0;

 protected:
  ~HostAnnouncements() = default;
};

/// Everything a schedule needs to run: the transport, the kernels, the
/// operation's tag and the communicator's workspace (which outlives every
/// schedule, and is only touched by the thread driving progress).
struct RunContext {
  transport::Transport* transport = nullptr;
  /// Which ranks share a host, how ranks are linked (the communicator's view; never null in a communicator).
  const topology::TopologyView* topology = nullptr;
  transport::Tag tag;  ///< seq and fingerprint; message filled per step
  kernels::ReduceFn reduce = nullptr;
  kernels::DivideFn divide = nullptr;
  kernels::SimdLevel simd = kernels::SimdLevel::kScalar;
  Tuning tuning;
  Workspace* workspace = nullptr;
  /// The operation's signature (seq included; set by the engine at start).
  const transport::CallSignature* signature = nullptr;
  /// Phases the schedule times (filled in by the engine; may be null).
  std::vector<std::pair<std::string, std::pair<std::chrono::steady_clock::time_point,
                                                std::chrono::steady_clock::time_point>>>* phases = nullptr;
  /// Signed messages (set by the engine where Algorithm::signsMessages()):
  /// every message goes on the call-check channel, prefixed with
  /// `*signature`, and every receive compares the sender's signature with
  /// this rank's before it takes the data. The engine's call check, a
  /// message of its own per operation, is then not needed.
  bool signedMessages = false;
  /// The host's announcements, where this communicator's operations number
  /// them and the call-check slots (the context's own communicator); else
  /// null. A group that uses the host's memory renumbered has operation
  /// numbers of its own, so it announces nothing and reads no announcement.
  const HostAnnouncements* announcements = nullptr;
  /// At least `bytes` of 64-byte aligned scratch, reused between operations.
  char* scratch(size_t bytes) const { return workspace->scratch(bytes); }
};

/// acc = operand(0) OP operand(1) OP ... OP operand(ranks - 1) over `count`
/// elements, in rank order so the result does not depend on who reduces.
/// `acc` is none of the operands; ranks >= 2.
template <class Operand>
void reduceInRankOrder(const RunContext& ctx, char* acc, int ranks, size_t count, Operand operand) {
  ctx.reduce(acc, operand(0), operand(1), count);
  for (int q = 2; q < ranks; ++q) ctx.reduce(acc, acc, operand(q), count);
}

/// The ranks a call would run on, as the predicates that choose an
/// algorithm see them: the transport (ranks, shared memory, native
/// collectives) and the communicator's view of the hosts, the one source of
/// which ranks share a host.
struct Team {
  const transport::Transport& transport;
  const topology::TopologyView& topology;
  /// Ranks of the team.
  int size() const { return transport.size(); }
};

/// An algorithm for one collective: describes itself and creates the
/// schedule for one call.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual const char* name() const = 0;
  virtual Collective collective() const = 0;
  /// Empty when the algorithm can run this call on this team, else why not.
  virtual std::string unsupportedReason(const CollectiveCall& call, const Team& team) const {
    (void)call;
    (void)team;
    return {};
  }
  virtual SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const = 0;
  /// True when the schedule itself compares every rank's call fingerprint
  /// (the engine then skips its call check, a message per operation).
  virtual bool checksCalls() const { return false; }
  /// True when this call (run with `ctx`: its transport, topology and
  /// tuning) runs with signed messages (see RunContext::signedMessages)
  /// instead of the engine's call check. Only
  /// for calls whose messages pair up the same way whatever the other
  /// ranks' calls (peers and message order depend on the ranks alone), at
  /// most one per ordered pair of ranks, carrying at most
  /// kSignedPayloadLimit bytes, and linking all ranks: wherever calls
  /// differ, some rank then receives a differing signature.
  virtual bool signsMessages(const transport::CallSignature& call, const RunContext& ctx) const {
    (void)call;
    (void)ctx;
    return false;
  }
  /// unsupportedReason(...).empty(), without building a message (hot path).
  virtual bool canRun(const CollectiveCall& call, const Team& team) const {
    return unsupportedReason(call, team).empty();
  }
  /// How long the small-call fast path polls, and how it waits between
  /// polls: pause instructions, or sched_yield() when ranks outnumber cores.
  struct InlinePatience {
    int polls = 256;
    bool yield = false;
  };
  /// The small-call fast path: runs `call` in the calling thread, without
  /// an operation in the engine's queue, for as long as `patience.polls` polls
  /// of the peers allow. True when it completed; false when it did not
  /// start (`*rest` stays empty: schedule it as usual) or when peers were
  /// late (`*rest` holds a schedule that carries on from where it stopped).
  /// `ctx.signature` and `ctx.phases` may be null here (a call with no
  /// operation object has none to point at): a schedule left in `*rest`
  /// must not keep them.
  virtual bool runInline(const CollectiveCall& call, const RunContext& ctx, InlinePatience patience,
                         SchedulePtr* rest) const {
    (void)call;
    (void)ctx;
    (void)patience;
    (void)rest;
    return false;
  }
  /// Whether runInline() takes `call` (it starts rather than returning false
  /// with `*rest` empty): such calls skip the operation object.
  virtual bool runsInline(const CollectiveCall& call, const RunContext& ctx) const {
    (void)call;
    (void)ctx;
    return false;
  }
};

/// The small-call fast path's polling (Algorithm::runInline): advances `s`
/// in the calling thread for at most `patience.polls` looks; a look that
/// moved something (a stage posted, a transfer found complete) looks again
/// at once, as the engine's loop does, the others pause. True when `s`
/// completed.
bool pollInline(Schedule& s, Algorithm::InlinePatience patience);

/// Algorithms written in the plan vocabulary: a pure planner plus the
/// generic executor.
class PlannedAlgorithm : public Algorithm {
 public:
  /// This rank's plan; pure function of its arguments.
  virtual Plan plan(const CollectiveCall& call, int rank, int size, const Tuning& tuning) const = 0;
  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override;
};

/// Every algorithm of the library, for every collective.
const std::vector<const Algorithm*>& allAlgorithms();
/// The algorithm called `name` for `collective`, or null.
const Algorithm* findAlgorithm(Collective collective, const std::string& name);

/// The workspace cache's key of `algorithm`'s plan for this call: the
/// call, the rank, the size and the tuning. A planner must depend on
/// nothing else (the hierarchy's layout is fixed per communicator).
PlanKey planKey(const Algorithm* algorithm, const CollectiveCall& call, const RunContext& ctx);

/// The compiled plan for this call from the workspace cache, made by
/// `make()` (a Plan) on a miss.
template <typename Make>
std::shared_ptr<const CompiledPlan> cachedPlan(const Algorithm* algorithm, const CollectiveCall& call,
                                               const RunContext& ctx, Make&& make) {
  const PlanKey key = planKey(algorithm, call, ctx);
  auto compiled = ctx.workspace->findPlan(key);
  if (!compiled) {
    compiled = CompiledPlan::compile(make());
    ctx.workspace->storePlan(key, compiled);
  }
  return compiled;
}

/// The plan used when count is 0: one empty message to the next rank, so
/// that even empty calls are matched (and mismatches detected) across ranks.
Plan emptyPlan(int rank, int size);

}  // namespace gradcomm::algorithms
