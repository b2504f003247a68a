#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "gradcomm/gossip.hpp"
#include "process_group.hpp"

namespace gradcomm::torch_backend {

/// GossipOptions as Python passes them (checked before conversion).
struct TorchGossipOptions {
  int64_t peersPerStep = 0;   ///< 0: GRADCOMM_GOSSIP_PEERS
  int64_t maxStaleness = 0;   ///< steps; 0: GRADCOMM_GOSSIP_MAX_STALENESS
  double peerTimeoutS = 0;    ///< seconds; 0: GRADCOMM_GOSSIP_PEER_TIMEOUT
  bool consensusDistance = false;
  std::string timelinePath;
};

/// gradcomm's GossipAverager over a list of float32 CPU tensors (a model's
/// parameters), for gradcomm.torch.GossipDataParallel. It averages the
/// tensors' own storage in place and keeps the tensors alive as long as it.
class TorchGossip {
 public:
  /// Collective. Every rank checks its tensors and options, then all ranks
  /// agree (one allreduce) before the averager is made, so a bad tensor on
  /// one rank is an error on every rank and the group stays usable.
  /// Throws std::invalid_argument for bad input (ValueError in Python).
  TorchGossip(const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, std::vector<at::Tensor> tensors,
              const TorchGossipOptions& options);

  /// GossipAverager::step(); throws if a tensor's storage moved since construction.
  void step();
  /// GossipAverager::synchronize(): exact average over the ranks; collective.
  void synchronize();
  double weight() const { return averager_->weight(); }
  GossipStats stats() const { return averager_->stats(); }
  size_t size() const { return tensors_.size(); }
  /// Total float32 elements averaged.
  size_t numel() const { return numel_; }

 private:
  /// Throws if a tensor's storage moved; `collective`: aborts the communicator first.
  void checkStorage(const char* what, bool collective) const;

  c10::intrusive_ptr<ProcessGroupGradcomm> pg_;  // keeps the communicator alive (destroyed last)
  std::vector<at::Tensor> tensors_;              // the memory the averager writes
  std::vector<const void*> pointers_;            // where it writes, to catch a moved storage
  size_t numel_ = 0;
  std::unique_ptr<GossipAverager> averager_;
};

/// What is wrong with tensor `i` for the gossip averager, or "" when nothing.
std::string gossipTensorProblem(size_t i, const at::Tensor& t);

}  // namespace gradcomm::torch_backend
