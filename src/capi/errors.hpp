#pragma once
// ncclResult_t codes and the last-error string of the NCCL-ABI library.
#include <nccl.h>

#include <new>
#include <stdexcept>
#include <string>

#include "gradcomm/error.hpp"

namespace gradcomm::capi {

/// Remembers `message` as the text ncclGetLastError returns (per thread, as
/// the error belongs to the call that failed) and returns `result`.
ncclResult_t fail(ncclResult_t result, const std::string& message);
/// The last error recorded on this thread ("" when none).
const char* lastError();

/// The ncclResult_t of a gradcomm error: a dead or failed peer is
/// ncclRemoteError, bad arguments ncclInvalidArgument, calls in the wrong
/// order or that this build cannot serve ncclInvalidUsage.
ncclResult_t resultOf(ErrorCode code);

/// An NCCL result and its message, for failures that must cross code that
/// reports by exception (guarded() returns the result as it is).
class NcclError : public std::runtime_error {
 public:
  NcclError(ncclResult_t result, const std::string& message) : std::runtime_error(message), result_(result) {}
  ncclResult_t result() const { return result_; }

 private:
  ncclResult_t result_;
};

/// Runs `body` (which returns an ncclResult_t) and turns every exception
/// into an NCCL result with a last-error string prefixed with `function`:
/// nothing may escape into C callers.
template <typename F>
ncclResult_t guarded(const char* function, F&& body) noexcept {
  try {
    return body();
  } catch (const Error& e) {
    return fail(resultOf(e.code()), std::string(function) + ": " + e.what());
  } catch (const NcclError& e) {
    return fail(e.result(), std::string(function) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(ncclSystemError, std::string(function) + ": out of host memory");
  } catch (const std::exception& e) {
    return fail(ncclInternalError, std::string(function) + ": " + e.what());
  } catch (...) {
    return fail(ncclInternalError, std::string(function) + ": unknown exception");
  }
}

}  // namespace gradcomm::capi
