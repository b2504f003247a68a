// Broadcast along a binomial tree rooted at the caller's root, pipelined by
// segments. The root sends from its input; every rank's output receives.
#include "algorithms/catalog.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/tree_phases.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {
namespace {


class TreeBroadcast final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "tree"; }
  Collective collective() const override { return Collective::kBroadcast; }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning& tuning) const override {
    PlanBuilder b;
    const size_t n = call.count;
    const size_t seg = patterns::segmentElements(tuning.segmentBytes, dataTypeSize(call.type));
    TreeState st(b, patterns::binomialTree(r, p, call.root), std::max(2, tuning.pipelineDepth), seg);
    const patterns::Segments segs{n, seg};
    for (size_t s = 0; s < segs.number(); ++s) {
      const size_t off = segs.offsetOf(s), cnt = segs.sizeOf(s);
      treeBroadcastSegment(b, st, out(off, cnt), in(off, cnt), static_cast<uint32_t>(s), kNone, kNone);
      if (r == call.root && !call.inPlace) b.copy(out(off, cnt), in(off, cnt));
    }
    return b.finish();
  }
};

}  // namespace

const Algorithm& treeBroadcast() {
  static const TreeBroadcast algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
