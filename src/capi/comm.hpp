#pragma once
// What an ncclComm_t handed out by gradcomm's NCCL-ABI library points to.
#include <nccl.h>

#include <atomic>
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
  gradcomm::Communicator host{std::shared_ptr<gradcomm::detail::CommunicatorImpl>()};
  std::shared_ptr<gradcomm::Store> store;  ///< the job's store (for ncclCommSplit)
  std::string prefix;                      ///< this communicator's keys in it
  int splits = 0;                          ///< ncclCommSplit calls so far (same on every rank)
  ncclComm_t real = nullptr;               ///< the real NCCL's communicator, or null
  std::string realWhy;                     ///< why there is none
  int cudaDevice = -1;
  /// Next point-to-point message number per peer, each direction.
  std::vector<uint32_t> sendNext, recvNext;
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
};

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
