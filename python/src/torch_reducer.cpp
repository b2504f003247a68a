#include "torch_reducer.hpp"

#include <string>

#include <c10/core/Event.h>

#include "device.hpp"

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

/// The one device of the parameters: nullopt for the CPU, else a CUDA
/// device. Anything else (a second device, a device neither CPU nor CUDA,
/// CUDA parameters in a build without CUDA tensors) is an error naming the
/// parameters involved.
std::optional<c10::Device> deviceOf(const std::vector<at::Tensor>& params) {
  std::optional<c10::Device> first;
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::Device d = params[i].device();
    TORCH_CHECK(d.is_cpu() || d.is_cuda(), "gradcomm.torch.DistributedDataParallel: parameter ", i, " is on ",
                d.str(), "; parameters must be on the CPU or on one CUDA device");
    if (!first) {
      first = d;
      continue;
    }
    TORCH_CHECK(*first == d, "gradcomm.torch.DistributedDataParallel: parameter 0 is on ", first->str(),
                " but parameter ", i, " on ", d.str(),
                "; every parameter must be on one device (the CPU or a single CUDA device)");
  }
  if (!first || first->is_cpu()) return std::nullopt;
  TORCH_CHECK(cudaSupported(), "gradcomm.torch.DistributedDataParallel: the parameters are on ", first->str(),
              " but this build of gradcomm.torch takes CPU tensors only (built against a torch without "
              "c10::Stream::native_handle)");
  return first;
}

std::vector<GradientSpec> specsOf(const std::vector<at::Tensor>& params) {
  std::vector<GradientSpec> specs;
  for (size_t i = 0; i < params.size(); ++i) {
    specs.push_back({static_cast<size_t>(params[i].numel()), gradientType(params[i], i), nullptr});
  }
  return specs;
}

ReducerOptions deviceOptions(ReducerOptions o, const std::optional<c10::Device>& device,
                             const std::optional<c10::Stream>& stream) {
  o.gradientAsBucketView = true;  // one copy in and one out per step, as DDP's
  if (device) {
    o.device = device->index();
    o.stream = nativeHandle(*stream);
  }
  return o;
}

/// Work queued on `later` from here runs after the work queued on
/// `earlier` so far (nothing when they are the same stream).
void order(const c10::Stream& earlier, const c10::Stream& later) {
  if (earlier == later) return;
  c10::Event ev(earlier.device_type());
  ev.record(earlier);
  ev.block(later);
}

}  // namespace

TorchReducer::TorchReducer(const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, const std::vector<at::Tensor>& params,
                           ReducerOptions options)
    : pg_(pg),
      device_(deviceOf(params)),
      stream_(device_ ? std::optional<c10::Stream>(currentStream(*device_)) : std::nullopt),
      reducer_(pg->communicator(), specsOf(params), deviceOptions(std::move(options), device_, stream_)) {
  for (const auto& p : params) {
    shapes_.push_back(p.sizes().vec());
    types_.push_back(p.scalar_type());
  }
}

at::Tensor TorchReducer::bucketView(size_t i) {
  auto opts = at::TensorOptions().dtype(types_[i]);
  if (device_) opts = opts.device(*device_);
  return at::from_blob(reducer_.gradient(i), shapes_[i], opts);
}

void TorchReducer::gradReady(size_t i, const at::Tensor& grad) {
  TORCH_CHECK(i < shapes_.size(), "gradcomm reducer: gradient index ", i, " out of range");
  const c10::Device want = device_ ? *device_ : c10::Device(c10::kCPU);
  TORCH_CHECK(grad.device() == want, "gradcomm.torch.DistributedDataParallel: the gradient of parameter ", i,
              " is on ", grad.device().str(), " but the parameter on ", want.str());
  if (device_) {
    // The copy runs on the current stream (autograd's stream for this
    // gradient), after the work that produced the gradient; the Reducer's
    // allreduce is ordered after the construction stream, so bridge the two.
    const c10::Stream cur = currentStream(*device_);
    bucketView(i).copy_(grad);
    // The caller may free `grad` before the copy has run: keep its memory
    // until the current stream's work so far is done.
    recordOnStream(grad, cur);
    order(cur, *stream_);
  } else {
    bucketView(i).copy_(grad);
  }
  reducer_.markReady(i);
}

void TorchReducer::markUnused(size_t i) {
  TORCH_CHECK(i < shapes_.size(), "gradcomm reducer: gradient index ", i, " out of range");
  reducer_.markUnused(i);
}

void TorchReducer::finalize(const std::vector<at::Tensor>& grads) {
  TORCH_CHECK(grads.size() == shapes_.size(), "gradcomm reducer: finalize needs ", shapes_.size(), " gradients");
  // Device mode: the Reducer orders the construction stream after its
  // results (copies, allreduces) before it returns.
  reducer_.finalize();
  std::optional<c10::Stream> cur;
  if (device_) {
    cur = currentStream(*device_);
    order(*stream_, *cur);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) grads[i].copy_(bucketView(i));
  }
  // The next step's bucket writes (the Reducer's, on its own stream after
  // the construction stream) must follow these reads.
  if (cur) order(*cur, *stream_);
}

}  // namespace gradcomm::torch_backend
