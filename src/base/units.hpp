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
/// A link rate in bits per second, as tc writes it: "1gbit", "25gbit",
/// "400mbit", "100kbit", "1000000bit" or a bare number of bits per second
/// (decimal multiples). Throws ConfigError naming `what` when malformed.
double parseBitRate(std::string_view text, std::string_view what);
/// 1e9 -> "1gbit", 2.5e10 -> "25gbit", 0 -> "0".
std::string formatBitRate(double bitsPerSecond);

/// Shortest exact rendering: 26214400 -> "25M", 1000 -> "1000".
std::string formatBytes(size_t bytes);
std::string formatDuration(std::chrono::nanoseconds d);
/// A measured time for messages, one decimal: 1.25 s -> "1.2s".
std::string formatSeconds(std::chrono::nanoseconds d);

std::string toLower(std::string_view s);
/// An errno's text; thread-safe, unlike strerror.
std::string errnoText(int err);
std::string_view trim(std::string_view s);

}  // namespace gradcomm::core
