// Ring allreduce: reduce-scatter then allgather around the ring, each chunk
// cut into segments that flow through all 2(p-1) steps one after another,
// so the transfer of one segment overlaps the reduction of the previous.
// Bandwidth-optimal: every rank sends 2(p-1)/p of the data.
#include <vector>

#include "algorithms/catalog.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {
namespace {

using patterns::mod;
using patterns::Partition;
using patterns::Segments;

class RingAllreduce final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "ring"; }
  Collective collective() const override { return Collective::kAllreduce; }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning& tuning) const override {
    PlanBuilder b;
    const size_t n = call.count;
    if (p == 1) {
      if (!call.inPlace) b.copy(out(0, n), in(0, n));
      return b.finish();
    }
    const bool avg = call.op == ReduceOp::kAvg;
    const Partition chunks{n, static_cast<size_t>(p)};
    const size_t seg =
        patterns::segmentElements(tuning.exchangeSegmentBytes, dataTypeSize(call.type), chunks.sizeOf(0));
    const int depth = std::max(2, tuning.pipelineDepth);
    const size_t maxSegs = Segments{chunks.sizeOf(0), seg}.number();
    const int next = (r + 1) % p;
    const int prev = (r + p - 1) % p;
    const int steps = 2 * (p - 1);

    SlotPool slots(b, depth, seg);
    Window sendWindow(depth);
    Window recvWindow(2 * depth);
    auto chunkSeg = [&](int chunk, size_t s) {
      Segments segs{chunks.sizeOf(static_cast<size_t>(chunk)), seg};
      return std::make_pair(chunks.offsetOf(static_cast<size_t>(chunk)) + segs.offsetOf(s), segs.sizeOf(s));
    };

    std::vector<Id> rsSend(static_cast<size_t>(p - 1));
    for (size_t s = 0; s < maxSegs; ++s) {
      Id prevReduce = kNone;   // reduce of this segment at the previous step
      Id finalStep = kNone;    // fully reduced (and divided) segment of chunk r+1
      Id prevAgRecv = kNone;
      std::fill(rsSend.begin(), rsSend.end(), kNone);
      for (int t = 0; t < steps; ++t) {
        const uint32_t msg = static_cast<uint32_t>(s * static_cast<size_t>(steps) + static_cast<size_t>(t));
        if (t < p - 1) {
          const int k = t;
          // Send chunk r-k: our own input at step 0, the partial sum after.
          auto [soff, scount] = chunkSeg(mod(r - k, p), s);
          if (scount) {
            Span src = k == 0 ? in(soff, scount) : out(soff, scount);
            Id id = b.send(next, src, msg, {prevReduce, sendWindow.gate()});
            sendWindow.push(id);
            rsSend[static_cast<size_t>(k)] = id;
          }
          // Receive chunk r-k-1 and fold it into our input.
          auto [roff, rcount] = chunkSeg(mod(r - k - 1, p), s);
          prevReduce = kNone;
          if (rcount) {
            auto slot = slots.acquire();
            Id rv = b.recv(prev, slots.span(slot, rcount), msg, {slot.freeAfter, recvWindow.gate()});
            recvWindow.push(rv);
            Id red = b.reduce(out(roff, rcount), in(roff, rcount), slots.span(slot, rcount), {rv});
            slots.release(slot, red);
            prevReduce = red;
            if (k == p - 2) finalStep = avg ? b.divide(out(roff, rcount), {red}) : red;
          }
        } else {
          const int k = t - (p - 1);
          auto [soff, scount] = chunkSeg(mod(r + 1 - k, p), s);
          if (scount) {
            Id id = b.send(next, out(soff, scount), msg, {k == 0 ? finalStep : prevAgRecv, sendWindow.gate()});
            sendWindow.push(id);
          }
          auto [roff, rcount] = chunkSeg(mod(r - k, p), s);
          prevAgRecv = kNone;
          if (rcount) {
            // The region was sent from during reduce-scatter step k.
            Id rv = b.recv(prev, out(roff, rcount), msg, {rsSend[static_cast<size_t>(k)], recvWindow.gate()});
            recvWindow.push(rv);
            prevAgRecv = rv;
          }
        }
      }
    }
    return b.finish();
  }
};

}  // namespace

const Algorithm& ringAllreduce() {
  static const RingAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
