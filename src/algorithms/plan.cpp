#include "algorithms/plan.hpp"

#include <algorithm>

namespace gradcomm::algorithms {

const char* toString(StepKind kind) {
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

PlanBuilder::Id PlanBuilder::add(StepKind kind, int peer, uint32_t message, Span dst, Span a, Span b, Deps deps) {
  Step s;
  s.kind = kind;
  s.peer = peer;
  s.message = message;
  s.dst = dst;
  s.a = a;
  s.b = b;
  s.depBegin = static_cast<uint32_t>(plan_.deps.size());
  for (Id d : deps) {
    if (d != kNone) plan_.deps.push_back(d);
  }
  s.depEnd = static_cast<uint32_t>(plan_.deps.size());
  plan_.steps.push_back(s);
  return static_cast<Id>(plan_.steps.size() - 1);
}

PlanBuilder::Id PlanBuilder::nop(const std::vector<Id>& deps) {
  Step s;
  s.kind = StepKind::kNop;
  s.depBegin = static_cast<uint32_t>(plan_.deps.size());
  for (Id d : deps) {
    if (d != kNone) plan_.deps.push_back(d);
  }
  s.depEnd = static_cast<uint32_t>(plan_.deps.size());
  plan_.steps.push_back(s);
  return static_cast<Id>(plan_.steps.size() - 1);
}

namespace {

struct Access {
  Span span;
  bool write;
};

void accesses(const Step& s, std::vector<Access>& out) {
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

bool overlaps(const Span& x, const Span& y, bool inputAliasesOutput, long long shift) {
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

}  // namespace

std::string findHazard(const Plan& plan, bool inputAliasesOutput, long long inputShift) {
  const size_t n = plan.steps.size();
  // reach[i] = set of steps that must complete before i starts (transitive).
  std::vector<std::vector<bool>> before(n, std::vector<bool>(n, false));
  for (size_t i = 0; i < n; ++i) {
    const Step& s = plan.steps[i];
    for (uint32_t k = s.depBegin; k < s.depEnd; ++k) {
      uint32_t d = plan.deps[k];
      if (d >= i) return "step " + std::to_string(i) + " depends on a later step " + std::to_string(d);
      before[i][d] = true;
      for (size_t j = 0; j < n; ++j) {
        if (before[d][j]) before[i][j] = true;
      }
    }
  }
  std::vector<Access> ai, aj;
  for (size_t i = 0; i < n; ++i) {
    accesses(plan.steps[i], ai);
    for (size_t j = i + 1; j < n; ++j) {
      if (before[j][i]) continue;
      accesses(plan.steps[j], aj);
      for (const auto& x : ai) {
        for (const auto& y : aj) {
          if ((x.write || y.write) && overlaps(x.span, y.span, inputAliasesOutput, inputShift)) {
            // Two reads never conflict; a step never conflicts with itself.
            return std::string("unordered ") + toString(plan.steps[i].kind) + " (step " + std::to_string(i) + ") and " +
                   toString(plan.steps[j].kind) + " (step " + std::to_string(j) + ") touch the same elements";
          }
        }
      }
    }
  }
  return {};
}

}  // namespace gradcomm::algorithms
