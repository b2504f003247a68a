#include "device.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

namespace gradcomm::torch_backend {

namespace {

// Older torch headers have no c10::Stream::native_handle: the extension
// still compiles against them, without CUDA tensors.
template <typename S>
constexpr bool kHasNativeHandle = requires(const S& s) { s.native_handle(); };

// A template, so that the branch a torch without native_handle does not
// take is never compiled.
template <typename S>
void* handleOf(const S& stream) {
  if constexpr (kHasNativeHandle<S>) {
    return stream.native_handle();
  } else {
    TORCH_CHECK(false, "gradcomm backend: built against a torch whose c10::Stream has no native_handle: "
                       "this build takes CPU tensors only");
  }
}

c10::impl::VirtualGuardImpl cudaImpl() { return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA); }

}  // namespace

bool cudaSupported() { return kHasNativeHandle<c10::Stream>; }

c10::Stream currentStream(c10::Device device) { return cudaImpl().getStream(device); }

c10::Stream sideStream(c10::Device device) { return cudaImpl().getStreamFromGlobalPool(device, false); }

void* nativeHandle(const c10::Stream& stream) { return handleOf(stream); }

void recordOnStream(const at::Tensor& t, const c10::Stream& stream) {
  if (!t.defined() || !t.device().is_cuda() || !t.has_storage()) return;
  cudaImpl().recordDataPtrOnStream(t.storage().data_ptr(), stream);
}

std::string CallDevice::check(const at::Tensor& t) {
  const c10::Device d = t.device();
  if (!device) {
    device = d;
    return {};
  }
  if (*device == d) return {};
  const bool bothCuda = device->is_cuda() && d.is_cuda();
  return "got tensors on different devices in one call (" + device->str() + " and " + d.str() + "): " +
         (bothCuda ? "every tensor of a call must be on the same CUDA device"
                   : "a call takes CPU tensors or CUDA tensors, not both; move them to one device");
}

}  // namespace gradcomm::torch_backend
