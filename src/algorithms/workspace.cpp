#include "algorithms/workspace.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>

namespace gradcomm::algorithms {

std::shared_ptr<const CompiledPlan> CompiledPlan::compile(Plan plan) {
  auto c = std::make_shared<CompiledPlan>();
  c->plan = std::move(plan);
  const Plan& p = c->plan;
  const size_t n = p.steps.size();
  c->initialRemaining.assign(n, 0);
  c->succBegin.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = p.steps[i];
    c->initialRemaining[i] = s.depEnd - s.depBegin;
    for (uint32_t k = s.depBegin; k < s.depEnd; ++k) ++c->succBegin[p.deps[k] + 1];
  }
  for (size_t i = 0; i < n; ++i) c->succBegin[i + 1] += c->succBegin[i];
  c->succ.assign(p.deps.size(), 0);
  std::vector<uint32_t> fill(c->succBegin.begin(), c->succBegin.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = p.steps[i];
    for (uint32_t k = s.depBegin; k < s.depEnd; ++k) c->succ[fill[p.deps[k]]++] = static_cast<uint32_t>(i);
  }
  return c;
}

Workspace::~Workspace() {
  std::free(scratch_);
  for (char* b : buffers_) std::free(b);
  for (void* b : allBlocks_) ::operator delete(b, std::align_val_t(64));
}

void* Workspace::acquireBlock(size_t bytes) {
  if (bytes > kBlockBytes) return nullptr;
  if (freeBlocks_.empty()) {
    void* b = ::operator new(kBlockBytes, std::align_val_t(64));
    allBlocks_.push_back(b);
    return b;
  }
  void* b = freeBlocks_.back();
  freeBlocks_.pop_back();
  return b;
}

void Workspace::releaseBlock(void* block) { freeBlocks_.push_back(block); }

void Workspace::abandonMemory() {
  scratch_ = nullptr;
  scratchSize_ = 0;
  for (int i = 0; i < kBufferSlots; ++i) {
    buffers_[i] = nullptr;
    bufferSizes_[i] = 0;
  }
  for (auto& b : freeBuffers_) keepForever(std::move(b->staging));
}

void keepForever(std::vector<char> memory) {
  // Reachable from a global, so that leak checkers do not report it.
  static auto* kept = new std::vector<std::vector<char>>();
  static std::mutex mu;
  if (memory.empty()) return;
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(memory));
}

bool Workspace::ownsBlock(void* block) const {
  return std::find(allBlocks_.begin(), allBlocks_.end(), block) != allBlocks_.end();
}

namespace {
/// `memory` (of `size` bytes) grown to at least `bytes`, 64-byte aligned.
char* grow(char*& memory, size_t& size, size_t bytes) {
  if (bytes <= size) return memory;
  std::free(memory);
  memory = nullptr;
  size = 0;
  const size_t rounded = (bytes + 63) / 64 * 64;
  memory = static_cast<char*>(std::aligned_alloc(64, rounded));
  if (!memory) throw std::bad_alloc();
  size = rounded;
  return memory;
}
}  // namespace

char* Workspace::scratch(size_t bytes) { return grow(scratch_, scratchSize_, bytes); }

char* Workspace::buffer(int slot, size_t bytes) { return grow(buffers_[slot], bufferSizes_[slot], bytes); }

std::shared_ptr<const CompiledPlan> Workspace::findPlan(const PlanKey& key) const {
  auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second;
}

void Workspace::storePlan(const PlanKey& key, std::shared_ptr<const CompiledPlan> plan) {
  // A training loop uses a handful of signatures; start over if a sweep
  // fills the cache with sizes it will not see again.
  constexpr size_t kMaxPlans = 256;
  if (plans_.size() >= kMaxPlans) plans_.clear();
  plans_[key] = std::move(plan);
}

std::unique_ptr<RunnerBuffers> Workspace::takeBuffers() {
  if (freeBuffers_.empty()) return std::make_unique<RunnerBuffers>();
  auto b = std::move(freeBuffers_.back());
  freeBuffers_.pop_back();
  return b;
}

void Workspace::giveBack(std::unique_ptr<RunnerBuffers> b) {
  b->active.clear();  // drops (cancels) any request still held
  freeBuffers_.push_back(std::move(b));
}

}  // namespace gradcomm::algorithms
