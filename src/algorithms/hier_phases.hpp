#pragma once
// Building blocks of the hierarchical algorithms (allreduce_hier.cpp,
// broadcast_hier.cpp, allgather_hier.cpp): where a rank sits among the
// hosts, plans made over hosts and moved onto the ranks that own a slice,
// and a fan-out through the host's shared memory.
//
// Slices: the vector is cut into S = (ranks on the largest host) slices; on
// host h slice j belongs to local rank j % L_h. On the largest host each
// local rank owns one slice; on a smaller one some own several, so every
// slice has exactly one owner per host whatever the layout.
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "transport/shm_group.hpp"

namespace gradcomm::algorithms::hier {

/// The host-local peer a shared-memory step waits for, and for what.
struct ShmStall {
  int rank = -1;  ///< local rank; -1 while nothing is awaited
  const char* why = "";
  /// Records the wait; returns false (the step did not move).
  bool set(int q, const char* reason) {
    rank = q;
    why = reason;
    return false;
  }
  /// "waiting for rank R to WHY" (R: the rank of the whole group), or "running".
  std::string describe(const transport::ShmGroup* g) const;
};

/// The reading side of a round that every host-local peer publishes in its
/// `reduced` flag (the `shm` allreduce's gather, ShmFanOut's): peers are
/// taken as each one's data is there, in any order.
class ShmGather {
 public:
  /// One look at round `rid` (buffer rid & 1): take(q, buffer) for each peer
  /// not taken yet whose `reduced` reached it, else records in `stall` that
  /// it waits for q to `why`. Once every peer is taken, tells them this rank
  /// finished reading the round, starts over and advances `*next`. True when
  /// anything moved.
  template <class Take>
  bool look(transport::ShmGroup& g, uint64_t rid, ShmStall& stall, const char* why, size_t* next, Take take) {
    const int b = static_cast<int>(rid & 1), me = g.localRank();
    bool moved = false;
    for (int q = 0; q < g.localSize(); ++q) {
      const uint64_t bit = uint64_t{1} << q;
      if (q == me || (taken_ & bit)) continue;
      if (g.block(q).reduced[b].load(std::memory_order_acquire) < rid) {
        stall.set(q, why);
        continue;
      }
      take(q, b);
      taken_ |= bit;
      ++count_;
      moved = true;
    }
    if (count_ < g.localSize() - 1) return moved;
    g.block(me).consumed.store(rid, std::memory_order_release);
    ++*next;
    taken_ = 0;
    count_ = 0;
    stall.rank = -1;
    return true;
  }

 private:
  uint64_t taken_ = 0;  // peers taken in the current round (bit q; at most 64 local ranks)
  int count_ = 0;
};

/// Where this rank sits among the hosts.
struct Layout {
  std::vector<std::vector<int>> hosts;  ///< every host's ranks, ascending
  int host = -1;                        ///< index of this rank's host
  int local = -1;                       ///< index of this rank on it
  size_t slices = 0;                    ///< S: ranks on the largest host

