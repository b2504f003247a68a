#include "capi/real_init.hpp"

#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "capi/cuda_probe.hpp"
#include "capi/forward.hpp"

namespace gradcomm::capi {
namespace {

std::mutex hooksMu;

std::shared_ptr<const RealInitHooks>& current() {
  static auto* hooks = new std::shared_ptr<const RealInitHooks>(std::make_shared<RealInitHooks>(defaultRealInitHooks()));
  return *hooks;
}

}  // namespace

RealInitHooks defaultRealInitHooks() {
  RealInitHooks h;
  h.unusable = []() -> std::string {
    if (!cudaUsable()) return "no CUDA device works in this process";
    if (!nccl::available()) return nccl::unavailableReason();
    return {};
  };
  h.currentDevice = []() -> int {
    int device = -1;
    if (!cudaUsable() || cudaGetDevice(&device) != cudaSuccess) return -1;
    return device;
  };
  h.selectDevice = [](int device) -> ncclResult_t {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    const cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return fail(ncclUnhandledCudaError, "cudaSetDevice(" + std::to_string(device) + ") failed: " +
                                              cudaGetErrorString(err));
    }
    if (previous >= 0 && previous != device) cudaSetDevice(previous);
    return ncclSuccess;
  };
  h.deviceIdentity = [](int device) -> std::string {
    // As NCCL tells GPUs apart: the host (its kernel's boot id, the same in
    // every container on it) and the GPU's PCI bus id (the same for every
    // MIG instance of one GPU, which NCCL refuses to share too).
    char bus[64] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string boot;
    if (!std::getline(f, boot) || boot.empty()) return {};
    return "bus " + std::string(bus) + " of host " + boot;
  };
  h.getUniqueId = [](ncclUniqueId* id) -> ncclResult_t {
    auto getId = GRADCOMM_REAL(ncclGetUniqueId);
    return getId ? fromReal("ncclGetUniqueId", getId(id)) : realMissing("ncclGetUniqueId");
  };
  h.initRank = [](ncclComm_t* real, int nranks, const ncclUniqueId& id, int rank, int device,
                  ncclConfig_t* config) -> ncclResult_t {
    auto init = GRADCOMM_REAL(ncclCommInitRankConfig);
    if (!init) return realMissing("ncclCommInitRank");
    // The real NCCL binds the communicator to the current device; this may
    // run on a thread of ncclGroupEnd, so the caller's device is made
    // current here and the thread's own restored after.
    int previous = -1;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device;
    if (device >= 0 && cudaSetDevice(device) != cudaSuccess) {
      cudaGetLastError();
      return fail(ncclUnhandledCudaError, "ncclCommInitRank: cudaSetDevice(" + std::to_string(device) + ") failed");
    }
    const ncclResult_t r = settleReal("ncclCommInitRank", fromReal("ncclCommInitRank", init(real, nranks, id, rank, config)), real);
    if (restore && previous >= 0) cudaSetDevice(previous);
    return r;
  };
  h.destroy = [](ncclComm_t real, bool abort) {
    // NCCL's destroy of a communicator in an error state returns that error
    // having freed nothing: such a one is aborted.
    auto destroy = GRADCOMM_REAL(ncclCommDestroy);
    auto state = GRADCOMM_REAL(ncclCommGetAsyncError);
    ncclResult_t async = ncclSuccess;
    if (!abort && destroy && state && state(real, &async) == ncclSuccess && async == ncclSuccess &&
        destroy(real) == ncclSuccess) {
      return;
    }
    if (auto f = GRADCOMM_REAL(ncclCommAbort)) f(real);
  };
  return h;
}

ncclResult_t settleReal(const char* function, ncclResult_t result, ncclComm_t* real) {
  if (result == ncclInProgress && *real) {
    auto poll = GRADCOMM_REAL(ncclCommGetAsyncError);
    if (!poll) {
      result = realMissing("ncclCommGetAsyncError");
    } else {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
      ncclResult_t state = ncclInProgress;
      while (poll(*real, &state) == ncclSuccess && state == ncclInProgress &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      result = state == ncclInProgress
                   ? fail(ncclSystemError, std::string(function) + ": the real NCCL's communicator was still forming "
                                                                   "after 10 minutes")
                   : fromReal(function, state);
    }
  }
  if (result != ncclSuccess && *real) {
    if (auto abort = GRADCOMM_REAL(ncclCommAbort)) abort(*real);
    *real = nullptr;
  }
  return result;
}

std::shared_ptr<const RealInitHooks> realInitHooks() {
  std::lock_guard<std::mutex> lock(hooksMu);
  return current();
}

RealInitHooks setRealInitHooks(RealInitHooks hooks) {
  std::lock_guard<std::mutex> lock(hooksMu);
  RealInitHooks previous = *current();
  current() = std::make_shared<const RealInitHooks>(std::move(hooks));
  return previous;
}

}  // namespace gradcomm::capi
