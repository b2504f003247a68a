#include "base/calibration_mode.hpp"

#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::topology {

CalibrationMode CalibrationMode::parse(const std::string& value) {
  const std::string v(core::trim(value));
  CalibrationMode m;
  if (v == "0" || core::toLower(v) == "off") m.kind = Kind::kOff;
  else if (v == "1" || core::toLower(v) == "on") m.kind = Kind::kRun;
  else if (v.empty()) throw ConfigError("GRADCOMM_CALIBRATE is empty: expected 0, 1 or a file path");
  else {
    m.kind = Kind::kFile;
    m.path = v;
  }
  return m;
}

}  // namespace gradcomm::topology
