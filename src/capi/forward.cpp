#include "capi/forward.hpp"

namespace gradcomm::capi {

ncclResult_t fromReal(const char* function, ncclResult_t result) {
  if (result == ncclSuccess || result == ncclInProgress) return result;
  const char* text = nullptr;
  if (auto lastError = realNccl<const char* (*)(ncclComm_t)>("ncclGetLastError")) {
    text = lastError(nullptr);
  }
  return fail(result, std::string(function) + " (real NCCL): " + (text && *text ? text : "failed"));
}

ncclResult_t realMissing(const char* function) {
  if (!nccl::available()) return fail(ncclInvalidUsage, std::string(function) + ": " + nccl::unavailableReason());
  return fail(ncclInvalidUsage, std::string(function) + ": the real NCCL at " + nccl::path() +
                                    " does not export it (older than the nccl.h gradcomm was built with)");
}

}  // namespace gradcomm::capi
