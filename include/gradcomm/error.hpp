#pragma once
#include <exception>
#include <stdexcept>
#include <string>

#include "gradcomm/export.hpp"

namespace gradcomm {

/// Error codes carried by every gradcomm::Error. The C API maps them onto
/// ncclResult_t-compatible return codes.
enum class ErrorCode : int {
  kInvalidArgument = 1,  ///< the caller passed something that cannot work
  kInvalidUsage,         ///< calls in the wrong order or on a destroyed object
  kUnsupported,          ///< valid request this build or transport cannot do
  kConfig,               ///< malformed or out-of-range parameter value
  kTimeout,              ///< no progress within GRADCOMM_TIMEOUT
  kMismatch,             ///< ranks issued different collectives
  kRemote,               ///< another rank failed and aborted the communicator
  kTransport,            ///< the transport (MPI, shared memory, ...) failed
  kInternal,             ///< a bug in gradcomm
  kDevice,               ///< the device runtime (CUDA) reported an error
};

GRADCOMM_API const char* toString(ErrorCode code);

/// Root of every exception gradcomm throws.
class GRADCOMM_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define GRADCOMM_DECLARE_ERROR(Name, Code)                                     \
  class GRADCOMM_API Name : public Error {                                     \
   public:                                                                     \
    explicit Name(const std::string& message) : Error(ErrorCode::Code, message) {} \
  }

GRADCOMM_DECLARE_ERROR(InvalidArgument, kInvalidArgument);
GRADCOMM_DECLARE_ERROR(InvalidUsage, kInvalidUsage);
GRADCOMM_DECLARE_ERROR(UnsupportedError, kUnsupported);
GRADCOMM_DECLARE_ERROR(ConfigError, kConfig);
GRADCOMM_DECLARE_ERROR(TimeoutError, kTimeout);
GRADCOMM_DECLARE_ERROR(MismatchError, kMismatch);
GRADCOMM_DECLARE_ERROR(RemoteError, kRemote);
GRADCOMM_DECLARE_ERROR(TransportError, kTransport);
GRADCOMM_DECLARE_ERROR(InternalError, kInternal);
GRADCOMM_DECLARE_ERROR(DeviceError, kDevice);

#undef GRADCOMM_DECLARE_ERROR

/// Throws the Error subclass that belongs to `code`.
[[noreturn]] GRADCOMM_API void rethrowAs(ErrorCode code, const std::string& message);
/// An exception_ptr holding the Error subclass that belongs to `code`.
GRADCOMM_API std::exception_ptr makeErrorPtr(ErrorCode code, const std::string& message);

}  // namespace gradcomm
