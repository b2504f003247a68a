// Ring reduce-scatter: p-1 steps; partial sums travel around the ring in
// receive slots and block r ends, fully reduced, in rank r's output. A slot
// is held from its receive until the partial sum in it has been forwarded;
// segments flow through all steps in turn (segment-major order), which
// keeps the slot dependencies acyclic across ranks for depth >= 2.
#include "algorithms/catalog.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {
namespace {

using patterns::mod;

class RingReduceScatter final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "ring"; }
  Collective collective() const override { return Collective::kReduceScatter; }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning& tuning) const override {
    PlanBuilder b;
    const size_t n = call.count;  // per rank
    const size_t seg = patterns::segmentElements(tuning.exchangeSegmentBytes, dataTypeSize(call.type), n);
    const int depth = std::max(2, tuning.pipelineDepth);
    const patterns::Segments segs{n, seg};
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    SlotPool slots(b, depth, seg);
    Window sendWindow(depth), recvWindow(2 * depth);
    const size_t own = static_cast<size_t>(r) * n;
    for (size_t s = 0; s < segs.number(); ++s) {
      const size_t off = segs.offsetOf(s), cnt = segs.sizeOf(s);
      if (p == 1) {
        if (!call.inPlace) b.copy(out(off, cnt), in(off, cnt));
        continue;
      }
      // Step k sends block r-k-1 and receives block r-k-2; block r arrives last.
      Span partial = in(static_cast<size_t>(mod(r - 1, p)) * n + off, cnt);
      Id partialReady = kNone;
      SlotPool::Slot held{0, kNone};
      bool holding = false;
      for (int k = 0; k < p - 1; ++k) {
        const uint32_t msg = static_cast<uint32_t>(s * static_cast<size_t>(p) + static_cast<size_t>(k));
        Id sd = b.send(next, partial, msg, {partialReady, sendWindow.gate()});
        sendWindow.push(sd);
        if (holding) slots.release(held, sd);
        const size_t block = static_cast<size_t>(mod(r - k - 2, p)) * n;
        auto slot = slots.acquire();
        Id rv = b.recv(prev, slots.span(slot, cnt), msg, {slot.freeAfter, recvWindow.gate()});
        recvWindow.push(rv);
        if (k == p - 2) {
          Id red = b.reduce(out(off, cnt), in(own + off, cnt), slots.span(slot, cnt), {rv});
          slots.release(slot, red);
          if (call.op == ReduceOp::kAvg) b.divide(out(off, cnt), {red});
          holding = false;
        } else {
          partialReady = b.reduce(slots.span(slot, cnt), in(block + off, cnt), slots.span(slot, cnt), {rv});
          partial = slots.span(slot, cnt);
          held = slot;
          holding = true;
        }
      }
    }
    return b.finish();
  }
};

}  // namespace

const Algorithm& ringReduceScatter() {
  static const RingReduceScatter algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
