// Recursive halving-doubling allreduce (Rabenseifner): a reduce-scatter by
// recursive vector halving, then an allgather by recursive doubling that
// retraces its rounds backwards. Bandwidth-optimal like the ring with
// log2(p) instead of p-1 latency terms. The first round moves half the
// vector, so the reduce-scatter takes the distances whose partners share a
// host first (topology::hdHalvingOrder; distance halving, p2/2 first,
// where none do). Non-power-of-two sizes fold the first 2(p - p2) ranks in
// pairs first and unfold after. Every exchange is cut into pipeline
// segments.
#include <vector>

#include "algorithms/catalog.hpp"
#include "algorithms/patterns/binomial_tree.hpp"
#include "algorithms/patterns/partition.hpp"
#include "algorithms/plan_helpers.hpp"
#include "topology/cost_model.hpp"

namespace gradcomm::algorithms {
namespace {

using patterns::Partition;
using patterns::Segments;

class HalvingDoublingAllreduce final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "hd"; }
  Collective collective() const override { return Collective::kAllreduce; }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning& tuning) const override {
    PlanBuilder b;
    const size_t n = call.count;
    const size_t seg = patterns::segmentElements(tuning.exchangeSegmentBytes, dataTypeSize(call.type), n);
    const int depth = std::max(2, tuning.pipelineDepth);
    const auto f = patterns::fold(r, p);
    SlotPool slots(b, depth, seg);
    uint32_t msg = 0;  // identical sequence on both sides of every exchange

    // Segmented transfer of `span` to (send) or from `peer`, segment s as
    // message base + s; at most depth sends or 2 * depth receives in flight.
    auto moveRange = [&](bool send, int peer, Span span, uint32_t base, std::vector<Id> deps) {
      Window w(send ? depth : 2 * depth);
      std::vector<Id> ids;
      Segments segs{span.count, seg};
      Id gate = b.nop(deps);
      for (size_t s = 0; s < segs.number(); ++s) {
        Span part{span.buf, span.offset + segs.offsetOf(s), segs.sizeOf(s)};
        const uint32_t m = base + static_cast<uint32_t>(s);
        Id id = send ? b.send(peer, part, m, {gate, w.gate()}) : b.recv(peer, part, m, {gate, w.gate()});
        w.push(id);
        ids.push_back(id);
      }
      return ids;
    };
    // Receive [dst] from peer segment by segment and reduce into dst with
    // `local` (same offsets); lowerFirst orders operands.
    auto recvReduceRange = [&](int peer, Span dst, Span local, bool peerFirst, uint32_t base, std::vector<Id> deps) {
      std::vector<Id> ids;
      Segments segs{dst.count, seg};
      Id gate = b.nop(deps);
      for (size_t s = 0; s < segs.number(); ++s) {
        const size_t off = segs.offsetOf(s), cnt = segs.sizeOf(s);
        auto slot = slots.acquire();
        Id rv = b.recv(peer, slots.span(slot, cnt), base + static_cast<uint32_t>(s), {slot.freeAfter, gate});
        Span d{dst.buf, dst.offset + off, cnt};
        Span l{local.buf, local.offset + off, cnt};
        Id red = peerFirst ? b.reduce(d, slots.span(slot, cnt), l, {rv}) : b.reduce(d, l, slots.span(slot, cnt), {rv});
        slots.release(slot, red);
        ids.push_back(red);
      }
      return ids;
    };
    const uint32_t stride = static_cast<uint32_t>(Segments{n, seg}.number() + 1);

    // Phase 0: fold. Even ranks of the first 2*extra hand their vector to r+1.
    bool haveOut = false;  // does out hold our current data (else input)?
    // Phases are joined coarsely: every step of a round waits for `barrier`,
    // a nop that follows every step of the rounds before.
    Id barrier = kNone;
    std::vector<Id> round;
    auto join = [&](const std::vector<Id>& more) { round.insert(round.end(), more.begin(), more.end()); };
    auto closeRound = [&] {
      round.push_back(barrier);
      barrier = b.nop(round);
      round.clear();
    };
    if (r < 2 * f.extra && r % 2 == 0) {
      auto sends = moveRange(true, r + 1, in(0, n), 0, {});
      // In place, the result overwrites the input we are still sending.
      moveRange(false, r + 1, out(0, n), stride, call.inPlace ? sends : std::vector<Id>{});
      return b.finish();
    }
    if (r < 2 * f.extra) {
      join(recvReduceRange(r - 1, out(0, n), in(0, n), true, 0, {}));
      haveOut = true;
      closeRound();
    }
    msg = 2 * stride;

    // Phase 1: reduce-scatter by recursive halving over core ranks. Each
    // round halves the window of chunks this rank is responsible for,
    // keeping the lower half where its rank has the round's distance bit
    // clear; any order of the distances works, every rank taking the same.
    const std::vector<int> order = topology::hdHalvingOrder(f.p2, tuning.hdSameHostDistances);
    const Partition chunks{n, static_cast<size_t>(f.p2)};
    int lo = 0, hi = f.p2;  // window of chunk indices we are responsible for
    for (const int mask : order) {
      const int partner = patterns::unfold(f.newRank ^ mask, f);
      const int mid = lo + (hi - lo) / 2;
      const bool keepLower = (f.newRank & mask) == 0;
      const int keepLo = keepLower ? lo : mid, keepHi = keepLower ? mid : hi;
      const int sendLo = keepLower ? mid : lo, sendHi = keepLower ? hi : mid;
      const size_t keepOff = chunks.offsetOf(static_cast<size_t>(keepLo));
      const size_t keepCnt = chunks.offsetOf(static_cast<size_t>(keepHi)) - keepOff;
      const size_t sendOff = chunks.offsetOf(static_cast<size_t>(sendLo));
      const size_t sendCnt = chunks.offsetOf(static_cast<size_t>(sendHi)) - sendOff;
      Span cur = haveOut ? out(sendOff, sendCnt) : in(sendOff, sendCnt);
      Span keepCur = haveOut ? out(keepOff, keepCnt) : in(keepOff, keepCnt);
      join(moveRange(true, partner, cur, msg, {barrier}));
      join(recvReduceRange(partner, out(keepOff, keepCnt), keepCur, partner < r, msg, {barrier}));
      closeRound();
      msg += stride;
      haveOut = true;
      lo = keepLo;
      hi = keepHi;
    }
    // We own chunk lo (newRank under distance halving): divide it once,
    // here, for avg.
    const size_t ownOff = chunks.offsetOf(static_cast<size_t>(lo));
    const size_t ownCnt = chunks.offsetOf(static_cast<size_t>(hi)) - ownOff;
    if (!haveOut && !call.inPlace) join({b.copy(out(ownOff, ownCnt), in(ownOff, ownCnt), {barrier})});
    closeRound();
    if (call.op == ReduceOp::kAvg) join({b.divide(out(ownOff, ownCnt), {barrier})});
    closeRound();

    // Phase 2: allgather by recursive doubling, the reduce-scatter's
    // rounds backwards; windows grow back.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const int mask = *it;
      const int partner = patterns::unfold(f.newRank ^ mask, f);
      const int size = hi - lo;
      const bool partnerAbove = (f.newRank & mask) == 0;
      const int pLo = partnerAbove ? hi : lo - size, pHi = partnerAbove ? hi + size : lo;
      const size_t myOff = chunks.offsetOf(static_cast<size_t>(lo));
      const size_t myCnt = chunks.offsetOf(static_cast<size_t>(hi)) - myOff;
      const size_t pOff = chunks.offsetOf(static_cast<size_t>(pLo));
      const size_t pCnt = chunks.offsetOf(static_cast<size_t>(pHi)) - pOff;
      join(moveRange(true, partner, out(myOff, myCnt), msg, {barrier}));
      join(moveRange(false, partner, out(pOff, pCnt), msg, {barrier}));
      closeRound();
      msg += stride;
      lo = std::min(lo, pLo);
      hi = std::max(hi, pHi);
    }

    // Phase 3: unfold: odd ranks of the first 2*extra return the result.
    if (r < 2 * f.extra) moveRange(true, r - 1, out(0, n), stride, {barrier});
    return b.finish();
  }
};

}  // namespace

const Algorithm& halvingDoublingAllreduce() {
  static const HalvingDoublingAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
