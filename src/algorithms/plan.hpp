#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace gradcomm::algorithms {

/// The buffers a plan can name. Offsets and counts are in elements.
enum class Buf : uint8_t { kInput, kOutput, kScratch };

struct Span {
  Buf buf = Buf::kOutput;
  size_t offset = 0;
  size_t count = 0;
};

inline Span in(size_t offset, size_t count) { return {Buf::kInput, offset, count}; }
inline Span out(size_t offset, size_t count) { return {Buf::kOutput, offset, count}; }
inline Span scratch(size_t offset, size_t count) { return {Buf::kScratch, offset, count}; }

/// The vocabulary every point-to-point algorithm is written in.
enum class StepKind : uint8_t {
  kSend,    ///< send `a` to `peer`
  kRecv,    ///< receive from `peer` into `dst`
  kReduce,  ///< dst = a OP b (elementwise)
  kCopy,    ///< dst = a
  kDivide,  ///< dst /= ranks (the last step of avg)
  kNop,     ///< joins dependencies
};

struct Step {
  StepKind kind = StepKind::kNop;
  int peer = -1;
  uint32_t message = 0;  ///< send/recv: index that pairs them across ranks
  Span dst;
  Span a;
  Span b;
  uint32_t depBegin = 0;  ///< range in Plan::deps
  uint32_t depEnd = 0;
};

/// A rank's part of one collective: a DAG of steps over its buffers. Plans
/// are pure data, built by planners from (rank, size, count) alone, so they
/// can be unit-tested and checked for hazards without any transport.
struct Plan {
  std::vector<Step> steps;
  std::vector<uint32_t> deps;
  size_t scratchCount = 0;  ///< elements of scratch the plan needs
};

/// Builds a Plan. Dependencies are step ids; kNone entries are ignored, so
/// planners can pass "the previous send, if any" without branching.
class PlanBuilder {
 public:
  using Id = uint32_t;
  static constexpr Id kNone = UINT32_MAX;
  using Deps = std::initializer_list<Id>;

  Id send(int peer, Span src, uint32_t message, Deps deps = {}) { return add(StepKind::kSend, peer, message, {}, src, {}, deps); }
  Id recv(int peer, Span dst, uint32_t message, Deps deps = {}) { return add(StepKind::kRecv, peer, message, dst, {}, {}, deps); }
  Id reduce(Span dst, Span a, Span b, Deps deps = {}) { return add(StepKind::kReduce, -1, 0, dst, a, b, deps); }
  Id copy(Span dst, Span src, Deps deps = {}) { return add(StepKind::kCopy, -1, 0, dst, src, {}, deps); }
  Id divide(Span data, Deps deps = {}) { return add(StepKind::kDivide, -1, 0, data, {}, {}, deps); }
  Id nop(Deps deps = {}) { return add(StepKind::kNop, -1, 0, {}, {}, {}, deps); }
  Id nop(const std::vector<Id>& deps) { return add(StepKind::kNop, -1, 0, {}, {}, {}, deps.data(), deps.data() + deps.size()); }
  size_t allocScratch(size_t count) {
    size_t offset = plan_.scratchCount;
    plan_.scratchCount += count;
    return offset;
  }
  Plan finish() { return std::move(plan_); }

 private:
  Id add(StepKind kind, int peer, uint32_t message, Span dst, Span a, Span b, Deps deps) {
    return add(kind, peer, message, dst, a, b, deps.begin(), deps.end());
  }
  Id add(StepKind kind, int peer, uint32_t message, Span dst, Span a, Span b, const Id* depsBegin, const Id* depsEnd);
  Plan plan_;
};

}  // namespace gradcomm::algorithms
