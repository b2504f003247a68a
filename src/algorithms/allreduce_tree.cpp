// Tree allreduce: a binomial-tree reduce to rank 0 followed by a binomial
// broadcast, both pipelined by segments. 2 log2(p) latency terms for small
// messages; with segments it streams like a chain for medium ones.
#include "algorithms/catalog.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/tree_phases.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {
namespace {


class TreeAllreduce final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "tree"; }
  Collective collective() const override { return Collective::kAllreduce; }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning& tuning) const override {
    PlanBuilder b;
    const size_t n = call.count;
    const size_t seg = patterns::segmentElements(tuning.segmentBytes, dataTypeSize(call.type));
    TreeState st(b, patterns::binomialTree(r, p, 0), std::max(2, tuning.pipelineDepth), seg);
    const patterns::Segments segs{n, seg};
    for (size_t s = 0; s < segs.number(); ++s) {
      const size_t off = segs.offsetOf(s), cnt = segs.sizeOf(s);
      const uint32_t msg = static_cast<uint32_t>(2 * s);
      Span sentFrom;
      Id up = treeReduceSegment(b, st, in(off, cnt), out(off, cnt), msg, kNone, &sentFrom);
      Id ready = up;
      if (st.tree.parent < 0) {
        // Root: the final value is in out unless nothing was reduced here.
        if (sentFrom.buf == Buf::kInput && !call.inPlace) ready = b.copy(out(off, cnt), in(off, cnt), {up});
        if (call.op == ReduceOp::kAvg) ready = b.divide(out(off, cnt), {ready});
      }
      treeBroadcastSegment(b, st, out(off, cnt), out(off, cnt), msg + 1, ready, up);
    }
    return b.finish();
  }
};

}  // namespace

const Algorithm& treeAllreduce() {
  static const TreeAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
