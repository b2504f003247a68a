#include "capi/forward.hpp"

namespace gradcomm::capi {

ncclResult_t fromReal(const char* function, ncclResult_t result) {
  if (result == ncclSuccess || result == ncclInProgress) return result;
  const char* text = nullptr;
  if (auto lastError = RealNccl::instance().get<const char* (*)(ncclComm_t)>("ncclGetLastError")) {
    text = lastError(nullptr);
  }
  return fail(result, std::string(function) + " (real NCCL): " + (text && *text ? text : "failed"));
}

ncclResult_t realMissing(const char* function) {
  RealNccl& real = RealNccl::instance();
  if (!real.available()) return fail(ncclInvalidUsage, std::string(function) + ": " + real.why());
  return fail(ncclInvalidUsage, std::string(function) + ": the real NCCL at " + real.path() +
                                    " does not export it (older than the nccl.h gradcomm was built with)");
}

}  // namespace gradcomm::capi
