#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "algorithms/plan.hpp"
#include "gradcomm/types.hpp"
#include "transport/transport.hpp"

namespace gradcomm::algorithms {

/// A Plan with what the executor derives from it once: successor lists and
/// the initial dependency counts. Immutable, so it is cached and shared.
struct CompiledPlan {
  Plan plan;
  std::vector<uint32_t> succBegin;  ///< CSR offsets, size steps + 1
  std::vector<uint32_t> succ;
  std::vector<uint32_t> initialRemaining;
  static std::shared_ptr<const CompiledPlan> compile(Plan plan);
};

/// Everything that determines a plan.
struct PlanKey {
  const void* algorithm = nullptr;
  uint8_t collective = 0, type = 0, op = 0, inPlace = 0;
  int root = 0, rank = 0, size = 0, depth = 0;
  size_t count = 0, segmentBytes = 0, exchangeSegmentBytes = 0;
  bool operator==(const PlanKey& o) const {
    return algorithm == o.algorithm && collective == o.collective && type == o.type && op == o.op &&
           inPlace == o.inPlace && root == o.root && rank == o.rank && size == o.size && depth == o.depth &&
           count == o.count && segmentBytes == o.segmentBytes &&
           exchangeSegmentBytes == o.exchangeSegmentBytes;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = reinterpret_cast<uintptr_t>(k.algorithm);
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ull; };
    mix(k.collective | (k.type << 8) | (k.op << 16) | (uint64_t{k.inPlace} << 24));
    mix(static_cast<uint64_t>(k.root) | (static_cast<uint64_t>(k.rank) << 32));
    mix(static_cast<uint64_t>(k.size) | (static_cast<uint64_t>(k.depth) << 32));
    mix(k.count);
    mix(k.segmentBytes);
    mix(k.exchangeSegmentBytes);
    return static_cast<size_t>(h);
  }
};

/// The executor's mutable state, pooled so that steady-state operations
/// allocate nothing.
struct RunnerBuffers {
  std::vector<uint32_t> remaining;
  std::vector<uint32_t> readyComm;
  std::vector<uint32_t> readyCompute;
  struct Active {
    uint32_t step;
    transport::RequestPtr request;
  };
  std::vector<Active> active;
  /// Signed messages: a slot per communication step (signature + data).
  std::vector<char> staging;
  std::vector<size_t> slotOf;
};

/// Keeps `memory` allocated until the process exits (transfers that could
/// not be cancelled may still write into it).
void keepForever(std::vector<char> memory);

/// Per-communicator memory reused across operations: scratch, compiled
/// plans and executor buffers. Used only by the thread that drives progress.
class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  /// At least `bytes` of 64-byte aligned memory, valid until the next call.
  char* scratch(size_t bytes);
  /// Like scratch(), one of kBufferSlots independent buffers (compression
  /// keeps its payloads here while the algorithm underneath uses scratch()).
  static constexpr int kBufferSlots = 2;
  char* buffer(int slot, size_t bytes);
  std::shared_ptr<const CompiledPlan> findPlan(const PlanKey& key) const;
  void storePlan(const PlanKey& key, std::shared_ptr<const CompiledPlan> plan);
  std::unique_ptr<RunnerBuffers> takeBuffers();
  void giveBack(std::unique_ptr<RunnerBuffers> b);

  /// Memory for one schedule object: a recycled block of kBlockBytes, or
  /// null when `bytes` does not fit one.
  static constexpr size_t kBlockBytes = 1024;
  void* acquireBlock(size_t bytes);
  void releaseBlock(void* block);
  bool ownsBlock(void* block) const;
  /// Forgets scratch() and buffer() memory, and the executors' staging of
  /// signed messages, without freeing it: transfers abandoned by a failed
  /// operation may still write into it.
  void abandonMemory();

 private:
  char* scratch_ = nullptr;
  size_t scratchSize_ = 0;
  char* buffers_[kBufferSlots] = {nullptr, nullptr};
  size_t bufferSizes_[kBufferSlots] = {0, 0};
  std::unordered_map<PlanKey, std::shared_ptr<const CompiledPlan>, PlanKeyHash> plans_;
  std::vector<std::unique_ptr<RunnerBuffers>> freeBuffers_;
  std::vector<void*> freeBlocks_;
  std::vector<void*> allBlocks_;
};

}  // namespace gradcomm::algorithms
