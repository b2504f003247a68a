#pragma once
// The real NCCL, for what the NCCL-ABI library does not serve itself
// (device buffers), as the library opens it (gradcomm/device.hpp).
#include "gradcomm/device.hpp"

namespace gradcomm::capi {

/// The real NCCL's function `name` as `Fn`, or null.
template <typename Fn>
Fn realNccl(const char* name) {
  return reinterpret_cast<Fn>(nccl::symbol(name));
}

}  // namespace gradcomm::capi