  /// `rank`'s view of the hosts (from the communicator's TopologyView).
  static Layout of(const topology::TopologyView& view, int rank);
  size_t localSize() const { return hosts[static_cast<size_t>(host)].size(); }
  /// Communicator rank that owns slice j on host h.
  int owner(size_t h, size_t j) const { return hosts[h][j % hosts[h].size()]; }
  /// Host index of communicator rank `rank`.
  int hostOf(int rank) const;
};

/// Why a hierarchical algorithm cannot run on this transport, or empty.
std::string layoutProblem(const transport::Transport& t, const Layout& l);

/// Appends `p`, a plan a planner made with host indices as ranks, as the
/// part for slice j: peers become slice j's owners, output and input spans
/// move by `offset` elements, scratch spans behind what `all` already uses,
/// and message m becomes (m * kLanes + lane) * stride + j with stride a
/// power of two >= S, so message indices that a transport truncates to its
/// tag bits still never collide between two slices whose rings link the
/// same pair of ranks, nor between the two lanes (plans that may be in
/// flight at once, see allreduce_hier.cpp). Returns the first step's index.
uint32_t appendSlicePlan(Plan& all, const Plan& p, const Layout& l, size_t j, size_t offset, uint32_t lane = 0);

/// Plans of one operation that may run at the same time.
constexpr uint32_t kLanes = 2;

/// The plans between hosts of this rank (defined with each algorithm;
/// unit-tested for races and message pairing like every planner).
/// allreduce: a ring per owned slice; broadcast: a tree per owned slice;
/// allgather: this rank's block to one rank of every other host.
/// allreduce's lane 1 puts its scratch behind `laneScratch` elements (lane
/// 0's), so two waves can run at once.
Plan allreduceInterHostPlan(const CollectiveCall& call, const Layout& l, const Tuning& tuning, uint32_t lane = 0,
                            size_t laneScratch = 0);
Plan broadcastInterHostPlan(const CollectiveCall& call, const Layout& l, const Tuning& tuning);
Plan allgatherInterHostPlan(const CollectiveCall& call, const Layout& l);

/// One contiguous range that a local rank publishes to the others.
struct FanOutItem {
  int owner = 0;             ///< local rank that has the data
  const char* src = nullptr; ///< where the owner reads it (meaningful on the owner only)
  size_t dst = 0;            ///< element offset in every rank's output
  size_t count = 0;          ///< elements
};

/// Copies every item from its owner to every local rank's output through
/// shared memory, in rounds over the two buffers (the flags and reuse rules
/// of the `shm` allreduce). The owner also copies its own items to its
/// output when `src` is elsewhere.
class ShmFanOut {
 public:
  /// Takes the round numbers now (every local rank must start alike, in the
  /// same order as its other users of the group); moves nothing yet.
  void start(transport::ShmGroup& g, std::vector<FanOutItem> items, char* out, size_t elem, const RunContext& ctx,
             const char* what);
  bool advance();
  bool started() const { return g_ != nullptr; }
  bool done() const { return g_ && gatherNext_ == rounds_; }
  std::string waitingFor() const;

 private:
  char* slot(int q, int b, size_t ordinal) const;
  bool tryPublish();
  bool tryGather();

  transport::ShmGroup* g_ = nullptr;
  const RunContext* ctx_ = nullptr;
  const char* what_ = "";
  std::vector<FanOutItem> items_;
  std::vector<size_t> ordinal_;  // of each item among its owner's
  char* out_ = nullptr;
  size_t elem_ = 1;
  size_t chunk_ = 0;  // elements per item per round
  size_t rounds_ = 0;
  uint64_t firstRound_ = 0;
  int me_ = 0;
  int p_ = 1;
  size_t publishNext_ = 0, gatherNext_ = 0;
  ShmGather gather_;
  ShmStall stall_;
};

/// The shape broadcast and allgather share: a fan-out in the host, a plan
/// between hosts, another fan-out in the host; each part may be absent.
struct PhasedParts {
  const char* what = "";              ///< "hierarchical broadcast"
  const void* copySrc = nullptr;      ///< copied to copyDst first (a rank alone on its host)
  void* copyDst = nullptr;
  size_t copyBytes = 0;
  std::vector<FanOutItem> before;     ///< empty: none
  std::shared_ptr<const CompiledPlan> plan;
  CollectiveCall planCall;            ///< the buffers the plan's spans name
  std::vector<FanOutItem> after;      ///< empty: none
};

/// Runs PhasedParts in order.
class PhasedSchedule final : public Schedule {
 public:
  PhasedSchedule(const RunContext& ctx, transport::ShmGroup* g, size_t elem, PhasedParts parts);
  bool advance() override;
  bool done() const override { return phase_ == 3; }
  std::string waitingFor() const override;
  std::vector<int> awaitedPeers() const override;
  void healthCheck() override;

 private:
  RunContext ctx_;
  transport::ShmGroup* g_;
  PhasedParts parts_;
  ShmFanOut before_, after_;
  SchedulePtr runner_;
  int phase_ = 0;  // 0: copy and fan-out, 1: between hosts, 2: fan-out, 3: done
};

/// A host-local peer staged data of another call: the MismatchError naming
/// the field where both announced their calls.
[[noreturn]] void throwShmMismatch(const RunContext& ctx, const transport::ShmGroup& g, int peer, const char* what);

/// TransportError if a host-local peer's process is gone.
void checkPeersAlive(const transport::ShmGroup& g, const char* what);

}  // namespace gradcomm::algorithms::hier
