#include "base/units.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <system_error>

#include "gradcomm/error.hpp"

namespace gradcomm::core {

std::string toLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

namespace {

[[noreturn]] void fail(std::string_view what, std::string_view text, std::string_view expected) {
  throw ConfigError(std::string(what) + "='" + std::string(text) + "' is malformed: expected " +
                    std::string(expected));
}

// Splits "12.5ms" into 12.5 and "ms". Returns false when no number leads.
bool splitNumber(std::string_view text, double& number, std::string& suffix) {
  std::string s(trim(text));
  if (s.empty()) return false;
  const char* begin = s.c_str();
  char* end = nullptr;
  number = std::strtod(begin, &end);
  if (end == begin) return false;
  // strtod accepts "inf", "nan" and hex; insist on a plain decimal number.
  for (const char* p = begin; p != end; ++p) {
    if (!std::isdigit(static_cast<unsigned char>(*p)) && *p != '.' && *p != '+' && *p != '-') {
      return false;
    }
  }
  suffix = toLower(trim(std::string_view(end)));
  return true;
}

}  // namespace

double parseBitRate(std::string_view text, std::string_view what) {
  static constexpr const char* kExpected =
      "a link rate such as 1gbit, 25gbit or 400mbit (tc's units: bit, kbit, mbit, gbit, tbit; a bare number is "
      "bits per second)";
  double number = 0;
  std::string suffix;
  if (!splitNumber(text, number, suffix) || number < 0) fail(what, text, kExpected);
  const std::pair<const char*, double> units[] = {{"", 1}, {"bit", 1}, {"kbit", 1e3}, {"mbit", 1e6},
                                                  {"gbit", 1e9}, {"tbit", 1e12}};
  for (const auto& [name, multiplier] : units) {
    if (suffix == name) {
      const double bits = number * multiplier;
      if (bits > 1e15) fail(what, text, "a rate of at most 1000tbit");
      return bits;
    }
  }
  fail(what, text, kExpected);
}

std::string formatBitRate(double bitsPerSecond) {
  const std::pair<const char*, double> units[] = {{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"", 1}};
  const auto* unit = &units[4];
  for (const auto& u : units) {
    if (bitsPerSecond >= u.second) {
      unit = &u;
      break;
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g%s", bitsPerSecond / unit->second, unit->first);
  return buf;
}

size_t parseBytes(std::string_view text, std::string_view what) {
  static constexpr const char* kExpected =
      "a byte count such as 4096, 64K, 25M or 1G (binary multiples; optional B or iB)";
  double number = 0;
  std::string suffix;
  if (!splitNumber(text, number, suffix) || number < 0) fail(what, text, kExpected);
  double multiplier = 1;
  std::string unit = suffix;
  if (unit.size() >= 3 && unit.compare(unit.size() - 2, 2, "ib") == 0) {
    unit.resize(unit.size() - 2);
  } else if (unit.size() >= 2 && unit.back() == 'b') {
    unit.pop_back();
  } else if (unit == "b") {
    unit.clear();
  }
  if (unit.empty()) {
    multiplier = 1;
  } else if (unit == "k") {
    multiplier = 1024.0;
  } else if (unit == "m") {
    multiplier = 1024.0 * 1024;
  } else if (unit == "g") {
    multiplier = 1024.0 * 1024 * 1024;
  } else if (unit == "t") {
    multiplier = 1024.0 * 1024 * 1024 * 1024;
  } else {
    fail(what, text, kExpected);
  }
  double bytes = number * multiplier;
  if (bytes != std::floor(bytes)) fail(what, text, "a whole number of bytes");
  if (bytes > static_cast<double>(std::numeric_limits<size_t>::max() / 2)) {
    fail(what, text, "a byte count below 2^63");
  }
  return static_cast<size_t>(bytes);
}

std::chrono::nanoseconds parseDuration(std::string_view text, std::string_view what) {
  static constexpr const char* kExpected =
      "a duration such as 300s, 1.5s, 20ms, 500us, 2m or 1h (a bare number means seconds)";
  double number = 0;
  std::string suffix;
  if (!splitNumber(text, number, suffix) || number < 0) fail(what, text, kExpected);
  double ns = 0;
  if (suffix.empty() || suffix == "s" || suffix == "sec") {
    ns = number * 1e9;
  } else if (suffix == "ms") {
    ns = number * 1e6;
  } else if (suffix == "us") {
    ns = number * 1e3;
  } else if (suffix == "ns") {
    ns = number;
  } else if (suffix == "m" || suffix == "min") {
    ns = number * 60e9;
  } else if (suffix == "h") {
    ns = number * 3600e9;
  } else {
    fail(what, text, kExpected);
  }
  if (ns > 1e18) fail(what, text, "a duration below 30 years");
  return std::chrono::nanoseconds(static_cast<long long>(ns));
}

bool parseBool(std::string_view text, std::string_view what) {
  std::string s = toLower(trim(text));
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  fail(what, text, "one of 1, 0, true, false, on, off, yes, no");
}

long long parseInteger(std::string_view text, std::string_view what, long long lo, long long hi) {
  std::string s(trim(text));
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0) fail(what, text, "an integer");
  if (v < lo || v > hi) {
    fail(what, text, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v;
}

std::string formatBytes(size_t bytes) {
  static const char* kUnits[] = {"", "K", "M", "G", "T"};
  int unit = 0;
  while (unit < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kUnits[unit];
}

std::string formatSeconds(std::chrono::nanoseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", std::chrono::duration<double>(d).count());
  return buf;
}

std::string formatDuration(std::chrono::nanoseconds d) {
  long long ns = d.count();
  if (ns == 0) return "0s";
  if (ns % 1000000000LL == 0) return std::to_string(ns / 1000000000LL) + "s";
  if (ns != 0 && ns % 1000000LL == 0) return std::to_string(ns / 1000000LL) + "ms";
  if (ns != 0 && ns % 1000LL == 0) return std::to_string(ns / 1000LL) + "us";
  return std::to_string(ns) + "ns";
}

std::string errnoText(int err) { return std::generic_category().message(err); }

}  // namespace gradcomm::core
