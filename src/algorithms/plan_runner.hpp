#pragma once
#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::algorithms {

/// Thrown where a signed message shows that `peer` made another call; the
/// engine rethrows it as a MismatchError that names the operation.
class SignedCallMismatch : public MismatchError {
 public:
  SignedCallMismatch(int myRank, int peer, const transport::CallSignature& mine,
                     const transport::CallSignature& theirs)
      : MismatchError(transport::mismatchMessage(myRank, "the operation", mine, peer, &theirs)),
        peer(peer),
        theirs(theirs) {}
  int peer;
  transport::CallSignature theirs;
};

/// Writes a signed message into `slot` (room for the signature and `bytes`):
/// the signature `mine`, then `bytes` of `data`. Returns the message's size.
size_t writeSigned(char* slot, const transport::CallSignature& mine, const void* data, size_t bytes);

/// The data of the signed message of `got` bytes that `peer` sent into
/// `slot`, once its signature matches `mine` (this rank `me`'s call) and it
/// carries `bytes`. Throws MismatchError without a signature,
/// SignedCallMismatch for another call, InternalError for another size.
const char* readSigned(const char* slot, size_t got, size_t bytes, const transport::CallSignature& mine, int me,
                       int peer);

/// The generic executor of a Plan: posts sends and receives as soon as their
/// dependencies complete, runs reductions on the calling thread, and never
/// blocks. Transfers of later segments therefore overlap the reduction of
/// earlier ones. The plan is shared (cached); the mutable state lives in
/// pooled buffers of the workspace, so a steady stream of operations
/// allocates nothing here.
class PlanRunner : public Schedule {
 public:
  PlanRunner(std::shared_ptr<const CompiledPlan> plan, const CollectiveCall& call, const RunContext& ctx);
  ~PlanRunner() override;
  bool advance() override;
  bool done() const override { return completed_ == plan_->plan.steps.size(); }
  std::string waitingFor() const override;
  std::vector<int> awaitedPeers() const override;

 private:
  char* address(const Span& s) const;
  void start(uint32_t id);
  void startSigned(uint32_t id);
  /// Checks a signed receive's signature and moves its data into place.
  void acceptSigned(uint32_t id, const transport::Request& r);
  void complete(uint32_t id);
  void runCompute(uint32_t id);

  std::shared_ptr<const CompiledPlan> plan_;
  const Step* steps_;
  RunContext ctx_;
  size_t elemSize_;
  double divisor_;
  char* bases_[3] = {nullptr, nullptr, nullptr};
  std::unique_ptr<RunnerBuffers> buf_;
  size_t commHead_ = 0;     // FIFO heads into buf_->readyComm / readyCompute
  size_t computeHead_ = 0;
  size_t completed_ = 0;
};

}  // namespace gradcomm::algorithms
