#pragma once
#include <map>
#include <string>
#include <vector>

#include "gradcomm/export.hpp"

namespace gradcomm {

/// Where a parameter's value came from. Explicit options beat the
/// environment; the environment beats the default.
enum class ParamOrigin { kDefault, kEnvironment, kExplicit };

GRADCOMM_API const char* toString(ParamOrigin origin);

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

/// Build configuration: compiler, SIMD levels compiled in, and the versions of
/// MPI, CUDA, NCCL and UCX this library was built against ("no" when absent).
GRADCOMM_API std::vector<std::pair<std::string, std::string>> buildInfo();

}  // namespace gradcomm
