// Hierarchical broadcast ("hier"). The vector is cut into S slices (see
// hier_phases.hpp); on host h slice j belongs to local rank j % L_h.
//   1. On the root's host, the root fans the whole vector out through
//      shared memory, so every local rank there holds every slice.
//   2. Each slice goes down a binomial tree over the hosts, rooted at the
//      root's host, between the slice's owners: S trees side by side, so
//      every local rank and its link carry part of the data.
//   3. On every other host, the owners fan their slices out through shared
//      memory.
#include "algorithms/catalog.hpp"
#include "algorithms/hier_phases.hpp"
#include "algorithms/patterns/partition.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {

Plan hier::broadcastInterHostPlan(const CollectiveCall& call, const hier::Layout& l, const Tuning& tuning) {
  const int rootHost = l.hostOf(call.root);
  const auto& tree = static_cast<const PlannedAlgorithm&>(treeBroadcast());
  const patterns::Partition slices{call.count, l.slices};
  Plan all;
  for (size_t j = static_cast<size_t>(l.local); j < l.slices; j += l.localSize()) {
    if (slices.sizeOf(j) == 0) continue;
    CollectiveCall sub = call;
    sub.count = slices.sizeOf(j);
    sub.root = rootHost;
    sub.inPlace = true;
    hier::appendSlicePlan(all, tree.plan(sub, l.host, static_cast<int>(l.hosts.size()), tuning), l, j,
                          slices.offsetOf(j));
  }
  return all;
}

namespace {

class HierBroadcast final : public Algorithm {
 public:
  const char* name() const override { return "hier"; }
  Collective collective() const override { return Collective::kBroadcast; }
  std::string unsupportedReason(const CollectiveCall&, const Team& team) const override {
    return hier::layoutProblem(team.transport, hier::Layout::of(team.topology, team.transport.rank()));
  }
  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override {
    const hier::Layout l = hier::Layout::of(*ctx.topology, ctx.transport->rank());
    const std::string problem = hier::layoutProblem(*ctx.transport, l);
    if (!problem.empty()) throw UnsupportedError("hierarchical broadcast: " + problem);
    const size_t elem = dataTypeSize(call.type);
    const int rootHost = l.hostOf(call.root);
    const auto& rootRanks = l.hosts[static_cast<size_t>(rootHost)];
    const int rootLocal = static_cast<int>(std::find(rootRanks.begin(), rootRanks.end(), call.root) - rootRanks.begin());
    char* out = static_cast<char*>(call.output);
    transport::ShmGroup* g = l.localSize() >= 2 ? ctx.transport->sharedMemory() : nullptr;

    hier::PhasedParts parts;
    parts.what = "hierarchical broadcast";
    parts.planCall = call;
    parts.planCall.input = out;  // every slice's tree root holds it in its output
    parts.planCall.inPlace = true;
    parts.plan = cachedPlan(this, call, ctx, [&] { return hier::broadcastInterHostPlan(call, l, ctx.tuning); });
    const patterns::Partition slices{call.count, l.slices};
    if (l.host == rootHost) {
      if (g) {
        parts.before.push_back({rootLocal, static_cast<const char*>(call.input), 0, call.count});
      } else {
        parts.copySrc = call.input;
        parts.copyDst = out;
        parts.copyBytes = call.count * elem;
      }
    } else if (g) {
      for (size_t j = 0; j < l.slices; ++j) {
        parts.after.push_back(
            {static_cast<int>(j % l.localSize()), out + slices.offsetOf(j) * elem, slices.offsetOf(j), slices.sizeOf(j)});
      }
    }
    return makeSchedule<hier::PhasedSchedule>(ctx.workspace, ctx, g, elem, std::move(parts));
  }
};

}  // namespace

const Algorithm& hierBroadcast() {
  static const HierBroadcast algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
