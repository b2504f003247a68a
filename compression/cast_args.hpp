#pragma once
// Argument checks shared by the CPU and CUDA casts, so that both reject the
// same inputs with the same messages.
#include <cmath>
#include <string>

#include "gradcomm/error.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm::compression::detail {

/// True for float16, false for bfloat16; any other target type is an
/// InvalidArgument naming `what`.
inline bool castTargetIsFp16(DataType type, const char* what) {
  if (type == DataType::kFloat16) return true;
  if (type == DataType::kBFloat16) return false;
  throw InvalidArgument(std::string(what) + ": compression casts produce float16 or bfloat16, not " +
                        toString(type));
}

/// A pre-scaling factor must be finite and positive.
inline void checkCastScale(float scale, const char* what) {
  if (!(std::isfinite(scale) && scale > 0.0f)) {
    throw InvalidArgument(std::string(what) + ": scale " + std::to_string(scale) +
                          " must be finite and > 0 (use 1 for no pre-scaling, 1/ranks for an average)");
  }
}

}  // namespace gradcomm::compression::detail
