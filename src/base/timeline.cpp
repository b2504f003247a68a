#include "base/timeline.hpp"

#include <cerrno>

#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm {
namespace {
constexpr const char* kClose = "\n]}\n";
}

Timeline::Timeline(std::string path, int rank) : path_(std::move(path)), rank_(rank), origin_(Clock::now()) {
  file_ = std::fopen(path_.c_str(), "w");
  if (!file_) {
    throw ConfigError("GRADCOMM_TIMELINE: cannot write '" + path_ + "': " + core::errnoText(errno) +
                      " (does its directory exist?)");
  }
  const std::string pid = std::to_string(rank_);
  std::string head = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n  {\"name\": \"process_name\", \"ph\": \"M\", "
                     "\"pid\": " + pid + ", \"args\": {\"name\": \"rank " + pid + "\"}}";
  std::fputs(head.c_str(), file_);
  tail_ = std::ftell(file_);
  std::fputs(kClose, file_);
  std::fflush(file_);
  auto meta = [&](int tid, const char* name) {
    add("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid + ", \"tid\": " + std::to_string(tid) +
        ", \"args\": {\"name\": \"" + name + "\"}}");
  };
  meta(kCompute, "compute (caller)");
  meta(kComm, "communication");
  flush();
}

std::string Timeline::perRankPath(const std::string& base, int rank) {
  const std::string tag = ".rank" + std::to_string(rank);
  auto dot = base.rfind(".json");
  if (dot != std::string::npos && dot + 5 == base.size()) return base.substr(0, dot) + tag + ".json";
  return base + tag + ".json";
}

Timeline::~Timeline() {
  try {
    flush();
  } catch (...) {
  }
  if (file_) std::fclose(file_);
}

void Timeline::setOrigin(Clock::time_point origin) {
  std::lock_guard<std::mutex> lock(mu_);
  origin_ = origin;
}

double Timeline::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

std::string Timeline::escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

void Timeline::add(std::string event) {
  std::lock_guard<std::mutex> lock(mu_);
  buffer_ += ",\n  ";
  buffer_ += event;
  if (buffer_.size() >= kBufferBytes) writeLocked();
}

void Timeline::instant(const std::string& name, const char* category, Clock::time_point t, int track,
                       const std::string& args) {
  char head[160];
  std::snprintf(head, sizeof head, "\"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": %d", micros(t),
                rank_, track);
  add("{\"name\": \"" + escape(name) + "\", \"cat\": \"" + category + "\", " + head +
      (args.empty() ? "" : ", \"args\": {" + args + "}") + "}");
}

void Timeline::span(const std::string& name, const char* category, Clock::time_point start, Clock::time_point end,
                    int track, const std::string& args) {
  char head[160];
  std::snprintf(head, sizeof head, "\"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                micros(start), micros(end) - micros(start), rank_, track);
  add("{\"name\": \"" + escape(name) + "\", \"cat\": \"" + category + "\", " + head +
      (args.empty() ? "" : ", \"args\": {" + args + "}") + "}");
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  writeLocked();
}

void Timeline::writeLocked() {
  if (!file_ || buffer_.empty()) return;
  // Over the old closing brackets: the events, then the brackets again.
  std::fseek(file_, tail_, SEEK_SET);
  std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  tail_ = std::ftell(file_);
  std::fputs(kClose, file_);
  std::fflush(file_);
  buffer_.clear();
}

}  // namespace gradcomm
