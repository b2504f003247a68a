#include "transport/bootstrap.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "gradcomm/error.hpp"

namespace gradcomm::transport {
namespace {

constexpr const char* kAbortKey = "bootstrap/abort";

std::string secondsText(std::chrono::milliseconds d) {
  return std::to_string(d.count() / 1000) + "." + std::to_string(d.count() % 1000 / 100) + " s";
}

}  // namespace

StoreBootstrap::StoreBootstrap(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

void StoreBootstrap::throwIfAborted() {
  if (store_->check({kAbortKey})) {
    throw RemoteError("forming the communicator through " + store_->describe() + " failed: " +
                      store_->getString(kAbortKey, timeout_));
  }
}

void StoreBootstrap::fail(const std::string& reason) {
  try {
    if (!store_->check({kAbortKey})) store_->setString(kAbortKey, "rank " + std::to_string(rank_) + ": " + reason);
  } catch (const std::exception&) {
    // The store itself may be what failed; the others then time out.
  }
}

void StoreBootstrap::awaitKeys(const std::vector<std::string>& keys, const std::function<std::string()>& missing) {
  const auto start = std::chrono::steady_clock::now();
  auto sleep = std::chrono::microseconds(50);
  while (!store_->check(keys)) {
    throwIfAborted();
    if (std::chrono::steady_clock::now() - start >= timeout_) throw TimeoutError(missing());
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(5000));
  }
}

std::vector<std::string> StoreBootstrap::allgather(const std::string& mine) {
  const std::string prefix = "bootstrap/" + std::to_string(round_++) + "/";
  store_->setString(prefix + std::to_string(rank_), mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(prefix + std::to_string(r));
  awaitKeys(keys, [&] {
    std::string missing;
    int count = 0;
    for (int r = 0; r < size_; ++r) {
      if (store_->check({keys[static_cast<size_t>(r)]})) continue;
      if (++count <= 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (count > 16) missing += ", ... (" + std::to_string(count) + " in all)";
    return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": rank" + (count == 1 ? " " : "s ") +
           missing + " did not arrive at the rendezvous " + store_->describe() + " within " + secondsText(timeout_) +
           " (GRADCOMM_TIMEOUT): check that every process was started, that they agree on the world size (" +
           std::to_string(size_) + " here) and use the same rendezvous address";
  });
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(size_));
  for (const auto& k : keys) out.push_back(store_->getString(k, timeout_));
  return out;
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
