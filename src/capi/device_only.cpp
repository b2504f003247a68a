// Functions that only have a meaning for device memory: forwarded to the
// real NCCL (with the real communicator), or ncclInvalidUsage saying why
// they cannot run.
#include <string>

#include "capi/api_common.hpp"
#include "capi/forward.hpp"

using namespace gradcomm::capi;

namespace {

/// Runs `call` with the real NCCL's communicator behind `comm`, for a
/// function that only the real NCCL serves, or an ncclInvalidUsage saying
/// why there is none. Logs the first forwarding at info.
template <typename Call>
ncclResult_t withRealComm(const char* fn, ncclComm_t comm, Call call) {
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkHandle(comm, fn)) return r;
    if (!comm->real) {
      return fail(ncclInvalidUsage, std::string(fn) + ": on device memory this needs the real NCCL, but this "
                                                      "communicator has none: " + comm->realWhy);
    }
    noteOnce(comm->rank, std::string("NCCL shim: ") + fn + " on device memory forwarded to the real NCCL");
    return call(comm->real);
  });
}

}  // namespace

extern "C" {

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  static const char* fn = "ncclMemAlloc";
  return guarded(fn, [&]() -> ncclResult_t {
    if (!ptr) return invalidArgument(fn, "ptr", "NULL");
    return callReal(fn, GRADCOMM_REAL(ncclMemAlloc), ptr, size);
  });
}

ncclResult_t ncclMemFree(void* ptr) {
  static const char* fn = "ncclMemFree";
  return guarded(fn, [&]() -> ncclResult_t {
    return callReal(fn, GRADCOMM_REAL(ncclMemFree), ptr);
  });
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  static const char* fn = "ncclCommRegister";
  return withRealComm(fn, comm, [&](ncclComm_t real) {
    return callReal(fn, GRADCOMM_REAL(ncclCommRegister), real, buff, size, handle);
  });
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  static const char* fn = "ncclCommDeregister";
  return withRealComm(fn, comm, [&](ncclComm_t real) {
    return callReal(fn, GRADCOMM_REAL(ncclCommDeregister), real, handle);
  });
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  static const char* fn = "ncclCommWindowRegister";
  return withRealComm(fn, comm, [&](ncclComm_t real) {
    return callReal(fn, GRADCOMM_REAL(ncclCommWindowRegister), real, buff, size, win, winFlags);
  });
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  static const char* fn = "ncclCommWindowDeregister";
  return withRealComm(fn, comm, [&](ncclComm_t real) {
    return callReal(fn, GRADCOMM_REAL(ncclCommWindowDeregister), real, win);
  });
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  static const char* fn = "ncclRedOpCreatePreMulSum";
  return withRealComm(fn, comm, [&](ncclComm_t real) {
    return callReal(fn, GRADCOMM_REAL(ncclRedOpCreatePreMulSum), op, scalar, datatype, residence, real);
  });
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  static const char* fn = "ncclRedOpDestroy";
  return withRealComm(fn, comm, [&](ncclComm_t real) {
    return callReal(fn, GRADCOMM_REAL(ncclRedOpDestroy), op, real);
  });
}

}  // extern "C"

GRADCOMM_NCCL_ALIAS(ncclMemAlloc)
GRADCOMM_NCCL_ALIAS(ncclMemFree)
GRADCOMM_NCCL_ALIAS(ncclCommRegister)
GRADCOMM_NCCL_ALIAS(ncclCommDeregister)
GRADCOMM_NCCL_ALIAS(ncclCommWindowRegister)
GRADCOMM_NCCL_ALIAS(ncclCommWindowDeregister)
GRADCOMM_NCCL_ALIAS(ncclRedOpCreatePreMulSum)
GRADCOMM_NCCL_ALIAS(ncclRedOpDestroy)
