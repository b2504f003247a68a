#include "transport/bootstrap.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::transport {
namespace {

// The first byte of a combined value ("all") or of "ready".
constexpr char kValues = 'A';   // followed by every rank's value (u32 length, bytes)
constexpr char kFailure = 'F';  // followed by an ErrorCode (u32) and the message
constexpr char kReady = 'R';

// Other ranks wait this much longer than rank 0, so that when some rank
// never arrives they hear rank 0's account of it instead of timing out blind.
constexpr std::chrono::milliseconds kMaxFollowerGrace{5000};

void putU32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t loadU32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(s[at + static_cast<size_t>(i)])} << (8 * i);
  return v;
}

std::string encodeFailure(ErrorCode code, const std::string& message) {
  std::string s(1, kFailure);
  putU32(s, static_cast<uint32_t>(code));
  return s + message;
}

std::string encodeValues(const std::vector<Store::Bytes>& values) {
  size_t total = 1;
  for (const auto& v : values) total += 4 + v.size();
  std::string s;
  s.reserve(total);
  s.push_back(kValues);
  for (const auto& v : values) {
    putU32(s, static_cast<uint32_t>(v.size()));
    s.append(v.begin(), v.end());
  }
  return s;
}

/// Every rank's value from a combined value, or the failure it carries.
std::vector<std::string> decodeCombined(const std::string& all, int size, const std::string& where) {
  if (!all.empty() && all[0] == kFailure && all.size() >= 5) {
    rethrowAs(static_cast<ErrorCode>(loadU32(all, 1)), all.substr(5));
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(size));
  size_t at = 1;
  bool ok = !all.empty() && all[0] == kValues;
  for (int r = 0; ok && r < size; ++r) {
    if (all.size() - at < 4) {
      ok = false;
      break;
    }
    const size_t n = loadU32(all, at);
    at += 4;
    if (all.size() - at < n) {
      ok = false;
      break;
    }
    out.push_back(all.substr(at, n));
    at += n;
  }
  if (!ok || at != all.size()) {
    throw InternalError("the combined rendezvous values in " + where + " are malformed (" +
                        std::to_string(all.size()) + " bytes): another program may use the same keys");
  }
  return out;
}

}  // namespace

StoreBootstrap::StoreBootstrap(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

void StoreBootstrap::fail(const std::string& reason) {
  const std::string failure = encodeFailure(ErrorCode::kRemote, "forming the communicator through " +
                                                                    store_->describe() + " failed: rank " +
                                                                    std::to_string(rank_) + ": " + reason);
  // Other ranks wait in this rank's current round, or, when this rank
  // failed while waiting in it, may have finished it and wait in the next.
  for (int k : {round_, round_ + 1}) {
    const std::string prefix = "bootstrap/" + std::to_string(k) + "/";
    try {
      // Wakes rank 0. "ready" cannot be set over this: the count of a round
      // this rank did not count itself in never completes.
      store_->setString(prefix + "ready", failure);
      if (store_->add(prefix + "decided", 1) == 1) store_->setString(prefix + "all", failure);
    } catch (const std::exception&) {
      // The store itself may be what failed; the others then time out.
    }
  }
}

std::vector<std::string> StoreBootstrap::allgather(const std::string& mine) {
  const std::string prefix = "bootstrap/" + std::to_string(round_) + "/";
  store_->setString(prefix + std::to_string(rank_), mine);
  if (store_->add(prefix + "count", 1) == size_) store_->setString(prefix + "ready", std::string(1, kReady));
  const std::string all = rank_ == 0 ? gatherAsRoot(prefix) : awaitCombined(prefix);
  std::vector<std::string> out = decodeCombined(all, size_, store_->describe());
  ++round_;
  return out;
}

std::string StoreBootstrap::gatherAsRoot(const std::string& prefix) {
  std::string combined;
  try {
    std::string ready;
    try {
      ready = store_->getString(prefix + "ready", timeout_);
    } catch (const TimeoutError&) {
      combined = encodeFailure(ErrorCode::kTimeout, missingRanks(prefix));
    }
    if (combined.empty()) {
      if (!ready.empty() && ready[0] == kFailure) {
        combined = ready;  // a rank that failed said why
      } else {
        std::vector<std::string> keys;
        keys.reserve(static_cast<size_t>(size_));
        for (int r = 0; r < size_; ++r) keys.push_back(prefix + std::to_string(r));
        combined = encodeValues(store_->multiGet(keys, timeout_));
      }
    }
  } catch (const Error& e) {
    combined = encodeFailure(e.code(), "rank 0 could not combine the values at the rendezvous " +
                                           store_->describe() + ": " + e.what());
  }
  return publish(prefix, combined);
}

std::string StoreBootstrap::publish(const std::string& prefix, const std::string& combined) {
  if (store_->add(prefix + "decided", 1) != 1) {
    // A rank that failed claimed the round first; it sets "all" right after.
    return store_->getString(prefix + "all", timeout_);
  }
  try {
    store_->setString(prefix + "all", combined);
    return combined;
  } catch (const Error& e) {
    // Too large for the store, most likely: the others must still hear why.
    const std::string failure = encodeFailure(e.code(), "rank 0 could not publish the combined values (" +
                                                            std::to_string(combined.size()) + " bytes) at " +
                                                            store_->describe() + ": " + e.what());
    store_->setString(prefix + "all", failure);
    return failure;
  }
}

std::string StoreBootstrap::awaitCombined(const std::string& prefix) {
  const auto wait = timeout_ + std::min(timeout_, kMaxFollowerGrace);
  try {
    return store_->getString(prefix + "all", wait);
  } catch (const TimeoutError&) {
    const bool rootArrived = store_->check({prefix + "0"});
    throw TimeoutError(
        "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
        (rootArrived ? "rank 0 did not publish the rendezvous values" : "rank 0 did not arrive at the rendezvous") +
        " " + store_->describe() + " within " + core::formatSeconds(wait) +
        " (GRADCOMM_TIMEOUT): check that every process was started, that they agree on the world size (" +
        std::to_string(size_) + " here) and use the same rendezvous address");
  }
}

std::string StoreBootstrap::missingRanks(const std::string& prefix) {
  // Only on the way to an error: one check per rank.
  std::string missing;
  int count = 0;
  for (int r = 0; r < size_; ++r) {
    if (store_->check({prefix + std::to_string(r)})) continue;
    if (++count <= 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (count > 16) missing += ", ... (" + std::to_string(count) + " in all)";
  const std::string tail = " at the rendezvous " + store_->describe() + " within " + core::formatSeconds(timeout_) +
                           " (GRADCOMM_TIMEOUT): check that every process was started, that they agree on the "
                           "world size (" + std::to_string(size_) + " here) and use the same rendezvous address";
  const std::string head = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": ";
  if (count == 0) return head + "every rank set its value but not every rank counted itself in" + tail;
  return head + "rank" + (count == 1 ? " " : "s ") + missing + " did not arrive" + tail;
}

std::string hostKey() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/ipc", ns, sizeof ns - 1);
  return std::string(name) + "|" + boot + "|" + (n > 0 ? std::string(ns, static_cast<size_t>(n)) : "");
}

std::vector<int> ranksWithKey(const std::vector<std::string>& keys, int rank) {
  std::vector<int> out;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (keys[r] == keys[static_cast<size_t>(rank)]) out.push_back(static_cast<int>(r));
  }
  return out;
}

}  // namespace gradcomm::transport
