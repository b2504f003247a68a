#pragma once
// CUDA tensors in the backend through torch's device-generic interface
// (c10::Stream, c10::impl::VirtualGuardImpl): the extension includes no
// CUDA header and links no CUDA library, so one build serves a CPU-only
// torch and a CUDA torch alike (pip builds it where no CUDA toolkit is
// installed). The CUDA runtime behind it is the one torch loaded: these
// functions are reached only for a CUDA tensor, which only a CUDA torch
// makes.
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

namespace gradcomm::torch_backend {

/// True when this build takes CUDA tensors: the torch it was compiled
/// against has c10::Stream::native_handle (the cudaStream_t behind a
/// stream). Against older torch headers: CPU tensors only.
bool cudaSupported();

/// The calling thread's current stream on `device` (a CUDA device).
c10::Stream currentStream(c10::Device device);
/// A stream of torch's pool on `device`, for work of the backend's own
/// threads (never the caller's current stream).
c10::Stream sideStream(c10::Device device);
/// The cudaStream_t behind `stream`, as CollectiveOptions::stream takes it.
void* nativeHandle(const c10::Stream& stream);
/// Tells torch's caching allocator that `t`'s memory is in use on
/// `stream`: freeing it then waits for the work queued there so far.
void recordOnStream(const at::Tensor& t, const c10::Stream& stream);

/// Where the backend's completion thread finishes one call on CUDA
/// tensors: a side stream of the call's device, made the thread's current
/// stream while the scope lives (so result copies, the future's events and
/// its callbacks' synchronisation happen there).
class CompletionStream {
 public:
  explicit CompletionStream(c10::Device device) : stream_(sideStream(device)), guard_(stream_) {}
  const c10::Stream& stream() const { return stream_; }

 private:
  c10::Stream stream_;
  c10::StreamGuard guard_;
};

/// The one device of a call's tensors: the first tensor sets it; every
/// later tensor must be on it (CallDevice::check says what is wrong).
struct CallDevice {
  std::optional<c10::Device> device;
  /// Empty when `t` may join the call; else why not (names both devices).
  std::string check(const at::Tensor& t);
  /// The CUDA device of the call, or nullopt for a host call.
  std::optional<c10::Device> cuda() const {
    if (device && device->is_cuda()) return device;
    return std::nullopt;
  }
};

}  // namespace gradcomm::torch_backend
