#pragma once
// Race check for plans, used by the planner tests.
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/plan.hpp"

namespace gradcomm::testing {

namespace plan_hazards {

inline const char* kindName(algorithms::StepKind kind) {
  using algorithms::StepKind;
  switch (kind) {
    case StepKind::kSend: return "send";
    case StepKind::kRecv: return "recv";
    case StepKind::kReduce: return "reduce";
    case StepKind::kCopy: return "copy";
    case StepKind::kDivide: return "divide";
    case StepKind::kNop: return "nop";
  }
  return "?";
}

using algorithms::Buf;
using algorithms::Plan;
using algorithms::Span;
using algorithms::Step;
using algorithms::StepKind;

struct Access {
  Span span;
  bool write;
};

inline void accesses(const Step& s, std::vector<Access>& out) {
  out.clear();
  switch (s.kind) {
    case StepKind::kSend: out.push_back({s.a, false}); break;
    case StepKind::kRecv: out.push_back({s.dst, true}); break;
    case StepKind::kReduce:
      out.push_back({s.a, false});
      out.push_back({s.b, false});
      out.push_back({s.dst, true});
      break;
    case StepKind::kCopy:
      out.push_back({s.a, false});
      out.push_back({s.dst, true});
      break;
    case StepKind::kDivide: out.push_back({s.dst, true}); break;
    case StepKind::kNop: break;
  }
}

inline bool overlaps(const Span& x, const Span& y, bool inputAliasesOutput, long long shift) {
  if (x.count == 0 || y.count == 0) return false;
  // Map both spans into one address space: (buffer, first, last+1).
  auto place = [&](const Span& s, Buf& buf, long long& begin) {
    buf = s.buf;
    begin = static_cast<long long>(s.offset);
    if (inputAliasesOutput && s.buf == Buf::kInput) {
      buf = Buf::kOutput;
      begin += shift;
    }
  };
  Buf bx, by;
  long long x0, y0;
  place(x, bx, x0);
  place(y, by, y0);
  if (bx != by) return false;
  return x0 < y0 + static_cast<long long>(y.count) && y0 < x0 + static_cast<long long>(x.count);
}

}  // namespace plan_hazards

/// Checks a plan for races: every pair of steps that touch overlapping
/// memory, at least one of them writing, must be ordered by the DAG (a send
/// reads its source until it completes; a receive writes its destination).
/// When the input aliases the output, input element x is output element
/// x + inputShift (allgather in place: r * count; reduce-scatter: -r * count).
/// Returns a description of the first hazard, or an empty string.
inline std::string findHazard(const algorithms::Plan& plan, bool inputAliasesOutput, long long inputShift = 0) {
  const size_t n = plan.steps.size();
  // reach[i] = set of steps that must complete before i starts (transitive).
  std::vector<std::vector<bool>> before(n, std::vector<bool>(n, false));
  for (size_t i = 0; i < n; ++i) {
    const algorithms::Step& s = plan.steps[i];
    for (uint32_t k = s.depBegin; k < s.depEnd; ++k) {
      uint32_t d = plan.deps[k];
      if (d >= i) return "step " + std::to_string(i) + " depends on a later step " + std::to_string(d);
      before[i][d] = true;
      for (size_t j = 0; j < n; ++j) {
        if (before[d][j]) before[i][j] = true;
      }
    }
  }
  std::vector<plan_hazards::Access> ai, aj;
  for (size_t i = 0; i < n; ++i) {
    plan_hazards::accesses(plan.steps[i], ai);
    for (size_t j = i + 1; j < n; ++j) {
      if (before[j][i]) continue;
      plan_hazards::accesses(plan.steps[j], aj);
      for (const auto& x : ai) {
        for (const auto& y : aj) {
          if ((x.write || y.write) && plan_hazards::overlaps(x.span, y.span, inputAliasesOutput, inputShift)) {
            // Two reads never conflict; a step never conflicts with itself.
            return std::string("unordered ") + plan_hazards::kindName(plan.steps[i].kind) + " (step " +
                   std::to_string(i) + ") and " + plan_hazards::kindName(plan.steps[j].kind) + " (step " +
                   std::to_string(j) + ") touch the same elements";
          }
        }
      }
    }
  }
  return {};
}

}  // namespace gradcomm::testing
