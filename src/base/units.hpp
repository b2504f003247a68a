#pragma once
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace gradcomm::core {

/// "4096", "64K", "25M", "1G", "2GiB", "512KB": binary multiples. Throws
/// ConfigError naming `what` when malformed or out of range.
size_t parseBytes(std::string_view text, std::string_view what);
/// "300s", "1.5s", "20ms", "500us", "2m", "1h"; a bare number means seconds.
std::chrono::nanoseconds parseDuration(std::string_view text, std::string_view what);
/// "1", "0", "true", "false", "on", "off", "yes", "no".
bool parseBool(std::string_view text, std::string_view what);
long long parseInteger(std::string_view text, std::string_view what, long long lo, long long hi);

/// Shortest exact rendering: 26214400 -> "25M", 1000 -> "1000".
std::string formatBytes(size_t bytes);
std::string formatDuration(std::chrono::nanoseconds d);

std::string toLower(std::string_view s);
std::string_view trim(std::string_view s);

}  // namespace gradcomm::core
