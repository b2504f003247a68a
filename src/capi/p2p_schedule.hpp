#pragma once
// ncclSend/ncclRecv on host memory: the transfers of one group on one
// communicator, run as one operation of its progress engine (so they never
// touch the transport concurrently with a collective).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace gradcomm::capi {

/// One send or receive. `message` numbers the transfers between this rank
/// and `peer` in each direction, in call order, so the k-th send from A to
/// B matches B's k-th receive from A (NCCL's ordering rule).
struct P2pTransfer {
  bool send = false;
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;
  uint32_t message = 0;
};

/// Posts every transfer at once (sends and receives of a group must not
/// wait for each other) and completes when all did. Transfers to this rank
/// itself are copied, the k-th send to self into the k-th receive from self.
algorithms::SchedulePtr makeP2pSchedule(std::vector<P2pTransfer> transfers, const algorithms::RunContext& ctx);

}  // namespace gradcomm::capi
