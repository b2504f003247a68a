#pragma once
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "gradcomm/export.hpp"

namespace gradcomm {

/// Where a parameter's value came from. Explicit options beat the
/// environment; the environment beats the default.
enum class ParamOrigin { kDefault, kEnvironment, kExplicit };

GRADCOMM_API const char* toString(ParamOrigin origin);

/// Severity of gradcomm's messages on stderr; GRADCOMM_LOG_LEVEL (error,
/// warn, info, debug) sets the threshold, warn by default.
enum class LogLevel { kError, kWarn, kInfo, kDebug };

/// Explicit parameter values, by name ("GRADCOMM_TIMEOUT" or "TIMEOUT").
/// Values use the same syntax as the environment ("25M", "300s").
class GRADCOMM_API Options {
 public:
  /// Sets a parameter; throws ConfigError for an unknown name (the message
  /// lists the known ones). The value is validated when the options are used.
  Options& set(const std::string& name, const std::string& value);
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

/// One parameter, as gradcomm-info prints it.
struct ParamDescription {
  std::string name;          ///< environment name, e.g. GRADCOMM_TIMEOUT
  std::string value;         ///< effective value, normalised
  std::string defaultValue;  ///< default, as written in the registry
  std::string units;         ///< e.g. "bytes (K/M/G suffix)"
  std::string doc;           ///< one line
  ParamOrigin origin;
};

/// Every registered parameter with its effective value and origin. Reads the
/// environment now; throws ConfigError for malformed values.
GRADCOMM_API std::vector<ParamDescription> describeParameters(const Options& explicitOptions = {});

/// The effective value of one parameter ("GRADCOMM_X" or "X"), normalised
/// as describeParameters() prints it. Throws ConfigError for an unknown name
/// or a malformed value.
GRADCOMM_API std::string parameterValue(const std::string& name, const Options& explicitOptions = {});

/// GRADCOMM_TIMEOUT as a duration (0: operations never time out). Throws
/// ConfigError for a malformed value.
GRADCOMM_API std::chrono::nanoseconds operationTimeout(const Options& explicitOptions = {});

/// Writes "gradcomm[rank R] LEVEL: message" (rank < 0: "gradcomm LEVEL:")
/// as one line on stderr when GRADCOMM_LOG_LEVEL lets `level` through, as
/// the library's own messages are; frontends (the NCCL-ABI library) say what
/// they do through it. With `once`, a message already written by this
/// process is not written again.
GRADCOMM_API void logMessage(LogLevel level, int rank, const std::string& message, bool once = false);

/// Build configuration: compiler, SIMD levels compiled in, and the versions of
/// MPI, CUDA, NCCL and UCX this library was built against ("no" when absent).
GRADCOMM_API std::vector<std::pair<std::string, std::string>> buildInfo();

}  // namespace gradcomm
