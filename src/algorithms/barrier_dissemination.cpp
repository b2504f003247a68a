// Dissemination barrier: ceil(log2 p) rounds of empty messages to rank
// r + 2^i, each round after the previous round's receive.
#include "algorithms/catalog.hpp"
#include "algorithms/plan_helpers.hpp"

namespace gradcomm::algorithms {
namespace {


class DisseminationBarrier final : public PlannedAlgorithm {
 public:
  const char* name() const override { return "dissemination"; }
  Collective collective() const override { return Collective::kBarrier; }

  Plan plan(const CollectiveCall&, int r, int p, const Tuning&) const override {
    PlanBuilder b;
    Id prev = kNone;
    uint32_t round = 0;
    for (int dist = 1; dist < p; dist *= 2, ++round) {
      b.send((r + dist) % p, in(0, 0), round, {prev});
      prev = b.recv((r - dist + p) % p, out(0, 0), round, {prev});
    }
    return b.finish();
  }
};

}  // namespace

const Algorithm& disseminationBarrier() {
  static const DisseminationBarrier algorithm;
  return algorithm;
}

}  // namespace gradcomm::algorithms
