// Ring allgather: p-1 steps; at step k rank r forwards block r-k to the
// next rank and receives block r-k-1 from the previous one, segment by
// segment. Output holds size * count elements, block i from rank i.
#include "algorithms/catalog.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {
namespace {

using patterns::mod;

class RingAllgather final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "ring"; }
  Collective collective() const override { return Collective::kAllgather; }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning& tuning) const override {
    PlanBuilder b;
    const size_t n = call.count;  // per rank
    const size_t seg = patterns::segmentElements(tuning.exchangeSegmentBytes, dataTypeSize(call.type), n);
    const int depth = std::max(2, tuning.pipelineDepth);
    const patterns::Segments segs{n, seg};
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    Window sendWindow(depth), recvWindow(2 * depth);
    const size_t own = static_cast<size_t>(r) * n;
    for (size_t s = 0; s < segs.number(); ++s) {
      const size_t off = segs.offsetOf(s), cnt = segs.sizeOf(s);
      if (!call.inPlace) b.copy(out(own + off, cnt), in(off, cnt));
      Id prevRecv = kNone;
      for (int k = 0; k < p - 1; ++k) {
        const uint32_t msg = static_cast<uint32_t>(s * static_cast<size_t>(p) + static_cast<size_t>(k));
        const size_t sendBlock = static_cast<size_t>(mod(r - k, p)) * n;
        const size_t recvBlock = static_cast<size_t>(mod(r - k - 1, p)) * n;
        Span src = k == 0 ? in(off, cnt) : out(sendBlock + off, cnt);
        Id sd = b.send(next, src, msg, {prevRecv, sendWindow.gate()});
        sendWindow.push(sd);
        prevRecv = b.recv(prev, out(recvBlock + off, cnt), msg, {recvWindow.gate()});
        recvWindow.push(prevRecv);
      }
    }
    return b.finish();
  }
};

}  // namespace

const Algorithm& ringAllgather() {
  static const RingAllgather algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
