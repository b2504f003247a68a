#pragma once
#include <string>

namespace gradcomm::testing {

/// Whether `s` holds `part` (error messages in expectations).
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace gradcomm::testing
