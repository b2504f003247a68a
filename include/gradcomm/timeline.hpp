#pragma once
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "gradcomm/export.hpp"

namespace gradcomm {

/// A Chrome trace (the JSON "traceEvents" format that Perfetto and
/// chrome://tracing open) of one rank, streamed to its file. Events collect
/// in a bounded buffer and are appended at flush() (or when the buffer
/// fills): constant cost per event, bounded memory, and after every flush
/// the file is valid JSON (the closing brackets are rewritten after the
/// last event), so a process that dies leaves a readable trace. Thread-safe.
/// GRADCOMM_TIMELINE writes one per rank for the library's own operations
/// (the Reducer's, the PyTorch backend's calls); a frontend or application
/// may record its own events the same way.
class GRADCOMM_API Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  /// Track ids: the caller's thread and the communication it waits for.
  static constexpr int kCompute = 0;
  static constexpr int kComm = 1;
  /// Buffered bytes that trigger a write without waiting for flush().
  static constexpr size_t kBufferBytes = 1 << 20;

  /// Writes to `path` (the caller picks a per-rank name); ConfigError when
  /// it cannot be written.
  Timeline(std::string path, int rank);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// The rank's file for a trace path naming all ranks: "trace.json" ->
  /// "trace.rank3.json" (".rank3.json" is appended to other names).
  static std::string perRankPath(const std::string& base, int rank);

  /// Time zero of the trace. Ranks that set it right after a collective
  /// they all took part in share (to within that collective's skew) one
  /// time axis, so their traces line up when merged. Default: construction.
  void setOrigin(Clock::time_point origin);
  /// An instant event; `args` is a JSON object body such as "\"bytes\": 4".
  void instant(const std::string& name, const char* category, Clock::time_point t, int track,
               const std::string& args = {});
  /// A span from `start` to `end`.
  void span(const std::string& name, const char* category, Clock::time_point start, Clock::time_point end, int track,
            const std::string& args = {});
  /// Appends the buffered events to the file (which stays valid JSON).
  void flush();
  const std::string& path() const { return path_; }

 private:
  double micros(Clock::time_point t) const;
  static std::string escape(const std::string& s);
  void add(std::string event);
  void writeLocked();  // requires mu_

  std::string path_;
  int rank_;
  Clock::time_point origin_;
  std::mutex mu_;
  std::FILE* file_ = nullptr;
  long tail_ = 0;            // file offset where the closing brackets start
  std::string buffer_;       // events not yet written, each preceded by ",\n"
};

}  // namespace gradcomm
