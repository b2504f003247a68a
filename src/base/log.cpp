#include "base/log.hpp"

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>

namespace gradcomm::core {
namespace {
std::atomic<int> gLevel{static_cast<int>(LogLevel::kWarn)};
const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}
}  // namespace

void setLogLevel(LogLevel level) { gLevel.store(static_cast<int>(level)); }

bool logEnabled(LogLevel level) { return static_cast<int>(level) <= gLevel.load(); }

void log(LogLevel level, int rank, const std::string& message) {
  if (!logEnabled(level)) return;
  // Rank -1: said before a communicator exists (configuration, the store).
  std::string line = (rank < 0 ? std::string("gradcomm ") : "gradcomm[rank " + std::to_string(rank) + "] ") +
                     levelName(level) + ": " + message + "\n";
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

void logOnce(LogLevel level, int rank, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert(message).second) return;
  }
  log(level, rank, message);
}

}  // namespace gradcomm::core

namespace gradcomm {

void logMessage(LogLevel level, int rank, const std::string& message, bool once) {
  if (once) {
    core::logOnce(level, rank, message);
  } else {
    core::log(level, rank, message);
  }
}

}  // namespace gradcomm
