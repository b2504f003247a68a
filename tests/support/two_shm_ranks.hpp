#pragma once
// Two local ranks' views of one shared-memory segment, on memory of the
// test's own (no processes): for tests of ShmGroup's flags and rounds.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "transport/shm_group.hpp"

namespace gradcomm::testing {

struct TwoShmRanks {
  std::shared_ptr<char> memory;
  std::unique_ptr<transport::ShmGroup> rank0, rank1;
  explicit TwoShmRanks(size_t bufferBytes = 4096) {
    const size_t total = 2 * transport::ShmGroup::strideFor(bufferBytes);  // whole pages
    memory.reset(static_cast<char*>(std::aligned_alloc(4096, total)), std::free);
    std::memset(memory.get(), 0, total);  // as a fresh segment is
    rank0 = std::make_unique<transport::ShmGroup>(std::vector<int>{0, 1}, 0, bufferBytes, memory.get(), memory);
    rank1 = std::make_unique<transport::ShmGroup>(std::vector<int>{0, 1}, 1, bufferBytes, memory.get(), memory);
  }
};

}  // namespace gradcomm::testing
