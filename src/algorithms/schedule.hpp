#pragma once
#include <memory>
#include <string>
#include <vector>

namespace gradcomm::algorithms {

/// One collective in flight, advanced by whichever thread drives progress.
/// advance() never blocks; the engine calls it at least once and then until
/// done(), never after (a schedule that wraps another does the same for the
/// inner one).
class Schedule {
 public:
  virtual ~Schedule() = default;
  /// Advances as far as possible without blocking; true when anything moved.
  virtual bool advance() = 0;
  virtual bool done() const = 0;
  /// What it waits for, for error messages: "recv from rank 3 (message 7)".
  virtual std::string waitingFor() const = 0;
  /// Ranks it is waiting to receive from.
  virtual std::vector<int> awaitedPeers() const { return {}; }
  /// Called while the schedule makes no progress; throws if a peer it waits
  /// for can be seen to have died.
  virtual void healthCheck() {}
};

class Workspace;

/// Destroys a schedule and gives its memory back to the workspace it came
/// from (or to the heap).
struct ScheduleDeleter {
  Workspace* pool = nullptr;
  void operator()(Schedule* s) const;
};
using SchedulePtr = std::unique_ptr<Schedule, ScheduleDeleter>;

/// Constructs a T in memory recycled by `pool` (schedules are created per
/// operation; this keeps a stream of small operations off the allocator).
template <typename T, typename... Args>
SchedulePtr makeSchedule(Workspace* pool, Args&&... args);

}  // namespace gradcomm::algorithms

#include "algorithms/workspace.hpp"

namespace gradcomm::algorithms {

template <typename T, typename... Args>
SchedulePtr makeSchedule(Workspace* pool, Args&&... args) {
  void* mem = pool ? pool->acquireBlock(sizeof(T)) : ::operator new(sizeof(T));
  if (!mem) mem = ::operator new(sizeof(T));  // too large for a block
  const bool pooled = pool && pool->ownsBlock(mem);
  try {
    return SchedulePtr(new (mem) T(std::forward<Args>(args)...), ScheduleDeleter{pooled ? pool : nullptr});
  } catch (...) {
    if (pooled) pool->releaseBlock(mem); else ::operator delete(mem);
    throw;
  }
}

inline void ScheduleDeleter::operator()(Schedule* s) const {
  if (!s) return;
  s->~Schedule();
  if (pool) pool->releaseBlock(s); else ::operator delete(s);
}

}  // namespace gradcomm::algorithms
