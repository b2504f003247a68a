#pragma once
// NVIDIA's NCCL, opened with dlopen at run time (never linked), for the
// NCCL engine under the Communicator (device/collective_library.hpp) and
// for the NCCL-ABI library's forwarding of device calls. Opened with
// RTLD_DEEPBIND so that NCCL's calls to its own API stay inside it, and
// refused when the search path leads to gradcomm's NCCL-ABI library (which
// exports gradcommNcclAbiLibrary), e.g. installed as libnccl.so.2.
#include <string>

namespace gradcomm::device {

class NcclLibrary {
 public:
  /// The process's one instance; loads on first use. GRADCOMM_NCCL_LIB
  /// names the library (default libnccl.so.2, found by the loader's path).
  static NcclLibrary& instance();
  /// True when a real NCCL (not gradcomm's) was found and opened.
  bool available();
  /// Why it is unavailable ("" when it is available).
  std::string why();
  /// Its function `name`, or null when it is unavailable or lacks it.
  void* symbol(const char* name);
  /// Where it was loaded from.
  const std::string& path() const { return path_; }

  /// Typed lookup: `nccl.get<decltype(&ncclAllReduce)>("ncclAllReduce")`.
  template <typename Fn>
  Fn get(const char* name) {
    return reinterpret_cast<Fn>(symbol(name));
  }

 private:
  NcclLibrary() = default;
  void load();
  bool tried_ = false;
  void* handle_ = nullptr;
  std::string path_;
  std::string why_;
};

}  // namespace gradcomm::device
