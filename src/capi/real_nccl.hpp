#pragma once
// The real NCCL, for what the NCCL-ABI library does not serve itself
// (device buffers): the device layer's loader.
#include "device/nccl_library.hpp"

namespace gradcomm::capi {

using RealNccl = device::NcclLibrary;

}  // namespace gradcomm::capi
