#pragma once
// Small helpers the planners share: receive-slot pools and in-flight
// windows. All pure bookkeeping over PlanBuilder ids.
#include <algorithm>
#include <vector>

#include "algorithms/plan.hpp"

namespace gradcomm::algorithms {

using Id = PlanBuilder::Id;
/// A step id that stands for no step (PlanBuilder ignores it as a dependency).
inline constexpr Id kNone = PlanBuilder::kNone;

/// Bounds how many steps of one kind are in flight: each new step depends
/// on the one `depth` positions earlier.
class Window {
 public:
  explicit Window(int depth) : ids_(static_cast<size_t>(std::max(1, depth)), PlanBuilder::kNone) {}
  /// The step the next one must wait for.
  PlanBuilder::Id gate() const { return ids_[next_ % ids_.size()]; }
  void push(PlanBuilder::Id id) { ids_[next_++ % ids_.size()] = id; }

 private:
  std::vector<PlanBuilder::Id> ids_;
  size_t next_ = 0;
};

/// A pool of `depth` receive slots of `segment` elements in scratch. A slot
/// is reused once the step that released it completes.
class SlotPool {
 public:
  SlotPool(PlanBuilder& b, int depth, size_t segment)
      : segment_(segment), base_(b.allocScratch(static_cast<size_t>(std::max(1, depth)) * segment)),
        release_(static_cast<size_t>(std::max(1, depth)), PlanBuilder::kNone) {}
  struct Slot {
    size_t index;
    PlanBuilder::Id freeAfter;  ///< dependency before writing into the slot
  };
  Slot acquire() {
    size_t i = cursor_++ % release_.size();
    return {i, release_[i]};
  }
  Span span(const Slot& s, size_t count) const { return scratch(base_ + s.index * segment_, count); }
  void release(const Slot& s, PlanBuilder::Id by) { release_[s.index] = by; }

 private:
  size_t segment_;
  size_t base_;
  std::vector<PlanBuilder::Id> release_;
  size_t cursor_ = 0;
};

}  // namespace gradcomm::algorithms
