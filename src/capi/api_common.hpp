#pragma once
// Helpers shared by the exported functions of the NCCL-ABI library.
#include <nccl.h>

#include <string>

#include "capi/comm.hpp"
#include "capi/errors.hpp"
#include "gradcomm/config.hpp"
#include "gradcomm/types.hpp"

/// Defines pnccl<name> as the same function as nccl<name> (NCCL's profiling
/// aliases; tools interpose the ncclX names and call the pncclX ones).
/// (Deprecated NCCL functions are part of the ABI too: no warning for them.)
#define GRADCOMM_NCCL_ALIAS(name)                                            \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"") \
  extern "C" __attribute__((alias(#name))) decltype(name) p##name;           \
  _Pragma("GCC diagnostic pop")

namespace gradcomm::capi {

/// Says what the shim does with a call, at info level, once per process.
inline void noteOnce(int rank, const std::string& message) { logMessage(LogLevel::kInfo, rank, message, true); }

/// ncclInvalidArgument naming `argument`, as "ncclAllReduce: invalid argument 'root': ..."
ncclResult_t invalidArgument(const char* function, const char* argument, const std::string& why);

/// An argument error (last error set) unless `comm` is a live gradcomm
/// communicator; a failed one passes (for calls that work on those too).
ncclResult_t checkHandle(ncclComm_t comm, const char* function);
/// ncclSuccess when `comm` is a live gradcomm communicator that has not
/// failed; otherwise the error (an argument error for a null or stale
/// handle, the sticky failure for a failed one) with the last error set.
ncclResult_t checkComm(ncclComm_t comm, const char* function);

/// How an NCCL data type travels on host memory.
struct HostType {
  DataType type = DataType::kUInt8;
  size_t bytes = 1;           ///< element size
  bool reducible = true;      ///< false for fp8 (gradcomm has no fp8 arithmetic)
  bool isUnsigned = false;    ///< uint32/uint64, reduced as int32/int64
  bool isInteger = false;
};
/// Maps `type`; ncclInvalidArgument naming 'datatype' when it is unknown.
ncclResult_t hostType(ncclDataType_t type, const char* function, HostType* out);
/// Maps `op` for a reduction of `t`; ncclInvalidArgument naming 'op' when
/// gradcomm cannot run it on host memory.
ncclResult_t hostOp(ncclRedOp_t op, const HostType& t, ncclDataType_t type, const char* function, ReduceOp* out);
/// NCCL's name of a data type ("ncclFloat32").
const char* ncclTypeName(ncclDataType_t type);

/// True when the call touches device memory.
bool onDevice(const void* a, const void* b);
/// Whether a collective or point-to-point call on device memory goes to
/// the real NCCL (true) or to gradcomm's communicator, whose device path
/// serves it (false: this communicator has no real one). Logs the first of
/// each at info.
bool servedByRealNccl(ncclComm_t comm, const char* function);

}  // namespace gradcomm::capi
