#include "core/host_control.hpp"

#include <cstring>

namespace gradcomm::core {

using transport::CallSignature;

namespace {
constexpr size_t kWords = sizeof(CallSignature) / 8;
}  // namespace

void HostControl::announce(const CallSignature& call) {
  if (!g_) return;
  HostControlBlock& b = block(g_->localRank());
  uint64_t words[kWords];
  std::memcpy(words, &call, sizeof words);
  // Seqlock: readers that see the same sequence number before and after
  // copying the words got a consistent signature.
  b.announcedSeq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < kWords; ++i) b.announcedSignature[i].store(words[i], std::memory_order_relaxed);
  b.announcedSeq.store(call.seq + 1, std::memory_order_release);
}

bool HostControl::announced(int local, uint64_t seq, CallSignature* out) const {
  if (!g_) return false;
  const HostControlBlock& b = block(local);
  if (b.announcedSeq.load(std::memory_order_acquire) != seq + 1) return false;
  uint64_t words[kWords];
  for (size_t i = 0; i < kWords; ++i) words[i] = b.announcedSignature[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (b.announcedSeq.load(std::memory_order_relaxed) != seq + 1) return false;
  std::memcpy(out, words, sizeof words);
  return true;
}

bool HostControl::putCheck(int next, const CallSignature& call) {
  auto& slot = block(g_->localRank()).checkSlot[call.seq % HostControlBlock::kCheckSlots];
  // Free once `next` took what it holds (operations that skip the check
  // leave gaps in the sequence numbers, so compare with the slot itself).
  const uint64_t held = slot[0].load(std::memory_order_relaxed);
  if (held != 0 && block(next).checkTaken.load(std::memory_order_acquire) < held) return false;
  uint64_t words[kWords];
  std::memcpy(words, &call, sizeof words);
  for (size_t i = 1; i < kWords; ++i) slot[i].store(words[i], std::memory_order_relaxed);
  slot[0].store(call.seq + 1, std::memory_order_release);
  return true;
}

bool HostControl::takeCheck(int previous, uint64_t seq, CallSignature* out) {
  const auto& slot = block(previous).checkSlot[seq % HostControlBlock::kCheckSlots];
  if (slot[0].load(std::memory_order_acquire) != seq + 1) return false;
  // The slot stays as it is until checkTaken says we are done with it.
  uint64_t words[kWords];
  words[0] = seq;
  for (size_t i = 1; i < kWords; ++i) words[i] = slot[i].load(std::memory_order_relaxed);
  std::memcpy(out, words, sizeof words);
  block(g_->localRank()).checkTaken.store(seq + 1, std::memory_order_release);
  return true;
}

void HostControl::markFailed() {
  if (g_) block(g_->localRank()).failed.store(1, std::memory_order_release);
}

int HostControl::failedPeer() const {
  if (!g_) return -1;
  for (int q = 0; q < g_->localSize(); ++q) {
    if (q != g_->localRank() && block(q).failed.load(std::memory_order_acquire)) return g_->ranks()[static_cast<size_t>(q)];
  }
  return -1;
}

}  // namespace gradcomm::core
