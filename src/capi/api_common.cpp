#include "capi/api_common.hpp"

#include "capi/cuda_probe.hpp"

namespace gradcomm::capi {

ncclResult_t invalidArgument(const char* function, const char* argument, const std::string& why) {
  return fail(ncclInvalidArgument, std::string(function) + ": invalid argument '" + argument + "': " + why);
}

ncclResult_t abortedCall(const char* function) {
  return fail(ncclInternalError, std::string(function) + ": the communicator was aborted (ncclCommAbort or "
                                                          "ncclCommDestroy on another thread) during this call");
}

ncclResult_t checkHandle(ncclComm_t comm, const char* function) {
  if (!comm) return invalidArgument(function, "comm", "the communicator is NULL");
  if (comm->magic != ncclComm::kMagic) {
    return invalidArgument(function, "comm", "not a live gradcomm communicator (destroyed, or never created)");
  }
  return ncclSuccess;
}

ncclResult_t checkComm(ncclComm_t comm, const char* function) {
  if (const ncclResult_t r = checkHandle(comm, function); r != ncclSuccess) return r;
  const int failed = comm->asyncError.load();
  if (failed != ncclSuccess) {
    std::lock_guard<std::mutex> lock(comm->errorMu);
    return fail(static_cast<ncclResult_t>(failed),
                std::string(function) + ": the communicator failed earlier: " + comm->asyncMessage);
  }
  return ncclSuccess;
}

const char* ncclTypeName(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclFloat8e4m3: return "ncclFloat8e4m3";
    case ncclFloat8e5m2: return "ncclFloat8e5m2";
    default: return "unknown";
  }
}

ncclResult_t hostType(ncclDataType_t type, const char* function, HostType* t) {
  *t = HostType{};
  switch (type) {
    case ncclInt8: *t = {DataType::kInt8, 1, true, false, true}; break;
    case ncclUint8: *t = {DataType::kUInt8, 1, true, false, true}; break;
    case ncclInt32: *t = {DataType::kInt32, 4, true, false, true}; break;
    case ncclUint32: *t = {DataType::kInt32, 4, true, true, true}; break;
    case ncclInt64: *t = {DataType::kInt64, 8, true, false, true}; break;
    case ncclUint64: *t = {DataType::kInt64, 8, true, true, true}; break;
    case ncclFloat16: *t = {DataType::kFloat16, 2, true, false, false}; break;
    case ncclFloat32: *t = {DataType::kFloat32, 4, true, false, false}; break;
    case ncclFloat64: *t = {DataType::kFloat64, 8, true, false, false}; break;
    case ncclBfloat16: *t = {DataType::kBFloat16, 2, true, false, false}; break;
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: *t = {DataType::kUInt8, 1, false, false, false}; break;
    default:
      return invalidArgument(function, "datatype",
                             std::to_string(static_cast<int>(type)) + " is not an ncclDataType_t (0 to " +
                                 std::to_string(ncclNumTypes - 1) + ")");
  }
  return ncclSuccess;
}

ncclResult_t hostOp(ncclRedOp_t op, const HostType& t, ncclDataType_t type, const char* function, ReduceOp* out) {
  const int v = static_cast<int>(op);
  if (v < 0) return invalidArgument(function, "op", std::to_string(v) + " is not an ncclRedOp_t");
  if (v >= ncclNumOps) {
    return invalidArgument(function, "op",
                           std::to_string(v) + " is not a built-in ncclRedOp_t: custom reduction operators "
                           "(ncclRedOpCreatePreMulSum) work only on device buffers, through the real NCCL");
  }
  if (!t.reducible) {
    return invalidArgument(function, "datatype",
                           std::string(ncclTypeName(type)) + " cannot be reduced on host memory (gradcomm has "
                           "no fp8 arithmetic); it can be broadcast, gathered and sent");
  }
  switch (op) {
    case ncclSum: *out = ReduceOp::kSum; break;
    case ncclProd: *out = ReduceOp::kProd; break;
    case ncclMax: *out = ReduceOp::kMax; break;
    case ncclMin: *out = ReduceOp::kMin; break;
    default:
      if (t.isInteger) {
        return invalidArgument(function, "op",
                               std::string("ncclAvg on ") + ncclTypeName(type) +
                                   " is not supported by gradcomm on host memory: use ncclSum and divide");
      }
      *out = ReduceOp::kAvg;
  }
  return ncclSuccess;
}

bool onDevice(const void* a, const void* b) {
  if (!cudaUsable()) return false;
  return isDeviceMemory(a) || isDeviceMemory(b);
}

bool servedByRealNccl(ncclComm_t comm, const char* function) {
  if (comm->real) {
    noteOnce(comm->rank,
                  std::string("NCCL shim: ") + function + " on device memory forwarded to the real NCCL");
    return true;
  }
  noteOnce(comm->rank,
                std::string("NCCL shim: ") + function + " on device memory served by gradcomm (no real NCCL "
                "communicator: " + comm->realWhy + ")");
  return false;
}

}  // namespace gradcomm::capi
