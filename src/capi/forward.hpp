#pragma once
// Calling into the real NCCL.
#include <nccl.h>

#include <string>

#include "capi/errors.hpp"
#include "capi/real_nccl.hpp"

namespace gradcomm::capi {

/// Turns the real NCCL's result into ours: on failure the last error is
/// the real NCCL's, prefixed with `function`.
ncclResult_t fromReal(const char* function, ncclResult_t result);
/// ncclInvalidUsage: the real NCCL (or its function `function`) is missing.
ncclResult_t realMissing(const char* function);
/// The real NCCL's `f` called with `args` (its result made ours), or
/// realMissing() where it has no such function.
template <class F, class... Args>
ncclResult_t callReal(const char* function, F f, Args... args) {
  return f ? fromReal(function, f(args...)) : realMissing(function);
}

}  // namespace gradcomm::capi

/// The real NCCL's `name` (a function pointer of its own type, or null),
/// looked up once per call site.
#define GRADCOMM_REAL(name)                                                               \
  ([]() {                                                                                 \
    static const auto fn = ::gradcomm::capi::realNccl<decltype(&name)>(#name);                  \
    return fn;                                                                            \
  }())
