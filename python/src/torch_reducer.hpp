#pragma once
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "gradcomm/reducer.hpp"
#include "process_group.hpp"

namespace gradcomm::torch_backend {

/// gradcomm's Reducer over a model's parameters, for
/// gradcomm.torch.DistributedDataParallel: gradients are copied into bucket
/// memory as autograd produces them (markReady launches full buckets at
/// once, overlapped with the rest of backward) and copied back after
/// finalize().
///
/// Parameters all on the CPU: host buckets. Parameters all on one CUDA
/// device: device buckets (the Reducer in device mode), with the stream
/// current at construction as ReducerOptions::stream. The copies into and
/// out of the buckets run on the calling thread's current stream at the
/// time of each call; when that is not the construction stream, an event
/// orders the two, so any stream autograd or the caller uses is safe.
class TorchReducer {
 public:
  /// Collective: every rank passes the same parameter shapes and dtypes.
  /// Throws (RuntimeError) for parameters on more than one device or on a
  /// device other than CPU and CUDA.
  TorchReducer(const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, const std::vector<at::Tensor>& params,
               ReducerOptions options);

  /// Gradient i is complete in `grad` (a tensor shaped like parameter i, on
  /// its device; for CUDA: complete once the work queued so far on the
  /// current stream is).
  void gradReady(size_t i, const at::Tensor& grad);
  /// Parameter i took no part in this step.
  void markUnused(size_t i);
  /// Waits for every bucket and writes the averaged gradients into `grads`
  /// (for CUDA: queued on the current stream, which work queued after
  /// this call may read).
  void finalize(const std::vector<at::Tensor>& grads);
  StepStats lastStepStats() const { return reducer_.lastStepStats(); }
  std::vector<std::vector<size_t>> buckets() const { return reducer_.buckets(); }
  size_t size() const { return shapes_.size(); }
  /// The parameters' CUDA device, or nullopt for CPU parameters.
  std::optional<c10::Device> device() const { return device_; }

 private:
  /// Bucket memory of gradient i as a tensor (it moves at the rebuild).
  at::Tensor bucketView(size_t i);

  c10::intrusive_ptr<ProcessGroupGradcomm> pg_;  // keeps the communicator's group alive
  std::optional<c10::Device> device_;            // CUDA parameters: their device
  std::optional<c10::Stream> stream_;            // CUDA parameters: ReducerOptions::stream
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<at::ScalarType> types_;
  Reducer reducer_;  // last: built from the members above
};

}  // namespace gradcomm::torch_backend
