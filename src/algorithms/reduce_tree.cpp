// Reduce to a root along a binomial tree, pipelined by segments. Only the
// root's output is written; other ranks accumulate in scratch, so their
// output pointer may be null.
#include "algorithms/catalog.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/tree_phases.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {
namespace {


class TreeReduce final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "tree"; }
  Collective collective() const override { return Collective::kReduce; }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning& tuning) const override {
    PlanBuilder b;
    const size_t n = call.count;
    const size_t seg = patterns::segmentElements(tuning.segmentBytes, dataTypeSize(call.type));
    const bool root = r == call.root;
    const auto tree = patterns::binomialTree(r, p, call.root);
    // Non-roots need somewhere to accumulate if they have children.
    const size_t workBase = (!root && !tree.children.empty()) ? b.allocScratch(n) : 0;
    TreeState st(b, tree, std::max(2, tuning.pipelineDepth), seg);
    const patterns::Segments segs{n, seg};
    for (size_t s = 0; s < segs.number(); ++s) {
      const size_t off = segs.offsetOf(s), cnt = segs.sizeOf(s);
      Span work = root ? out(off, cnt) : scratch(workBase + off, cnt);
      Span sentFrom;
      Id up = treeReduceSegment(b, st, in(off, cnt), work, static_cast<uint32_t>(s), kNone, &sentFrom);
      if (root) {
        Id ready = up;
        if (sentFrom.buf == Buf::kInput && !call.inPlace) ready = b.copy(out(off, cnt), in(off, cnt), {up});
        if (call.op == ReduceOp::kAvg) b.divide(out(off, cnt), {ready});
      }
    }
    return b.finish();
  }
};

}  // namespace

const Algorithm& treeReduce() {
  static const TreeReduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
