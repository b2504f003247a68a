#pragma once
#include <string>

#include "base/params.hpp"

namespace gradcomm::core {

/// Process-wide threshold; set from GRADCOMM_LOG_LEVEL by each communicator.
void setLogLevel(LogLevel level);
bool logEnabled(LogLevel level);
/// "gradcomm[rank 3] warn: message" on stderr, one write per line.
void log(LogLevel level, int rank, const std::string& message);
/// Like log(), but prints a given message at most once per process.
void logOnce(LogLevel level, int rank, const std::string& message);

}  // namespace gradcomm::core
