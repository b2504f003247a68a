#include "core/timeline.hpp"

#include <cstdio>
#include <fstream>

#include "gradcomm/error.hpp"

namespace gradcomm::core {

Timeline::Timeline(std::string path, int rank) : path_(std::move(path)), rank_(rank), origin_(Clock::now()) {
  std::ofstream probe(path_);
  if (!probe) throw ConfigError("GRADCOMM_TIMELINE: cannot write '" + path_ + "' (does its directory exist?)");
  auto meta = [&](int tid, const char* name) {
    events_.push_back("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
                      ", \"tid\": " + std::to_string(tid) + ", \"args\": {\"name\": \"" + name + "\"}}");
  };
  events_.push_back("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
                    ", \"args\": {\"name\": \"rank " + std::to_string(rank_) + "\"}}");
  meta(kCompute, "compute (caller)");
  meta(kComm, "communication");
}

Timeline::~Timeline() {
  try {
    flush();
  } catch (...) {
  }
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

void Timeline::instant(const std::string& name, const char* category, Clock::time_point t, int track,
                       const std::string& args) {
  char head[160];
  std::snprintf(head, sizeof head, "\"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": %d", micros(t),
                rank_, track);
  std::string e = "{\"name\": \"" + escape(name) + "\", \"cat\": \"" + category + "\", " + head +
                  (args.empty() ? "" : ", \"args\": {" + args + "}") + "}";
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

void Timeline::span(const std::string& name, const char* category, Clock::time_point start, Clock::time_point end,
                    int track, const std::string& args) {
  char head[160];
  std::snprintf(head, sizeof head, "\"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                micros(start), micros(end) - micros(start), rank_, track);
  std::string e = "{\"name\": \"" + escape(name) + "\", \"cat\": \"" + category + "\", " + head +
                  (args.empty() ? "" : ", \"args\": {" + args + "}") + "}";
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  std::ofstream f(path_, std::ios::trunc);
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t i = 0; i < events_.size(); ++i) f << "  " << events_[i] << (i + 1 < events_.size() ? ",\n" : "\n");
  f << "]}\n";
}

}  // namespace gradcomm::core
