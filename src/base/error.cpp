#include "gradcomm/error.hpp"

namespace gradcomm {

const char* toString(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kInvalidUsage: return "invalid usage";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kConfig: return "configuration error";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kMismatch: return "mismatched collective";
    case ErrorCode::kRemote: return "remote failure";
    case ErrorCode::kTransport: return "transport error";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kDevice: return "device error";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}

void rethrowAs(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kInvalidArgument: throw InvalidArgument(message);
    case ErrorCode::kInvalidUsage: throw InvalidUsage(message);
    case ErrorCode::kUnsupported: throw UnsupportedError(message);
    case ErrorCode::kConfig: throw ConfigError(message);
    case ErrorCode::kTimeout: throw TimeoutError(message);
    case ErrorCode::kMismatch: throw MismatchError(message);
    case ErrorCode::kRemote: throw RemoteError(message);
    case ErrorCode::kTransport: throw TransportError(message);
    case ErrorCode::kInternal: throw InternalError(message);
    case ErrorCode::kDevice: throw DeviceError(message);
  }
  throw Error(code, message);
}

std::exception_ptr makeErrorPtr(ErrorCode code, const std::string& message) {
  try {
    rethrowAs(code, message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace gradcomm
