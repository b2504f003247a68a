#pragma once
// GRADCOMM_CALIBRATE's value. It lives in the ground floor so the parameter
// registry can check it; topology/calibration.* acts on it.
#include <string>

namespace gradcomm::topology {

/// GRADCOMM_CALIBRATE: 0 (the default: MachineCosts::forHardware()), 1 (measure at
/// communicator creation), or a path (load it if it exists and was written
/// for this layout, else measure and write it).
struct CalibrationMode {
  enum class Kind { kOff, kRun, kFile };
  Kind kind = Kind::kOff;
  std::string path;
  /// Throws ConfigError for an empty value.
  static CalibrationMode parse(const std::string& value);
};

}  // namespace gradcomm::topology
