#include "algorithms/plan.hpp"

namespace gradcomm::algorithms {

PlanBuilder::Id PlanBuilder::add(StepKind kind, int peer, uint32_t message, Span dst, Span a, Span b, const Id* depsBegin,
                                 const Id* depsEnd) {
  Step s;
  s.kind = kind;
  s.peer = peer;
  s.message = message;
  s.dst = dst;
  s.a = a;
  s.b = b;
  s.depBegin = static_cast<uint32_t>(plan_.deps.size());
  for (const Id* d = depsBegin; d != depsEnd; ++d) {
    if (*d != kNone) plan_.deps.push_back(*d);
  }
  s.depEnd = static_cast<uint32_t>(plan_.deps.size());
  plan_.steps.push_back(s);
  return static_cast<Id>(plan_.steps.size() - 1);
}

}  // namespace gradcomm::algorithms
