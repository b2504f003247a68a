#pragma once
// The real NCCL, opened with dlopen for what gradcomm does not serve itself
// (device buffers). Opened with RTLD_DEEPBIND so that its calls to its own
// API stay inside it instead of landing back in this library.
#include <string>

namespace gradcomm::capi {

class RealNccl {
 public:
  /// The process's one instance; loads on first use.
  static RealNccl& instance();
  /// True when a real NCCL (not this library) was found and opened.
  bool available();
  /// Why it is unavailable ("" when it is available).
  std::string why();
  /// Its function `name`, or null when it is unavailable or lacks it.
  void* symbol(const char* name);
  /// Where it was loaded from.
  const std::string& path() const { return path_; }

  /// Typed lookup: `real.get<decltype(&ncclAllReduce)>("ncclAllReduce")`.
  template <typename Fn>
  Fn get(const char* name) {
    return reinterpret_cast<Fn>(symbol(name));
  }

 private:
  RealNccl() = default;
  void load();
  bool tried_ = false;
  void* handle_ = nullptr;
  std::string path_;
  std::string why_;
};

}  // namespace gradcomm::capi
