#pragma once
#include <memory>
#include <string>
#include <vector>

namespace gradcomm::algorithms {

/// One collective in flight, advanced by whichever thread drives progress.
/// advance() never blocks; the engine calls it until done().
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

using SchedulePtr = std::unique_ptr<Schedule>;

}  // namespace gradcomm::algorithms
