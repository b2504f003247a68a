// Hierarchical allgather ("hier").
//   1. Between hosts: every rank sends its block straight to one rank of
//      each other host, the one whose local index is its own modulo that
//      host's size; so rank (host h, local i) receives the blocks of the
//      other hosts' ranks whose local index is i modulo L_h. Every rank and
//      link works at once, and each block crosses each host's link once.
//   2. In each host, every rank fans out through shared memory its own
//      block and the blocks it received.
#include "algorithms/catalog.hpp"
#include "algorithms/hier_phases.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {

Plan hier::allgatherInterHostPlan(const CollectiveCall& call, const hier::Layout& l) {
  PlanBuilder b;
  const size_t n = call.count, L = l.localSize();
  if (n == 0) return b.finish();
  for (size_t h = 0; h < l.hosts.size(); ++h) {
    if (static_cast<int>(h) == l.host) continue;
    const auto& ranks = l.hosts[h];
    b.send(ranks[static_cast<size_t>(l.local) % ranks.size()], in(0, n), 0);
    for (size_t m = static_cast<size_t>(l.local); m < ranks.size(); m += L) {
      b.recv(ranks[m], out(static_cast<size_t>(ranks[m]) * n, n), 0);
    }
  }
  return b.finish();
}

namespace {

class HierAllgather final : public Algorithm {
 public:
  const char* name() const override { return "hier"; }
  Collective collective() const override { return Collective::kAllgather; }
  std::string unsupportedReason(const CollectiveCall&, const Team& team) const override {
    return hier::layoutProblem(team.transport, hier::Layout::of(team.topology, team.transport.rank()));
  }
  SchedulePtr schedule(const CollectiveCall& call, RunContext ctx) const override {
    const hier::Layout l = hier::Layout::of(*ctx.topology, ctx.transport->rank());
    const std::string problem = hier::layoutProblem(*ctx.transport, l);
    if (!problem.empty()) throw UnsupportedError("hierarchical allgather: " + problem);
    const size_t elem = dataTypeSize(call.type), n = call.count, L = l.localSize();
    const int me = ctx.transport->rank();
    char* out = static_cast<char*>(call.output);
    transport::ShmGroup* g = L >= 2 ? ctx.transport->sharedMemory() : nullptr;

    hier::PhasedParts parts;
    parts.what = "hierarchical allgather";
    parts.planCall = call;
    parts.plan = cachedPlan(this, call, ctx, [&] { return hier::allgatherInterHostPlan(call, l); });
    const size_t mine = static_cast<size_t>(me) * n;
    if (g) {
      // The same items in the same order on every local rank: each rank's own
      // block, then the blocks that came from other hosts.
      const auto& local = l.hosts[static_cast<size_t>(l.host)];
      for (size_t i = 0; i < L; ++i) {
        const size_t at = static_cast<size_t>(local[i]) * n;
        parts.after.push_back({static_cast<int>(i), local[i] == me ? static_cast<const char*>(call.input) : out + at * elem, at, n});
      }
      for (size_t h = 0; h < l.hosts.size(); ++h) {
        if (static_cast<int>(h) == l.host) continue;
        const auto& ranks = l.hosts[h];
        for (size_t m = 0; m < ranks.size(); ++m) {
          const size_t at = static_cast<size_t>(ranks[m]) * n;
          parts.after.push_back({static_cast<int>(m % L), out + at * elem, at, n});
        }
      }
    } else {
      parts.copySrc = call.input;
      parts.copyDst = out + mine * elem;
      parts.copyBytes = n * elem;
    }
    return makeSchedule<hier::PhasedSchedule>(ctx.workspace, ctx, g, elem, std::move(parts));
  }
};

}  // namespace

const Algorithm& hierAllgather() {
  static const HierAllgather algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
