#include "torch_reducer.hpp"

#include <string>

namespace gradcomm::torch_backend {
namespace {

DataType gradientType(const at::Tensor& p, size_t i) {
  switch (p.scalar_type()) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    default:
      TORCH_CHECK(false, "gradcomm.torch.DistributedDataParallel: parameter ", i, " has dtype ",
                  c10::toString(p.scalar_type()),
                  "; gradients must be float32, float64, float16 or bfloat16 (or set requires_grad=False)");
  }
}

std::vector<GradientSpec> specsOf(const std::vector<at::Tensor>& params) {
  std::vector<GradientSpec> specs;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    TORCH_CHECK(p.device().is_cpu(), "gradcomm.torch.DistributedDataParallel: parameter ", i, " is on ",
                p.device().str(), "; this build takes CPU parameters only");
    specs.push_back({static_cast<size_t>(p.numel()), gradientType(p, i), nullptr});
  }
  return specs;
}

ReducerOptions withBucketViews(ReducerOptions o) {
  o.gradientAsBucketView = true;  // one copy in and one out per step, as DDP's
  return o;
}

}  // namespace

TorchReducer::TorchReducer(const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, const std::vector<at::Tensor>& params,
                           ReducerOptions options)
    : pg_(pg), reducer_(pg->communicator(), specsOf(params), withBucketViews(std::move(options))) {
  for (const auto& p : params) {
    shapes_.push_back(p.sizes().vec());
    types_.push_back(p.scalar_type());
  }
}

at::Tensor TorchReducer::bucketView(size_t i) {
  return at::from_blob(reducer_.gradient(i), shapes_[i], at::TensorOptions().dtype(types_[i]));
}

void TorchReducer::gradReady(size_t i, const at::Tensor& grad) {
  TORCH_CHECK(i < shapes_.size(), "gradcomm reducer: gradient index ", i, " out of range");
  bucketView(i).copy_(grad);
  reducer_.markReady(i);
}

void TorchReducer::markUnused(size_t i) {
  TORCH_CHECK(i < shapes_.size(), "gradcomm reducer: gradient index ", i, " out of range");
  reducer_.markUnused(i);
}

void TorchReducer::finalize(const std::vector<at::Tensor>& grads) {
  TORCH_CHECK(grads.size() == shapes_.size(), "gradcomm reducer: finalize needs ", shapes_.size(), " gradients");
  reducer_.finalize();
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) grads[i].copy_(bucketView(i));
  }
}

}  // namespace gradcomm::torch_backend
