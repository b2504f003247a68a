#pragma once
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "gradcomm/reducer.hpp"
#include "process_group.hpp"

namespace gradcomm::torch_backend {

/// gradcomm's Reducer over a model's parameters, for
/// gradcomm.torch.DistributedDataParallel: gradients are copied into bucket
/// memory as autograd produces them (markReady launches full buckets at
/// once, overlapped with the rest of backward) and copied back after
/// finalize().
class TorchReducer {
 public:
  /// Collective: every rank passes the same parameter shapes and dtypes.
  TorchReducer(const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, const std::vector<at::Tensor>& params,
               ReducerOptions options);

  /// Gradient i is complete in `grad` (a tensor shaped like parameter i).
  void gradReady(size_t i, const at::Tensor& grad);
  /// Parameter i took no part in this step.
  void markUnused(size_t i);
  /// Waits for every bucket and writes the averaged gradients into `grads`.
  void finalize(const std::vector<at::Tensor>& grads);
  StepStats lastStepStats() const { return reducer_.lastStepStats(); }
  std::vector<std::vector<size_t>> buckets() const { return reducer_.buckets(); }
  size_t size() const { return shapes_.size(); }

 private:
  /// Bucket memory of gradient i as a tensor (it moves at the rebuild).
  at::Tensor bucketView(size_t i);

  c10::intrusive_ptr<ProcessGroupGradcomm> pg_;  // keeps the communicator's group alive
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<at::ScalarType> types_;
  Reducer reducer_;
};

}  // namespace gradcomm::torch_backend
