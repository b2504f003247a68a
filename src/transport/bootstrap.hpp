#pragma once
// Collective exchanges used while a communicator is formed (configuration
// agreement, host discovery, shared-memory setup, transport addresses),
// before any transport exists: over a key-value Store or over MPI.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradcomm/store.hpp"

namespace gradcomm::transport {

/// The ranks of a communicator being formed. Every call is collective: all
/// ranks make the same calls in the same order.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Every rank's `mine`, in rank order.
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;
  /// Where the ranks meet, for error messages.
  virtual std::string describe() const = 0;
  /// Tells the other ranks, blocked in allgather(), that this rank failed;
  /// they throw an error carrying `reason`. Best effort, never blocks long.
  virtual void fail(const std::string& reason) { (void)reason; }
  void barrier() { (void)allgather(std::string()); }
};

/// Bootstrap over a Store, in O(1) requests per rank and round and O(size)
/// keys looked at by the store. Allgather round k: every rank sets
/// "bootstrap/k/RANK" and counts itself in at "bootstrap/k/count"; the rank
/// that completes the count sets "bootstrap/k/ready"; rank 0 waits for that
/// key, fetches every value in one batch (Store::multiGet) and publishes them
/// combined at "bootstrap/k/all", the one key every other rank waits for.
///
/// "bootstrap/k/all" is written once, by whoever first claims
/// "bootstrap/k/decided": rank 0 with the values (or with why it failed), or
/// a rank that called fail(). fail() marks its round and the next (no rank
/// can be beyond them without this rank's value), so every waiting rank
/// wakes up and stops with the reason instead of polling for it.
class StoreBootstrap : public Bootstrap {
 public:
  StoreBootstrap(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> allgather(const std::string& mine) override;
  std::string describe() const override { return store_->describe(); }
  void fail(const std::string& reason) override;
  Store& store() { return *store_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::string gatherAsRoot(const std::string& prefix);
  std::string awaitCombined(const std::string& prefix);
  std::string publish(const std::string& prefix, const std::string& combined);
  std::string missingRanks(const std::string& prefix);

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  int round_ = 0;  ///< the allgather in progress, or the next one
};

/// A key that is equal for two processes exactly when they can share memory:
/// hostname, kernel boot id and IPC namespace.
std::string hostKey();

/// Ranks whose host key equals this rank's (itself included, ascending),
/// from every rank's key in rank order.
std::vector<int> ranksWithKey(const std::vector<std::string>& keys, int rank);

}  // namespace gradcomm::transport

namespace gradcomm::transport {

class ShmGroup;

/// Maps a shared-memory segment among `localRanks` (this host's ranks,
/// ascending), with buffers of chunkBytes per local rank. Collective over
/// every rank of `boot` (ranks alone on their host take part too). Returns
/// null, with a warning, when the segment cannot be created or mapped on
/// some rank of this host; the name is unlinked once every local rank
/// mapped it.
std::unique_ptr<ShmGroup> setUpSharedMemory(Bootstrap& boot, const std::vector<int>& localRanks, size_t chunkBytes);

}  // namespace gradcomm::transport
