#pragma once
#include <deque>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace gradcomm::algorithms {

/// The generic executor of a Plan: posts sends and receives as soon as their
/// dependencies complete, runs reductions on the calling thread, and never
/// blocks. Transfers of later segments therefore overlap the reduction of
/// earlier ones.
class PlanRunner : public Schedule {
 public:
  PlanRunner(Plan plan, const CollectiveCall& call, RunContext ctx);
  bool advance() override;
  bool done() const override { return completed_ == plan_.steps.size(); }
  std::string waitingFor() const override;
  std::vector<int> awaitedPeers() const override;

 private:
  char* address(const Span& s) const;
  void start(uint32_t id);
  void complete(uint32_t id);
  void runCompute(uint32_t id);

  Plan plan_;
  RunContext ctx_;
  size_t elemSize_;
  double divisor_;
  char* bases_[3] = {nullptr, nullptr, nullptr};
  std::vector<uint32_t> remaining_;
  std::vector<uint32_t> succBegin_;
  std::vector<uint32_t> succ_;
  std::deque<uint32_t> readyComm_;
  std::deque<uint32_t> readyCompute_;
  struct Active {
    uint32_t step;
    transport::RequestPtr request;
  };
  std::vector<Active> active_;
  size_t completed_ = 0;
};

}  // namespace gradcomm::algorithms
