#pragma once
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace gradcomm::core {

/// A Chrome trace (the JSON "traceEvents" format that Perfetto and
/// chrome://tracing open) of one rank. Thread-safe; flush() rewrites the
/// whole file, so it is valid JSON after every flush.
class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  /// Track ids: the caller's thread and the communication it waits for.
  static constexpr int kCompute = 0;
  static constexpr int kComm = 1;

  /// Writes to `path` (the caller picks a per-rank name).
  Timeline(std::string path, int rank);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// An instant event; `args` is a JSON object body such as "\"bytes\": 4".
  void instant(const std::string& name, const char* category, Clock::time_point t, int track,
               const std::string& args = {});
  /// A span from `start` to `end`.
  void span(const std::string& name, const char* category, Clock::time_point start, Clock::time_point end, int track,
            const std::string& args = {});
  void flush();
  const std::string& path() const { return path_; }

 private:
  double micros(Clock::time_point t) const;
  static std::string escape(const std::string& s);

  std::string path_;
  int rank_;
  Clock::time_point origin_;
  std::mutex mu_;
  std::vector<std::string> events_;
};

}  // namespace gradcomm::core
