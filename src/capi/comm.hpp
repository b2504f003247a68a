#pragma once
// What an ncclComm_t handed out by gradcomm's NCCL-ABI library points to.
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gradcomm/communicator.hpp"
#include "gradcomm/store.hpp"

/// The communicator behind an ncclComm_t: a gradcomm Communicator for host
/// buffers and, where a GPU and the real NCCL work, the real NCCL's
/// communicator of the same ranks for device buffers.
struct ncclComm {
  static constexpr uint64_t kMagic = 0x6772616463636f6dULL;  // "gradccom"
  uint64_t magic = kMagic;  ///< zeroed on destruction: catches most stale handles
  int rank = 0;
  int nranks = 0;
  /// Empty until formed (comm_api.cpp): Communicator's default constructor
  /// is over MPI_COMM_WORLD, which this library never uses.
  gradcomm::Communicator host{nullptr};
  std::shared_ptr<gradcomm::Store> store;  ///< the job's store (for ncclCommSplit)
  std::string prefix;                      ///< this communicator's keys in it
  int splits = 0;                          ///< ncclCommSplit calls so far (same on every rank)
  ncclComm_t real = nullptr;               ///< the real NCCL's communicator, or null
  std::string realWhy;                     ///< why there is none
  int cudaDevice = -1;
  /// Sticky failure: once a host operation failed, every later call and
  /// ncclCommGetAsyncError report it (the gradcomm communicator is unusable).
  std::atomic<int> asyncError{ncclSuccess};
  std::mutex errorMu;
  std::string asyncMessage;

  void setFailed(ncclResult_t result, const std::string& message) {
    std::lock_guard<std::mutex> lock(errorMu);
    if (asyncError.load() == ncclSuccess) asyncMessage = message;
    asyncError.store(result);
  }

  /// Host calls that may block (see CommUse) and whether ncclCommAbort or
  /// ncclCommDestroy began: the communicator is freed only once `users`
  /// is 0, and no call enters after `closing` is set.
  std::mutex useMu;
  std::condition_variable useCv;
  int users = 0;
  bool closing = false;

  /// True when ncclCommAbort or ncclCommDestroy began.
  bool isClosing() {
    std::lock_guard<std::mutex> lock(useMu);
    return closing;
  }
};

namespace gradcomm::capi {

/// A host call using `comm` for its lifetime: ncclCommAbort from another
/// thread wakes the call (its waits fail) but frees the communicator only
/// after every CommUse ended. entered() is false when the communicator is
/// already being aborted or destroyed (the call must not touch it).
class CommUse {
 public:
  explicit CommUse(ncclComm_t comm) : comm_(comm) {
    std::lock_guard<std::mutex> lock(comm_->useMu);
    entered_ = !comm_->closing;
    if (entered_) ++comm_->users;
  }
  ~CommUse() {
    if (!entered_) return;
    std::lock_guard<std::mutex> lock(comm_->useMu);
    if (--comm_->users == 0) comm_->useCv.notify_all();
  }
  CommUse(const CommUse&) = delete;
  CommUse& operator=(const CommUse&) = delete;
  bool entered() const { return entered_; }

 private:
  ncclComm_t comm_;
  bool entered_ = false;
};

/// The error of a call that ncclCommAbort or ncclCommDestroy on another
/// thread interrupted (or that came after they began): ncclInternalError,
/// as NCCL returns from a blocking wait its abort flag ended.
ncclResult_t abortedCall(const char* function);

}  // namespace gradcomm::capi

namespace gradcomm::capi {

/// The contents of a gradcomm ncclUniqueId: where the job's store is served
/// and the job's key in it.
struct UniqueIdContents {
  std::string host;
  uint16_t port = 0;
  uint8_t key[16] = {};
  std::string keyHex() const;
};

void encodeUniqueId(const UniqueIdContents& contents, ncclUniqueId* id);
/// False (with the reason) when `id` is not one gradcomm made.
bool decodeUniqueId(const ncclUniqueId& id, UniqueIdContents* contents, std::string* why);

}  // namespace gradcomm::capi
