// Recursive doubling allreduce for small messages: log2(p) rounds, each an
// exchange of the whole vector with the rank whose (core) number differs in
// one bit. Non-power-of-two sizes fold the first 2(p - p2) ranks in pairs
// before and unfold after. Both partners compute every element, so operands
// are always ordered lower rank first: every rank gets identical bits.
#include "algorithms/catalog.hpp"
#include "algorithms/patterns/binomial_tree.hpp"

namespace gradcomm::algorithms {
namespace {

using Id = PlanBuilder::Id;
constexpr Id kNone = PlanBuilder::kNone;

class RecursiveDoublingAllreduce final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "rd"; }
  Collective collective() const override { return Collective::kAllreduce; }
  /// Small calls carry the call signature in their messages: rd's exchanges
  /// (and the fold's pairs) depend on the ranks alone, at most one message
  /// per ordered pair, and link every rank. Saves the call check's message
  /// per operation, about a message latency over TCP.
  bool signsMessages(const transport::CallSignature& call, const RunContext& ctx) const override {
    const size_t bytes = call.count * dataTypeSize(static_cast<DataType>(call.type));
    return ctx.transport->size() >= 2 && call.count > 0 && bytes <= transport::kSignedPayloadLimit;
  }

  Plan plan(const CollectiveCall& call, int r, int p, const Tuning&) const override {
    PlanBuilder b;
    const size_t n = call.count;
    const auto f = patterns::fold(r, p);
    const Span tmp = scratch(b.allocScratch(n), n);
    const Span mine = out(0, n);

    // "Current data" starts as the input (no copy) and lives in out after
    // the first reduction.
    Span cur = in(0, n);
    Id curReady = kNone;   // last write of cur
    Id lastSend = kNone;   // last send that reads out
    Id tmpFree = kNone;    // last reader of tmp

    if (r < 2 * f.extra) {
      if (r % 2 == 0) {
        // Folded away: give our data to r+1, receive the result back.
        Id s = b.send(r + 1, in(0, n), 0);
        b.recv(r + 1, mine, 1, {call.inPlace ? s : kNone});  // already divided for avg
        return b.finish();
      }
      Id rv = b.recv(r - 1, tmp, 0);
      curReady = b.reduce(mine, tmp, cur, {rv});  // lower rank's data first
      tmpFree = curReady;
      cur = mine;
    }
    if (f.newRank >= 0) {
      for (int mask = 1; mask < f.p2; mask <<= 1) {
        const int partnerNew = f.newRank ^ mask;
        const int partner = patterns::unfold(partnerNew, f);
        const uint32_t msg = static_cast<uint32_t>(2 + mask);
        Id s = b.send(partner, cur, msg, {curReady});
        Id rv = b.recv(partner, tmp, msg, {tmpFree});
        const bool partnerLower = partner < r;
        // Writing `mine` must wait for the send that still reads it.
        Id red = partnerLower ? b.reduce(mine, tmp, cur, {rv, s, lastSend})
                              : b.reduce(mine, cur, tmp, {rv, s, lastSend});
        lastSend = s;
        tmpFree = red;
        curReady = red;
        cur = mine;
      }
    }
    if (cur.buf == Buf::kInput && !call.inPlace) curReady = b.copy(mine, cur, {curReady});
    Id finalStep = curReady;
    if (call.op == ReduceOp::kAvg) finalStep = b.divide(mine, {curReady, lastSend});
    if (r < 2 * f.extra && r % 2 == 1) b.send(r - 1, mine, 1, {finalStep});
    return b.finish();
  }
};

}  // namespace

const Algorithm& recursiveDoublingAllreduce() {
  static const RecursiveDoublingAllreduce algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
