#include "device/nccl_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "base/log.hpp"

namespace gradcomm::device {
namespace {

std::mutex loadMu;

}  // namespace

NcclLibrary& NcclLibrary::instance() {
  // Never destroyed: C callers may still call in from their own exit handlers.
  static NcclLibrary* real = new NcclLibrary();
  return *real;
}

void NcclLibrary::load() {
  const char* env = std::getenv("GRADCOMM_NCCL_LIB");
  path_ = env && *env ? env : "libnccl.so.2";
  int flags = RTLD_NOW | RTLD_LOCAL;
#ifdef RTLD_DEEPBIND
  flags |= RTLD_DEEPBIND;
#endif
  dlerror();
  void* h = dlopen(path_.c_str(), flags);
  if (!h) {
    const char* err = dlerror();
    why_ = "no real NCCL could be opened (" + path_ + ": " + (err ? err : "unknown error") +
           "); set GRADCOMM_NCCL_LIB to the path of NVIDIA's libnccl.so.2";
    return;
  }
  void* probe = dlsym(h, "ncclGetVersion");
  if (!probe) {
    why_ = path_ + " exports no ncclGetVersion: it is not NCCL; set GRADCOMM_NCCL_LIB to NVIDIA's libnccl.so.2";
    dlclose(h);
    return;
  }
  // The search path may lead back to gradcomm's NCCL-ABI library (installed
  // or symlinked as libnccl.so.2, or preloaded): forwarding to it would come
  // back round through gradcomm. It says what it is with one exported symbol.
  if (dlsym(h, "gradcommNcclAbiLibrary")) {
    why_ = path_ + " is gradcomm's own NCCL library, not the real NCCL; set GRADCOMM_NCCL_LIB to NVIDIA's libnccl.so.2";
    dlclose(h);
    return;
  }
  handle_ = h;
  Dl_info info{};
  if (dladdr(probe, &info) && info.dli_fname) path_ = info.dli_fname;
}

bool NcclLibrary::available() {
  std::lock_guard<std::mutex> lock(loadMu);
  if (!tried_) {
    tried_ = true;
    load();
    if (handle_) {
      core::logOnce(core::LogLevel::kInfo, -1, "NCCL: opened " + path_);
    } else {
      core::logOnce(core::LogLevel::kInfo, -1, "NCCL: " + why_);
    }
  }
  return handle_ != nullptr;
}

std::string NcclLibrary::why() {
  available();
  std::lock_guard<std::mutex> lock(loadMu);
  return why_;
}

void* NcclLibrary::symbol(const char* name) {
  if (!available()) return nullptr;
  return dlsym(handle_, name);
}

}  // namespace gradcomm::device
