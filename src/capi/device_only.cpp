// Functions that only have a meaning for device memory: forwarded to the
// real NCCL (with the real communicator), or ncclInvalidUsage saying why
// they cannot run.
#include <string>

#include "capi/api_common.hpp"
#include "capi/forward.hpp"

using namespace gradcomm::capi;

namespace {

/// The real communicator behind `comm` for a device-only function.
ncclResult_t realComm(ncclComm_t comm, const char* fn, ncclComm_t* real) {
  if (!comm) return invalidArgument(fn, "comm", "the communicator is NULL");
  if (comm->magic != ncclComm::kMagic) return invalidArgument(fn, "comm", "not a live gradcomm communicator");
  return deviceComm(comm, fn, real);
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
  return guarded(fn, [&]() -> ncclResult_t {
    ncclComm_t real;
    if (auto r = realComm(comm, fn, &real)) return r;
    return callReal(fn, GRADCOMM_REAL(ncclCommRegister), real, buff, size, handle);
  });
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  static const char* fn = "ncclCommDeregister";
  return guarded(fn, [&]() -> ncclResult_t {
    ncclComm_t real;
    if (auto r = realComm(comm, fn, &real)) return r;
    return callReal(fn, GRADCOMM_REAL(ncclCommDeregister), real, handle);
  });
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  static const char* fn = "ncclCommWindowRegister";
  return guarded(fn, [&]() -> ncclResult_t {
    ncclComm_t real;
    if (auto r = realComm(comm, fn, &real)) return r;
    return callReal(fn, GRADCOMM_REAL(ncclCommWindowRegister), real, buff, size, win, winFlags);
  });
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  static const char* fn = "ncclCommWindowDeregister";
  return guarded(fn, [&]() -> ncclResult_t {
    ncclComm_t real;
    if (auto r = realComm(comm, fn, &real)) return r;
    return callReal(fn, GRADCOMM_REAL(ncclCommWindowDeregister), real, win);
  });
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  static const char* fn = "ncclRedOpCreatePreMulSum";
  return guarded(fn, [&]() -> ncclResult_t {
    ncclComm_t real;
    if (auto r = realComm(comm, fn, &real)) return r;
    return callReal(fn, GRADCOMM_REAL(ncclRedOpCreatePreMulSum), op, scalar, datatype, residence, real);
  });
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  static const char* fn = "ncclRedOpDestroy";
  return guarded(fn, [&]() -> ncclResult_t {
    ncclComm_t real;
    if (auto r = realComm(comm, fn, &real)) return r;
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
