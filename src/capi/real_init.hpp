#pragma once
// What creating and destroying a communicator needs from CUDA and the real
// NCCL, behind one replaceable table: the defaults call the CUDA runtime and
// the real NCCL; tests replace them to drive device selection and
// real-NCCL failures where no GPU works.
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>

namespace gradcomm::capi {

/// The CUDA and real-NCCL calls of communicator creation.
struct RealInitHooks {
  /// "" when device buffers can occur in this process (a CUDA device works
  /// and a real NCCL was found), else why not.
  std::function<std::string()> unusable;
  /// The calling thread's current CUDA device (-1 when there is none).
  std::function<int()> currentDevice;
  /// ncclSuccess when `device` can be made current on the calling thread
  /// (checked on every rank before any enters the real NCCL's init, whose
  /// peers would otherwise wait for a rank that never comes); on failure
  /// the last error says why.
  std::function<ncclResult_t(int device)> selectDevice;
  /// The physical GPU that `device` is, named alike by every process that
  /// uses it and differently by any other GPU anywhere (its PCI bus id and
  /// the host's boot id); "" when unknown (then it matches no other).
  std::function<std::string(int device)> deviceIdentity;
  /// The real ncclGetUniqueId.
  std::function<ncclResult_t(ncclUniqueId* id)> getUniqueId;
  /// The real ncclCommInitRankConfig with `device` current on the calling
  /// thread for the call (config may be null), formed to the end also when
  /// non-blocking (settleReal); on failure the last error says why.
  std::function<ncclResult_t(ncclComm_t* real, int nranks, const ncclUniqueId& id, int rank, int device,
                             ncclConfig_t* config)>
      initRank;
  /// The real ncclCommAbort (abort) or ncclCommDestroy.
  std::function<void(ncclComm_t real, bool abort)> destroy;
};

/// The hooks in force (a snapshot: safe to use while tests replace them).
std::shared_ptr<const RealInitHooks> realInitHooks();
/// The hooks that call the CUDA runtime and the real NCCL.
RealInitHooks defaultRealInitHooks();
/// Replaces the hooks (for tests); returns the previous ones.
RealInitHooks setRealInitHooks(RealInitHooks hooks);

/// `result` of a real call that made `real` (init, split), once the real
/// communicator finished forming: a non-blocking one (config.blocking = 0,
/// NCCL_COMM_BLOCKING=0) answers ncclInProgress, and the shim, which forms
/// its communicators whole, polls the real ncclCommGetAsyncError until it
/// settles (at most 10 minutes; NCCL's bootstrap gives up sooner). On
/// failure the real communicator is aborted and `*real` reset.
ncclResult_t settleReal(const char* function, ncclResult_t result, ncclComm_t* real);

}  // namespace gradcomm::capi
