#include "capi/errors.hpp"

namespace gradcomm::capi {
namespace {
thread_local std::string lastErrorText;
}  // namespace

ncclResult_t fail(ncclResult_t result, const std::string& message) {
  try {
    lastErrorText = message;
  } catch (...) {
    // Out of memory while recording the error: the code still says what happened.
  }
  return result;
}

const char* lastError() { return lastErrorText.c_str(); }

ncclResult_t resultOf(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kConfig:
      return ncclInvalidArgument;
    case ErrorCode::kInvalidUsage:
    case ErrorCode::kUnsupported:
    case ErrorCode::kMismatch:
      return ncclInvalidUsage;
    case ErrorCode::kTimeout:
    case ErrorCode::kRemote:
    case ErrorCode::kTransport:
      return ncclRemoteError;
    case ErrorCode::kInternal:
      return ncclInternalError;
    case ErrorCode::kDevice:
      return ncclUnhandledCudaError;
  }
  return ncclInternalError;
}

}  // namespace gradcomm::capi

/// gradcomm's NCCL loader refuses any library that exports this symbol, so
/// it never takes this one, installed or linked as libnccl.so.2, for NVIDIA's.
extern "C" __attribute__((visibility("default"))) const int gradcommNcclAbiLibrary = 1;
