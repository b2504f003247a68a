#pragma once
// How the benchmark tools read their arguments: an option walk, numbers
// that must be whole (atoi took "5x" as 5), and a check that a results file
// can be written. No MPI, no communicator: the GPU tool uses it too.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace gradcomm::bench {

/// Walks a tool's options:
///   for (bench::ArgWalk w(argc, argv, die); w.next();) {
///     if (w.key() == "--steps") a.steps = parse(w.value()); ...
/// value() takes the option's value, and dies with "option K needs a value"
/// when there is none.
class ArgWalk {
 public:
  ArgWalk(int argc, char** argv, void (*die)(const std::string&)) : argc_(argc), argv_(argv), die_(die) {}
  /// Moves to the next option; false after the last.
  bool next() {
    if (++i_ >= argc_) return false;
    key_ = argv_[i_];
    return true;
  }
  const std::string& key() const { return key_; }
  std::string value() {
    if (i_ + 1 >= argc_) die_("option " + key_ + " needs a value");
    return argv_[++i_];
  }

 private:
  int argc_;
  char** argv_;
  void (*die_)(const std::string&);
  int i_ = 0;
  std::string key_;
};

/// All of `text` as a whole number in [lo, hi] (atoi took "5x" as 5 and
/// "abc" as 0), or nothing.
inline std::optional<long long> wholeNumber(const std::string& text, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) return std::nullopt;
  return v;
}

/// All of `text` as a whole number in [lo, hi]; else `die`s naming the
/// option (`what`), the range and the text.
inline long long wholeNumberOr(const std::string& text, const std::string& what, long long lo, long long hi,
                               void (*die)(const std::string&)) {
  const auto v = wholeNumber(text, lo, hi);
  if (!v) {
    die(what + " must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" +
        text + "'");
  }
  return *v;
}

/// All of `text` as a finite number, or nothing.
inline std::optional<double> realNumber(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// Empty, or why `path` cannot be written: checked before a run, so that
/// results are not measured only to be lost.
inline std::string unwritable(const std::string& path) {
  struct stat st;
  const bool existed = ::stat(path.c_str(), &st) == 0;
  FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return "cannot write '" + path + "': " + std::strerror(errno);
  std::fclose(f);
  if (!existed) ::unlink(path.c_str());
  return {};
}

}  // namespace gradcomm::bench
