#pragma once
// Compressed allreduce schedules (see allreduce_compressed.cpp).
#include "algorithms/algorithm.hpp"
#include "compression/compression.hpp"

namespace gradcomm::algorithms {

/// The schedule of a compressed float32 sum/avg allreduce. `inner` is the
/// algorithm that moves the payload: an allreduce algorithm for fp16/bf16,
/// an allgather algorithm for top-k (see compressedInnerCall). `residual`
/// is the tensor's error feedback, or null.
SchedulePtr compressedAllreduce(const CollectiveCall& call, const RunContext& ctx, const compression::Spec& spec,
                                compression::Residual* residual, const Algorithm& inner);

/// The call the inner algorithm runs, for choosing that algorithm (buffers
/// are filled in by the schedule).
CollectiveCall compressedInnerCall(const CollectiveCall& call, const compression::Spec& spec);

}  // namespace gradcomm::algorithms
