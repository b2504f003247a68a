#pragma once
// GRADCOMM_CALIBRATE's value. It lives in the ground floor so the parameter
// registry can check it; topology/calibration.* acts on it.
#include <string>

namespace gradcomm::topology {

/// GRADCOMM_CALIBRATE: 0 (the default: MachineCosts::forHardware()), 1 (measure at
/// communicator creation), or a path (load it where it was written for this
/// layout; gradcomm-bench --calibrate FILE writes one).
struct CalibrationMode {
  enum class Kind { kOff, kRun, kFile };
  Kind kind = Kind::kOff;
  std::string path;
  /// Throws ConfigError for an empty value.
  static CalibrationMode parse(const std::string& value);
};

}  // namespace gradcomm::topology
