#pragma once
// CUDA helpers of the device layer's CUDA code (builds with CUDA only).
#include <cuda_runtime_api.h>

#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::device {

/// Throws DeviceError naming `what` and CUDA's reason unless `err` is success.
inline void checkCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // a sticky error stays; others are cleared for the next call
  throw DeviceError(std::string(what) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

/// True unless the driver says `device`'s primary context is inactive
/// (making such a device current creates its context).
bool primaryContextActive(int device);

/// Makes `device` current on this thread for the scope (the progress thread
/// serves every device a process uses; the caller's thread keeps its own;
/// NCCL forms and launches on the current device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    checkCuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ == device) {
      previous_ = -1;
      return;
    }
    if (!primaryContextActive(previous_)) previous_ = -1;  // nothing to go back to
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace gradcomm::device
